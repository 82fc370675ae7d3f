"""The action registry: each action listed once, its settings, kinds, blocks and docs consistent."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.config.reference import doc_block, in_doc
from gpuguard.detect.ruleset.model import ACTIONS as RULE_ACTIONS
from gpuguard.events.action_kinds import BY_NAME as KINDS
from gpuguard.respond.action_docs import action_table, default_plan, generated, markers
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


# -- nothing but an action names it -----------------------------------------------------------

PACKAGE = Path(__file__).resolve().parent.parent / "gpuguard"
NAMES = set(STEPS) | set(BLOCK_KINDS)


def name_branches(source: str) -> list[tuple[int, str]]:
    """Where ``source`` compares with, looks up or lists an action's or block kind's name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare | ast.Set | ast.Subscript):
            found |= {
                (node.lineno, sub.value)
                for sub in ast.walk(node)
                if isinstance(sub, ast.Constant) and sub.value in NAMES
            }
    return sorted(found)


SPOKEN_FOR = sorted(
    p for sub in ("respond", "agent", "commands") for p in (PACKAGE / sub).rglob("*.py")
)


@pytest.mark.parametrize("path", SPOKEN_FOR, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_responder_the_agent_and_the_commands_never_branch_on_an_action_name(path):
    assert name_branches(path.read_text()) == []


def test_the_branch_check_catches_comparisons_sets_and_lookups():
    source = (
        'if outcome.action == "kill-on-touch":\n    pass\n'
        'steps &= {"alert"}\n'
        'x = counts["suspend"]\n'
        'y = block.kind in ("nftables", "other")\n'
        'z = "kill"  # a name alone is not a branch\n'
    )
    assert name_branches(source) == [
        (1, "kill-on-touch"),
        (3, "alert"),
        (4, "suspend"),
        (5, "nftables"),
    ]


# -- the generated docs ------------------------------------------------------------------------

RESPOND_DOC = PACKAGE.parent / "docs" / "respond.md"


def test_the_documented_actions_are_the_registrys():
    for name, text in generated().items():
        found = in_doc(RESPOND_DOC, markers(name))
        assert found is not None, f"{RESPOND_DOC}: the generated {name} block is missing"
        assert found == doc_block(text, markers(name), fence=""), (
            f"docs/respond.md's {name} differs from ACTIONS "
            "(fix: .venv/bin/python -m gpuguard config actions --update docs/respond.md)"
        )


def test_the_table_has_a_row_per_action_in_the_order_they_run_and_each_default():
    table = action_table()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| `")]
    assert rows == [f"`{step}`" for step in STEPS]
    assert all(action.what and action.undone_by for action in ACTIONS)
    assert ", ".join(STEPS) in table
    plan = default_plan()
    for verdict, steps in ResponseSettings().actions.items():
        assert f"`{verdict}` → {' + '.join(steps) or 'nothing'}" in plan


def test_config_actions_prints_the_blocks_and_updates_a_doc(tmp_path):
    printed = subprocess.run(
        [sys.executable, "-m", "gpuguard", "config", "actions"],
        capture_output=True,
        text=True,
        cwd=PACKAGE.parent,
        timeout=60,
    )
    assert printed.returncode == 0 and printed.stdout == "\n".join(generated().values())
    doc = tmp_path / "respond.md"
    stale = "\n\n".join(doc_block("stale text\n", markers(name), fence="") for name in generated())
    doc.write_text(f"# Response\n\n{stale}\n\nafter\n")
    update = [sys.executable, "-m", "gpuguard", "config", "actions", "--update", str(doc)]
    first = subprocess.run(update, capture_output=True, text=True, cwd=PACKAGE.parent, timeout=60)
    again = subprocess.run(update, capture_output=True, text=True, cwd=PACKAGE.parent, timeout=60)
    assert first.stdout.startswith("updated") and again.stdout.startswith("up to date")
    text = doc.read_text()
    assert "stale text" not in text and text.endswith("\n\nafter\n")
    assert all(
        in_doc(doc, markers(n)) == doc_block(t, markers(n), fence="")
        for n, t in generated().items()
    )
