"""The action registry: each action listed once, its settings, kinds, blocks and docs consistent."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuguard.config.reference import doc_block, in_doc, reference
from gpuguard.config.schema import Key
from gpuguard.detect.ruleset.model import ACTIONS as RULE_ACTIONS
from gpuguard.errors import GpuguardError
from gpuguard.events.action_kinds import BY_NAME as KINDS
from gpuguard.events.action_kinds import ActionKind
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import Responder
from gpuguard.respond.action_docs import action_table, default_plan, generated, markers
from gpuguard.respond.actions import ACTIONS, BLOCK_KINDS, STEPS, Action, alert
from gpuguard.respond.blocks import Block, BlockKind, BlockStore, new_block_id
from gpuguard.respond.lift import in_place
from gpuguard.respond.settings import ResponseSettings, parse_response_settings, settings_for
from tests.support.respond import SLEEPER, start_offender, state_of, stop_offender, verdict_for

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


def test_the_blocks_command_and_the_readme_name_every_block_kind():
    from gpuguard.commands.blocks import HELP

    readme = (PACKAGE.parent / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `gpuguard blocks")]
    listed = f"({', '.join(BLOCK_KINDS)})"
    assert listed in HELP and listed in row, (listed, row)


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


# -- a new action is its module and its registry entries ---------------------------------------
# An action defined here, as its own module would define it: options with their model, a block
# kind with its undo and check, and hooks that restore its blocks after a restart.  Its
# "block" is a file naming the offender (nothing in the kernel), so the test runs anywhere.


@dataclass(frozen=True, slots=True)
class TagSettings:
    tag_ttl_s: float = 60.0
    tag_dir: str = ""


class Tags:
    """What the tag action keeps for a responder's life (as kill-on-touch keeps its program)."""

    def __init__(self, ctx) -> None:
        self.restored: list[str] = []
        self.forgotten: list[str] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _tag_file(block: Block) -> Path:
    return Path(block.detail["dir"]) / block.id


def _run_tag(ctx, verdict, state, base):
    if ctx.dry_run:
        return ActionOutcome(action=ctx.name, status="dry-run", reason="would tag", **base)
    with ctx.open_offender(verdict, state) as handle:  # the pidfd of exactly that process
        os.fstat(handle.pidfd)
    now = time.time()
    ttl = ctx.options.tag_ttl_s
    block = Block(new_block_id(TAG_BLOCK), TAG_BLOCK.name, now, now + ttl, "tagged", verdict.pid)
    block.detail["dir"] = ctx.options.tag_dir
    _tag_file(block).write_text(str(verdict.pid))
    ctx.part(Tags)
    return ctx.placed(block, f"tagged for {ttl:g} s", base)


def _restore_tags(ctx, live):
    ctx.part(Tags).restored += [b.id for b in live if _tag_file(b).exists()]


def _still_tagged(ctx, live, now):
    return [
        ActionOutcome(
            time=now, action=ctx.name, status="done", reason="still tagged", block_id=b.id
        )
        for b in live
    ]


def _forget_tag(ctx, block):
    ctx.loaded(Tags).forgotten.append(block.id)


TAG_BLOCK = BlockKind(
    "tag",
    "g",
    lambda block, root, others: _tag_file(block).unlink() or "untagged",
    lambda block, root: "tagged" if _tag_file(block).exists() else "tag missing",
)
TAG = Action(
    ActionKind("tag"),
    _run_tag,
    section="tag",
    options=(
        Key("ttl_s", "number", "tags expire after this long", field="tag_ttl_s", low=0),
        Key("dir", "text", "where tags are written", field="tag_dir"),
    ),
    settings=TagSettings,
    default_on=("malicious",),
    blocks=(TAG_BLOCK,),
    start=_restore_tags,
    sweep=_still_tagged,
    lifted=_forget_tag,
    what="a file names the offender",
    undone_by="`tag.ttl_s`, `unblock`",
)
REGISTRY = (alert.ACTION, TAG)


def test_a_new_action_with_options_and_blocks_that_survive_a_restart_needs_nothing_else(tmp_path):
    section = {
        "tag": {"ttl_s": 30, "dir": str(tmp_path)},
        "state_dir": str(tmp_path / "blocks"),
        "pin_root": str(tmp_path / "pins"),
    }
    settings = parse_response_settings(section, source="agent.yaml", actions=REGISTRY)
    assert (settings.tag_ttl_s, settings.tag_dir) == (30.0, str(tmp_path))
    assert settings.actions["malicious"] == ("tag",)  # its default_on
    assert parse_response_settings({}, source="a", actions=REGISTRY).tag_ttl_s == 60.0
    with pytest.raises(GpuguardError) as bad:
        parse_response_settings({"tag": {"ttl": 1}}, source="agent.yaml", actions=REGISTRY)
    assert "unknown key 'ttl'" in bad.value.cause
    with pytest.raises(GpuguardError) as other:  # the registry decides what may be named
        parse_response_settings({"actions": {"malicious": "kill"}}, source="a", actions=REGISTRY)
    assert "unknown action 'kill'" in other.value.cause
    schema = settings_for(REGISTRY)[1]
    assert "tag:" in reference(schema) and "ttl_s: 60.0" in reference(schema)
    assert "| `tag` | a file names the offender |" in action_table(REGISTRY)

    proc = start_offender(SLEEPER)
    try:
        state = state_of(proc.pid)
        verdict = verdict_for(state)
        watching = Responder(settings, mode="monitor", actions=REGISTRY)
        (alerted,) = watching.respond(verdict, state, time.time())
        assert alerted.reason.endswith("enforce mode would: tag")
        first = Responder(settings, mode="enforce", actions=REGISTRY)
        outcomes = first.respond(verdict, state, time.time())
        assert [(o.action, o.status) for o in outcomes] == [("alert", "done"), ("tag", "done")]
        (block,) = BlockStore(settings.state_dir).load()
        assert block.id == outcomes[1].block_id and block.pid == proc.pid
        assert _tag_file(block).read_text() == str(proc.pid)
        assert in_place(block, Path(settings.pin_root), first.kinds) == "tagged"
        tags = first.parts.loaded(Tags)
        first.close()
        assert tags.closed
        # A restart: the new responder hands the action its live block.
        second = Responder(settings, mode="enforce", actions=REGISTRY)
        assert second.parts.loaded(Tags).restored == [block.id]
        (swept,) = second.sweep(time.time())
        assert (swept.action, swept.reason, swept.block_id) == ("tag", "still tagged", block.id)
        (lifted,) = second.sweep(time.time() + 31)
        assert (lifted.action, lifted.status, lifted.reason) == (
            "unblock",
            "done",
            "expired: untagged",
        )
        assert not _tag_file(block).exists() and BlockStore(settings.state_dir).load() == []
        assert second.parts.loaded(Tags).forgotten == [block.id]
        second.close()
    finally:
        stop_offender(proc)
