"""Hostile and careless use of the sensor commands: bad options, special files, a full disk, signals.

Each case is one of issue 10's findings; each test fails on the code before it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot
from gpuguard.events.wire_write import RecordingWriter
from tests.support.cli import GPUGUARD, REPO, gpuguard, start_recorder

T0 = 1_750_000_000.0


@pytest.mark.parametrize(
    "argv",
    [
        ["watch", "--duration", "-5"],
        ["watch", "--duration", "nan"],
        ["watch", "--duration", "inf"],
        ["watch", "--duration", "0"],
        ["watch", "--interval", "0"],
        ["watch", "--interval", "lots"],
        ["record", "-o", "/tmp/never.ggr", "--gpu-interval", "-1"],
        ["record", "-o", "/tmp/never.ggr", "--duration", "nan"],
        ["record", "-o", "/tmp/never.ggr", "--interval", "-0.5"],
        ["gpus", "--watch", "-1"],
        ["gpus", "--watch", "0"],
        ["gpus", "--watch", "1e400"],
    ],
)
def test_bad_numeric_options_are_one_line_and_exit_2(argv):
    out = gpuguard(*argv, timeout=20)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("gpuguard: --"), out.stderr
    assert "fix:" in out.stderr and "Traceback" not in out.stderr
    assert not Path("/tmp/never.ggr").exists()


def test_zero_gpu_interval_still_means_no_sampling():
    from gpuguard.cli import build_parser

    args = build_parser().parse_args(
        ["record", "-o", "x", "--gpu-interval", "0", "--duration", "2.5"]
    )
    assert (args.gpu_interval, args.duration) == (0.0, 2.5)


def _recording(path: Path) -> Path:
    with RecordingWriter(path) as writer:
        writer.write(
            GpuSnapshot(
                time=T0,
                source="nvml",
                devices=[DeviceSample(vendor="nvidia", index=0, name="H100", gpu_util=97.0)],
            )
        )
    return path


def test_gpus_replay_reads_a_pipe(tmp_path):
    data = _recording(tmp_path / "r.ggr").read_bytes()
    out = subprocess.run(
        [*GPUGUARD, "gpus", "--replay", "/dev/stdin", "--json"],
        cwd=REPO,
        input=data,
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["devices"][0]["gpu_util"] == 97.0


def test_gpus_replay_reads_a_fifo(tmp_path):
    data = _recording(tmp_path / "r.ggr").read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    out = gpuguard("gpus", "--replay", str(fifo), "--json", timeout=30)
    writer.join(5)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["devices"][0]["name"] == "H100"


def test_recording_to_special_files_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, what in ((fifo, "is a FIFO"), (Path("/dev/null"), "is a character device")):
        with pytest.raises(Exception) as info:
            RecordingWriter(target, overwrite=True)
        assert what in str(info.value) and "regular file" in str(info.value)


@pytest.mark.root
@pytest.mark.self_contained
@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_record_to_a_special_file_is_one_line(tmp_path, target):
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    out = gpuguard("record", "--output", target, "--force", "--duration", "1", timeout=30)
    assert out.returncode == 2, out.stderr
    assert (
        out.stderr.count("\n") == 1
        and "regular file" in out.stderr
        and "Traceback" not in out.stderr
    )


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", f"gg-test-{os.getpid()}", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _exec_flood(stop: threading.Event, flowing: threading.Event | None = None) -> None:
    # ``flowing`` (when given) pauses the flood while it is clear.
    while not stop.is_set():
        if flowing is not None and not flowing.wait(0.1):
            continue
        subprocess.run(["/bin/true"], check=False)


@pytest.mark.root
@pytest.mark.self_contained
def test_record_on_a_disk_that_fills_reports_it_in_one_line(small_disk):
    output = small_disk / "rec.ggr"
    stop = threading.Event()
    flood = threading.Thread(target=_exec_flood, args=(stop,), daemon=True)
    flood.start()
    try:
        out = gpuguard(
            "record",
            "--output",
            str(output),
            "--duration",
            "20",
            "--gpu-interval",
            "0.01",
            timeout=60,
        )
    finally:
        stop.set()
        flood.join(10)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if "No space left on device" in line]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "items (" in errors[0] and "bytes) were written" in errors[0]
    assert "gpuguard: events:" in out.stderr  # the summary is not lost
    replay = gpuguard("replay", "--json", str(output), timeout=30)
    assert (
        replay.returncode == 2 and replay.stdout.count("\n") >= 1
    )  # the prefix replays, then one line says why
    assert "Traceback" not in replay.stderr


def _connect_flood(stop: threading.Event, flowing: threading.Event | None = None) -> None:
    # Refused connects on loopback: one connect event each, as fast as Python goes.
    while not stop.is_set():
        if flowing is not None and not flowing.wait(0.1):
            continue
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", 9))
        except OSError:
            pass
        finally:
            s.close()


# The issue-10 target (the summary and the exit within 1 s of the signal) is measured on a quiet
# host by benchmarks/bench_stop.py.  Here the bound must hold on a host at load 10, and still fail
# for a stop that waits for the flood: the flood never ends while the command runs.
EXIT_WITHIN_S = 5.0


def _stderr_lines(proc: subprocess.Popen) -> list[tuple[float, str]]:
    """Collect (arrival time, line) of the process's stderr in a thread."""
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for raw in proc.stderr:
            lines.append(
                (time.monotonic(), raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
            )

    threading.Thread(target=read, daemon=True).start()
    return lines


def _where_it_waits(proc: subprocess.Popen, lines: list[tuple[float, str]]) -> str:
    """Why a command has not exited: each thread's kernel state and stack, then its Python
    stacks (it runs with PYTHONFAULTHANDLER, so SIGABRT prints them on stderr), for the
    failure message."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{proc.pid}/task"), key=int)
    except OSError:
        tids = []
    for tid in tids:
        task = Path(f"/proc/{proc.pid}/task/{tid}")
        try:
            state = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = task.joinpath("wchan").read_text()
            stack = task.joinpath("stack").read_text()
        except OSError as exc:
            out.append(f"thread {tid}: {exc}")
            continue
        out.append(f"thread {tid} state {state} wchan {wchan}\n{stack}")
    before = len(lines)
    proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    time.sleep(0.2)  # let the reader thread take the traceback
    out.append("".join(line for _, line in lines[before:]))
    return "\n".join(out)


@pytest.mark.root
@pytest.mark.self_contained
@pytest.mark.parametrize("command", ["watch", "record"])
def test_sigterm_and_sigint_under_an_event_flood_stop_promptly(tmp_path, command):
    """The stop request is honoured, the final drain done and the summary written
    promptly after each signal (bounded, not waiting for the flood), and the process is gone.

    The exit includes detaching the probes.  The kernel releases each
    tracepoint perf event under one mutex after an RCU grace period: under
    this exec flood the 23 releases run one after another, 0.8-1.1 s
    (benchmarks/README-sensor.md).  So the sensor hands a second reference to
    every probe fd to a keeper process, which pays for the release after we
    exit: the command itself exits within the issue's second.

    The floods pause while each command compiles and loads its probes (a start-up under
    the flood took several times as long, and is not what this test is about) and flow
    again, through the callback, before the signal is sent.
    """
    stop, flowing = threading.Event(), threading.Event()
    floods = [
        threading.Thread(target=_connect_flood, args=(stop, flowing), daemon=True),
        threading.Thread(target=_exec_flood, args=(stop, flowing), daemon=True),
    ]
    for t in floods:
        t.start()
    try:
        # each signal once per command: every attempt compiles the probes (~4 s of CPU), and a
        # hang that shows only now and then is for `benchmarks/bench_stop.py --only cli --signals N`
        for attempt, sig in enumerate([signal.SIGTERM, signal.SIGINT]):
            flowing.clear()
            if command == "watch":
                proc = subprocess.Popen(
                    [*GPUGUARD, "watch", "--json", "--all", "--stats"],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={**os.environ, "PYTHONFAULTHANDLER": "1"},
                )
                for line in proc.stderr:  # the probes are attached once it says so
                    if b"gpuguard: watching" in line:
                        break
                flowing.set()
                first = proc.stdout.readline()  # the flood is flowing through the callback now
                assert json.loads(first)["kind"]
                threading.Thread(target=proc.stdout.read, daemon=True).start()
            else:
                proc = start_recorder(tmp_path / f"r{attempt}.ggr", "--gpu-interval", "0")
                flowing.set()
            lines = _stderr_lines(proc)
            time.sleep(0.5)
            sent = time.monotonic()
            proc.send_signal(sig)
            try:
                proc.wait(timeout=EXIT_WITHIN_S)
            except subprocess.TimeoutExpired:
                waits = _where_it_waits(proc, lines)
                pytest.fail(
                    f"{command} had not exited {EXIT_WITHIN_S} s after {sig.name} "
                    f"(attempt {attempt}); where it waited:\n{waits}"
                )
            exited = time.monotonic()
            time.sleep(0.1)  # let the reader thread take the last lines
            err = "".join(line for _, line in lines)
            assert proc.returncode == 0, err
            assert "Exception ignored" not in err and "Traceback" not in err
            summary = [t for t, line in lines if line.startswith("gpuguard: events:")]
            assert summary, err  # the final drain and the summary ran
            assert summary[0] - sent < EXIT_WITHIN_S, (
                f"{command} took {summary[0] - sent:.2f} s to stop on {sig.name}"
            )
            assert exited - sent < EXIT_WITHIN_S, (
                f"{command} took {exited - sent:.2f} s to exit on {sig.name}"
            )
            if command == "record":
                assert "wrote " in err
                replay = gpuguard("replay", "--json", str(tmp_path / f"r{attempt}.ggr"), timeout=60)
                assert replay.returncode == 0, (
                    replay.stderr
                )  # closed properly: end marker and checksum
    finally:
        stop.set()
        for t in floods:
            t.join(10)


def test_a_reader_that_goes_away_is_not_an_error(tmp_path):
    path = tmp_path / "many.ggr"
    from gpuguard.events.model import Exec

    with RecordingWriter(path) as writer:
        for i in range(20000):
            writer.write(Exec(time=T0 + i, pid=i, comm="x", cmdline=["x" * 100]))
    replay = subprocess.Popen(
        [*GPUGUARD, "replay", "--json", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    replay.stdout.readline()
    replay.stdout.close()  # `| head -1`
    err = replay.stderr.read().decode()
    assert replay.wait(30) == 0, err
    assert err == ""  # no traceback, no "Exception ignored ... BrokenPipeError" at exit


def test_cli_main_has_no_return_in_finally():
    import ast

    tree = ast.parse((REPO / "gpuguard" / "cli.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            assert not any(isinstance(n, ast.Return) for f in node.finalbody for n in ast.walk(f))
        if isinstance(node, ast.Assign):
            assert "sys.stdout" not in ast.unparse(node.targets[0])


def test_a_routing_bug_is_counted_apart_from_malformed_records(monkeypatch):
    from gpuguard.events.model import Exit
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor()

    class Decoder:
        def decode(self, data, size):
            return Exit(time=T0, pid=1)

    def broken_route(event):
        raise KeyError("a bug in our own routing")

    sensor._decoder = Decoder()
    monkeypatch.setattr(sensor, "_route", broken_route)
    sensor._handle(b"", 0)
    assert (sensor.stats.routing_errors, sensor.stats.malformed) == (1, 0)
