"""`gpuguard blocks` / `gpuguard unblock` round-trip on real blocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.cli import main
from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from tests.support.respond import (
    ask,
    cleanup,
    process_state_letter,
    settings_for_test,
    start_offender,
    start_probe,
    state_of,
    stop_offender,
    verdict_for,
)
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


def test_blocks_and_unblock_round_trip(capsys):
    settings = settings_for_test(actions={"malicious": ("quarantine", "suspend")})
    target = start_probe(real_majors=True)
    where = ["--pin-root", settings.pin_root, "--state-dir", settings.state_dir]
    try:
        responder = Responder(settings, mode="enforce")
        state = state_of(target.pid)
        done = responder.respond(verdict_for(state, comm="x\x1b[2Jminer"), state, time.time())
        ids = {o.action: o.block_id for o in done if o.block_id}
        assert set(ids) == {"quarantine", "suspend"}
        responder.close()

        assert main(["blocks", *where]) == 0
        table = capsys.readouterr().out
        assert ids["quarantine"] in table and ids["suspend"] in table
        assert (
            "attached" in table
            and "stopped" in table
            and "\x1b" not in table
            and "x\\x1b[2Jminer" in table
        )
        assert main(["blocks", "--json", *where]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {b["id"] for b in listed} == set(ids.values())

        assert main(["unblock", ids["suspend"], *where]) == 0
        assert ids["suspend"] in capsys.readouterr().out
        time.sleep(0.2)
        assert process_state_letter(target.pid) != "T"
        assert ask(target, "/dev/nvidia0") == "EPERM"  # the quarantine is still there
        assert main(["unblock", "--all", *where]) == 0
        capsys.readouterr()
        assert ask(target, "/dev/nvidia0") == "ENXIO"
        assert BlockStore(settings.state_dir).load() == []
        assert main(["blocks", *where]) == 0 and "no blocks in place" in capsys.readouterr().out
        assert main(["unblock", "q-00000000", *where]) == 2
        assert "no block" in capsys.readouterr().err
    finally:
        target.kill()
        target.wait()
        cleanup(settings)


@pytest.fixture
def netns():
    name = f"gg-test-cli-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False)


def _nft_tables(netns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "tables"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_unblock_all_removes_the_nft_table_and_every_pin(netns, tmp_path, capsys):
    settings = settings_for_test(
        actions={"malicious": ("kill-on-touch", "quarantine", "block-egress")},
        nftables=True,
        nftables_netns=netns,
    )
    where = ["--pin-root", settings.pin_root, "--state-dir", settings.state_dir]
    # Another table in the same namespace, not gpuguard's: it must survive.
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "add", "table", "inet", "othertable"], check=True
    )
    miner = tmp_path / "xminer"
    shutil.copy(build_workload(), miner)
    offender = subprocess.Popen(
        [str(miner), "ready", "sleep:60000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert offender.stdout.readline() == b"ready\n"
        responder = Responder(settings, mode="enforce")
        state = state_of(offender.pid, connections=(("198.51.100.9", 3333),))
        done = responder.respond(verdict_for(state), state, time.time())
        assert {o.action: o.status for o in done if o.action != "alert"} == {
            "kill-on-touch": "done",
            "quarantine": "done",
            "block-egress": "done",
        }, [o.reason for o in done]
        kinds = {b.kind for b in BlockStore(settings.state_dir).load()}
        assert kinds == {"kill-on-touch", "quarantine", "block-egress", "nftables"}
        assert "inet gpuguard" in _nft_tables(netns)
        maps = sorted(p.name for p in Path(settings.pin_root, "maps").iterdir())
        assert "touch_paths" in maps and "pool_addresses" in maps

        # While a responder (here: this process) holds the maps, their pins stay.
        assert main(["unblock", "--all", *where]) == 0
        said = capsys.readouterr().out
        assert f"kept {len(maps)} pinned map(s): held by pid {os.getpid()}" in said, said
        assert "table inet gpuguard" in said
        assert sorted(p.name for p in Path(settings.pin_root, "maps").iterdir()) == maps
        responder.close()

        assert main(["unblock", "--all", *where]) == 0
        said = capsys.readouterr().out
        assert f"removed {len(maps)} pinned map(s)" in said, said
        tables = _nft_tables(netns)
        assert "inet gpuguard" not in tables and "inet othertable" in tables
        assert not Path(settings.pin_root).exists()
        assert BlockStore(settings.state_dir).load() == []
        assert offender.poll() is None  # lifting kills nothing
    finally:
        offender.kill()
        offender.wait()
        cleanup(settings)


def test_lifting_the_last_nft_block_by_id_removes_the_table(netns, tmp_path, capsys):
    settings = settings_for_test(
        actions={"malicious": ("block-egress",)}, nftables=True, nftables_netns=netns
    )
    where = ["--pin-root", settings.pin_root, "--state-dir", settings.state_dir]
    offender = start_offender()
    try:
        responder = Responder(settings, mode="enforce")
        for n in (1, 2):
            state = state_of(offender.pid, connections=((f"198.51.100.{n}", 3333),))
            responder.respond(verdict_for(state), state, time.time())
        responder.close()
        nft_ids = [b.id for b in BlockStore(settings.state_dir).load() if b.kind == "nftables"]
        assert len(nft_ids) == 2
        assert main(["unblock", nft_ids[0], *where]) == 0
        assert "inet gpuguard" in _nft_tables(netns)  # the other block still uses it
        assert main(["unblock", nft_ids[1], *where]) == 0
        assert "table inet gpuguard" in capsys.readouterr().out
        assert "inet gpuguard" not in _nft_tables(netns)
    finally:
        stop_offender(offender)
        cleanup(settings)
