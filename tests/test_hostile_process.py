"""A hostile process as root sees it: every output stays valid UTF-8 JSON or escaped text.

The process names itself with ESC/OSC sequences, a newline, ``$(…)`` and a byte
that is not UTF-8, and carries such arguments plus a 100 KB one and a pool
URL (so the scan reports it).  ``watch --json``, ``record`` + ``replay
--json`` and ``scan`` in all three formats must write valid UTF-8, one JSON
object per line (one document for scan), with no control bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.commands import scan
from tests.support.cli import GPUGUARD, REPO, start_recorder

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

NAME = b"\x1b]0;pwn\x07\n$(id)\xff"  # 15 bytes: the whole of comm
ARGS = [
    b"\x1b]2;title\x07\x1b[2J",
    b"$(touch /tmp/gg-pwned-%d)" % os.getpid(),
    b"line\nbreak\r\x85",
    b"\xff\xfe\xc0\xaf",
    b"stratum+tcp://pool.example.com:3333",
    b"A" * 100_000,
]
SIGNATURE = "$(id)"


@contextlib.contextmanager
def hostile_process(tmp_path: Path) -> Iterator[subprocess.Popen]:
    exe = os.path.join(os.fsencode(tmp_path), NAME)
    shutil.copy(shutil.which("dash") or "/bin/sh", exe)
    # `dash -c SCRIPT ARG0 ARGS...`: dash stays alive (two commands), under its hostile name.
    proc = subprocess.Popen([exe, b"-c", b"sleep 30; :", *ARGS], start_new_session=True)
    try:
        time.sleep(0.3)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group: dash and its sleep
        proc.wait()


def assert_clean_json_lines(raw: bytes, what: str) -> list[dict]:
    text = raw.decode("utf-8", "strict")  # valid UTF-8, or this raises
    bad = sorted(
        {hex(b) for b in raw if b < 0x20 and b != 0x0A} | {hex(b) for b in raw if b == 0x7F}
    )
    assert not bad, f"{what}: raw control bytes {bad}"
    docs = [json.loads(line) for line in text.splitlines() if line]
    assert all(isinstance(d, dict) for d in docs), what
    return docs


def _ours(doc: dict) -> bool:
    return SIGNATURE in json.dumps(doc)


def test_watch_json_with_a_hostile_process(tmp_path):
    # Its output goes to a file, read back whole by path once it exits: a file never fills
    # (on a busy host `--all` fills a pipe within a second, and a watch blocked on its stdout
    # would lose the very exec this test looks for), and what is checked is every byte watch
    # wrote, whoever else in this process reads a descriptor number.
    output, errors = tmp_path / "watch.jsonl", tmp_path / "watch.err"
    with output.open("wb") as sink, errors.open("wb") as err_sink:
        watch = subprocess.Popen(
            [*GPUGUARD, "watch", "--json", "--all"], cwd=REPO, stdout=sink, stderr=err_sink
        )
    try:
        # Probes are attached once events flow: start processes until one is seen.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not output.stat().st_size and watch.poll() is None:
            subprocess.run(["/bin/true"])
            time.sleep(0.1)
        with hostile_process(tmp_path):
            time.sleep(1.5)
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=30)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
    assert watch.returncode == 0, errors.read_text(errors="replace")
    docs = assert_clean_json_lines(output.read_bytes(), "watch --json")
    execs = [d for d in docs if d["kind"] == "exec" and _ours(d)]
    assert execs, "the hostile exec was not reported"
    assert execs[0]["comm"] == "\x1b]0;pwn\x07\n$(id)\\xff"  # exact text, JSON-escaped once
    assert "\x1b]2;title\x07\x1b[2J" in execs[0]["cmdline"]


def test_record_and_replay_json_with_a_hostile_process(tmp_path):
    output = tmp_path / "r.ggr"
    recorder = start_recorder(output, "--gpu-interval", "0")
    try:
        with hostile_process(tmp_path):
            time.sleep(1.5)
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.communicate(timeout=30)
    assert recorder.returncode == 0
    replay = subprocess.run(
        [*GPUGUARD, "replay", "--json", str(output)], cwd=REPO, capture_output=True, timeout=60
    )
    assert replay.returncode == 0, replay.stderr
    docs = assert_clean_json_lines(replay.stdout, "replay --json")
    assert any(d["kind"] == "exec" and _ours(d) for d in docs)
    view = subprocess.run(
        [*GPUGUARD, "replay", "--all", str(output)], cwd=REPO, capture_output=True, timeout=60
    )
    assert view.returncode == 0 and b"\x1b" not in view.stdout and b"\x07" not in view.stdout
    view.stdout.decode("utf-8", "strict")


@pytest.mark.parametrize("fmt", scan.FORMATS)
def test_scan_with_a_hostile_process(tmp_path, fmt):
    with hostile_process(tmp_path) as proc:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuguard",
                "scan",
                "--no-yara",
                "--cpu-sample",
                "0",
                "--format",
                fmt,
            ],
            cwd=REPO,
            capture_output=True,
            timeout=120,
        )
    assert out.returncode in (0, 1), out.stderr
    assert b"Traceback" not in out.stderr
    if fmt == "table":
        text = out.stdout.decode("utf-8", "strict")
        assert not [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]
        assert "\\x1b]0;pwn\\x07\\n$(id)\\xff" in text  # shown escaped, on one line
        return
    doc = assert_clean_json_lines(out.stdout.replace(b"\n", b" ") + b"\n", f"scan --format {fmt}")[
        0
    ]
    ours = [f for f in doc["findings"] if str(proc.pid) in json.dumps(f)]
    assert ours, "the hostile process was not reported"
    assert SIGNATURE in json.dumps(ours[0])
    assert not os.path.exists(f"/tmp/gg-pwned-{os.getpid()}")
