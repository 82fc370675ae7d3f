"""nftables sets in a private network namespace, firewall hooks, and hostile names passing through both inert."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.outputs.finding_document import finding_document
from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.hooks import CLEAN_ENV
from gpuguard.respond.lift import lift_all
from gpuguard.respond.nft import NftSets
from gpuguard.respond.settings import HookSettings
from tests.support.respond import cleanup, settings_for_test, state_of, verdict_for

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

HOSTILE_NAMES = [
    "$(touch /tmp/gg-pwned-{pid})",
    "x; touch /tmp/gg-pwned-{pid}",
    "a\nFAKE LOG LINE",
    "\x1b]0;owned\x07\x1b[2J",
    "`touch /tmp/gg-pwned-{pid}`",
    "/" + "A" * 254,
]


@pytest.fixture
def netns():
    name = f"gg-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "up"
    yield proc
    proc.kill()
    proc.wait()


def _ruleset(netns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_nftables_sets_and_rules_appear_and_disappear_in_a_private_netns(netns, sleeper):
    settings = settings_for_test(
        actions={"malicious": ("block-egress",)}, nftables=True, nftables_netns=netns
    )
    try:
        responder = Responder(settings, mode="enforce")
        state = state_of(sleeper.pid, connections=(("198.51.100.9", 3333), ("2001:db8::9", 3333)))
        outcome = responder.respond(verdict_for(state), state, time.time())[-1]
        assert outcome.status == "done" and "table inet gpuguard" in outcome.reason, outcome.reason
        ruleset = _ruleset(netns)
        for text in (
            "table inet gpuguard",
            "set pool4",
            "set pool6",
            "198.51.100.9",
            "2001:db8::9",
            "hook output",
            "hook forward",
            "ip daddr @pool4",
            "ip6 daddr @pool6",
            "drop",
        ):
            assert text in ruleset, text
        # Idempotent: a second verdict does not duplicate rules.
        responder.respond(verdict_for(state), state, time.time())
        assert _ruleset(netns).count("ip daddr @pool4") == 2  # one in output, one in forward
        nft = NftSets(netns)
        assert nft.elements()["pool4"] == ["198.51.100.9"]
        lift_all(BlockStore(settings.state_dir), Path(settings.pin_root), {netns})
        assert "gpuguard" not in _ruleset(netns)
        responder.close()
    finally:
        cleanup(settings)
    # The host's own ruleset never had our table.
    host = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "inet gpuguard" not in host


def test_hostile_strings_stay_inert_in_nftables_and_hooks(netns, sleeper, tmp_path):
    pid = os.getpid()
    received = tmp_path / "received.jsonl"
    hook_script = tmp_path / "hook.py"
    hook_script.write_text(
        "import json, os, sys\n"
        f"doc = json.load(sys.stdin)\n"
        f"with open({str(received)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'doc': doc, 'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n"
        "print('ticket 42 opened')\n"
    )
    hook = HookSettings(
        name="ticket",
        argv=(sys.executable, str(hook_script), "--fixed"),
        on=("malicious",),
        timeout_s=10,
    )
    settings = settings_for_test(
        actions={"malicious": ("block-egress",)}, nftables=True, nftables_netns=netns, hooks=(hook,)
    )
    outcomes = []
    try:
        responder = Responder(settings, mode="enforce", emit=outcomes.append)
        for n, name in enumerate(HOSTILE_NAMES):
            name = name.format(pid=pid)
            state = state_of(sleeper.pid, connections=((f"198.51.100.{n + 1}", 3333), (name, 3333)))
            state.comm, state.exe, state.cmdline = name[:15], name, [name, "--url", name]
            state.facts.comm, state.facts.exe, state.facts.cmdline = name[:15], name, [name]
            verdict = verdict_for(state, comm=name)
            verdict.exe = name
            outcome = next(
                o
                for o in responder.respond(
                    verdict,
                    state,
                    time.time(),
                    finding_document(finding_from_verdict(verdict, state.facts, state=state)),
                )
                if o.action == "block-egress"
            )
            assert outcome.status == "done", outcome.reason
            # The hostile "address" was dropped; the block (one per cgroup) gathers the valid ones.
            assert outcome.detail["addresses"] == [f"198.51.100.{i + 1}" for i in range(n + 1)]
        responder.wait()
        lines = [json.loads(line) for line in received.read_text().splitlines()]
        assert len(lines) == len(HOSTILE_NAMES)
        by_name = {line["doc"]["verdict"]["comm"]: line for line in lines}  # hooks run concurrently
        for name in HOSTILE_NAMES:
            name = name.format(pid=pid)
            line = by_name[name]
            assert line["argv"] == ["--fixed"]  # nothing from the offender in argv
            assert line["doc"]["verdict"]["comm"] == name  # the name arrives intact, as JSON data
            assert line["doc"]["process"]["exe"] == name
            assert line["doc"]["finding"]["process"]["executable"] == name  # the log's finding
            assert set(line["env"]) <= set(CLEAN_ENV) | {"PWD", "LC_CTYPE"}
        hooks = [o for o in outcomes if o.action == "hook"]
        assert len(hooks) == len(HOSTILE_NAMES) and all(o.status == "done" for o in hooks)
        assert hooks[0].detail["stdout"] == "ticket 42 opened\\n"
        assert not list(Path("/tmp").glob(f"gg-pwned-{pid}*"))
        ruleset = _ruleset(netns)
        assert "pwned" not in ruleset and "FAKE" not in ruleset
        assert sorted(NftSets(netns).elements()["pool4"]) == sorted(
            f"198.51.100.{n + 1}" for n in range(len(HOSTILE_NAMES))
        )
        responder.close()
    finally:
        cleanup(settings)


def test_hook_timeout_and_failure_are_outcomes(sleeper, tmp_path):
    slow = HookSettings(name="slow", argv=("/bin/sleep", "5"), timeout_s=0.3)
    broken = HookSettings(name="broken", argv=("/nonexistent/hook",))
    settings = settings_for_test(actions={"malicious": ("alert",)}, hooks=(slow, broken))
    outcomes = []
    try:
        responder = Responder(settings, mode="enforce", emit=outcomes.append)
        state = state_of(sleeper.pid)
        responder.respond(verdict_for(state), state, time.time())
        responder.wait()
        by_hook = {o.detail["hook"]: o for o in outcomes if o.action == "hook"}
        assert by_hook["slow"].status == "failed" and "timed out" in by_hook["slow"].reason
        assert by_hook["broken"].status == "failed" and "cannot run" in by_hook["broken"].reason
        dry = Responder(replace(settings, hooks=(slow,)), mode="enforce", dry_run=True)
        (described,) = [
            o for o in dry.respond(verdict_for(state), state, time.time()) if o.action == "hook"
        ]
        assert described.status == "dry-run" and described.detail["argv"] == ["/bin/sleep", "5"]
    finally:
        cleanup(settings)
