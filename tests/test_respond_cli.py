"""`gpuguard blocks` / `gpuguard unblock` round-trip on real blocks."""

from __future__ import annotations

import json
import time

import pytest

from gpuguard.cli import main
from gpuguard.respond import Responder
from gpuguard.respond.blocks import BlockStore
from tests.support.respond import (
    ask,
    cleanup,
    process_state_letter,
    settings_for_test,
    start_probe,
    state_of,
    verdict_for,
)

pytestmark = pytest.mark.root


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
