"""A scan that reads sessions and scores some processes again still reports every process.

scan scores every process once, reads tcp_info for the processes that scored anything and
have connections, and scores those again.  The second pass returns only what it rescored:
the report must keep the first verdicts of every other process.  (Seen on a busy host: a
JVM talking to PostgreSQL was rescored and the miner beside it vanished from the report.)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scan import findings_for_pid, scan_json

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


def _start(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("ready"), argv
    return proc


def test_processes_not_rescored_keep_their_verdicts(tmp_path: Path):
    work = tmp_path / "run"  # under /tmp: both executables run from a temporary directory
    work.mkdir()
    shell = work / "worker"
    shutil.copy2(shutil.which("dash") or "/bin/sh", shell)
    interpreter = work / "python3"
    shutil.copy2(os.path.realpath(sys.executable), interpreter)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    procs = []
    try:
        # No connection: scored once.  A stratum URL in its command line.
        procs.append(
            _start(
                [
                    str(shell),
                    "-c",
                    "echo ready; sleep 300; :",
                    "x",
                    "-o",
                    "stratum+tcp://192.0.2.7:3333",
                ]
            )
        )
        # An established connection and a score (runs from /tmp): its session is read and it
        # is scored again.
        procs.append(
            _start(
                [
                    str(interpreter),
                    "-c",
                    "import socket,time\n"
                    f"s = socket.create_connection(('127.0.0.1', {port}))\n"
                    "s.sendall(b'hello')\nprint('ready', flush=True)\ntime.sleep(300)\n",
                ]
            )
        )
        peer, _ = listener.accept()
        try:
            code, doc, err = scan_json("--no-yara", "--cpu-sample", "0", "--gpu-window", "0")
        finally:
            peer.close()
        assert code == 1, err  # the stratum worker is suspicious (at least)
        connected = findings_for_pid(doc, procs[1].pid)
        assert connected and connected[0]["gpuguard"]["score"] > 0
        miner = findings_for_pid(doc, procs[0].pid)
        assert miner, "the process that was not rescored is missing from the report"
        assert "miner-cmdline-stratum" in miner[0]["gpuguard"]["rule_ids"]
        assert miner[0]["gpuguard"]["verdict"] in ("suspicious", "malicious")
    finally:
        listener.close()
        for proc in procs:
            proc.kill()
            proc.wait()
