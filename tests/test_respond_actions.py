"""The action registry: each action listed once, its settings, kinds and blocks consistent."""

from __future__ import annotations

import dataclasses

from gpuguard.detect.ruleset.model import ACTIONS as RULE_ACTIONS
from gpuguard.events.action_kinds import BY_NAME as KINDS
from gpuguard.respond.actions import ACTIONS, BLOCK_KINDS, STEPS
from gpuguard.respond.settings import ResponseSettings, parse_response_settings

SAMPLE = {
    "number": 7.0,
    "count": 5,
    "text": "x",
    "flag": False,
    "texts": ["/a/"],
    "networks": ["10.0.0.0/8"],
}


def test_each_action_is_listed_once_with_its_shared_kind():
    assert len(set(STEPS)) == len(STEPS) == len(ACTIONS)
    for action in ACTIONS:
        assert KINDS[action.name] is action.kind
        assert (action.run is None) == (action.name == "alert")


def test_a_rules_file_names_only_actions_the_responder_runs():
    assert RULE_ACTIONS[0] == "none" and set(RULE_ACTIONS[1:]) <= set(STEPS)


def test_block_kinds_and_their_id_prefixes_are_unique():
    kinds = [k for action in ACTIONS for k in action.blocks]
    assert len({k.name for k in kinds}) == len({k.prefix for k in kinds}) == len(BLOCK_KINDS)


def test_each_option_fills_its_field_and_defaults_come_from_the_field():
    fields = {f.name for f in dataclasses.fields(ResponseSettings)}
    for action in ACTIONS:
        for option in action.options:
            assert option.field in fields
            value = option.choices[-1] if option.type == "choice" else SAMPLE[option.type]
            parsed = parse_response_settings(
                {action.section: {option.key: value}}, source="agent.yaml"
            )
            got = getattr(parsed, option.field)
            want = tuple(value) if isinstance(value, list) else value
            assert got == want and got != getattr(ResponseSettings(), option.field)
    assert parse_response_settings({}, source="agent.yaml") == ResponseSettings()
