"""A /tmp binary's later starts do not redo its first start's work: once its image is judged
clean, the sensor holds its execs like the kernel's plain ones, and a replaced file is new."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuguard.events.model import Exec
from tests.support.agent_run import running_agent

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture(scope="module")
def sensor():
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    with Sensor(
        ProbeSettings(exec_filter=True), drain_interval=0.2, exec_names=(["xmrig"], ["/tmp"])
    ) as s:
        yield s


@pytest.fixture
def napper():
    """A copy of sleep(1) in a directory of its own under /tmp (the rules list /tmp)."""
    directory = Path(tempfile.mkdtemp(prefix="gg-hold-", dir="/tmp"))
    program = directory / "napper"
    shutil.copy("/bin/sleep", program)
    yield program
    shutil.rmtree(directory, ignore_errors=True)


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)  # a ProcessFacts.exe_identity


def _execs_of(sensor, pid: int, seconds: float, first: bool = False) -> list:
    """The Exec records of ``pid`` read within ``seconds`` (``first``: return at the first)."""
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and not (first and out):
        out += [e for e in sensor.poll(50) if isinstance(e, Exec) and e.pid == pid]
    return out


def test_a_judged_image_is_held_dropped_with_its_exit_released_when_it_lives(sensor, napper):
    hold = sensor.image_hold
    first = subprocess.run([str(napper), "0.05"])
    assert first.returncode == 0
    proc = subprocess.Popen([str(napper), "0.3"])  # alive when its exec is read
    assert _execs_of(sensor, proc.pid, 0.4), "an unjudged /tmp image goes up at once"
    proc.wait()
    sensor.image_judged(proc.pid, _identity(napper))  # the agent's verdict: clean
    assert hold.counts["judged"] >= 1
    held, dropped = hold.counts["held"], hold.counts["dropped"]
    again = subprocess.Popen([str(napper), "0.2"])  # ends before the filter's age (0.5 s)
    assert _execs_of(sensor, again.pid, 0.8) == []  # held, then dropped with its exit
    again.wait()
    assert (hold.counts["held"], hold.counts["dropped"]) == (held + 1, dropped + 1)
    # one that lives past the filter's age goes up, with its command line
    lives = subprocess.Popen([str(napper), "1.5"])
    try:
        execs = _execs_of(sensor, lives.pid, 1.2)
        assert [e.cmdline for e in execs] == [[str(napper), "1.5"]]
    finally:
        lives.wait()
    # the same path rewritten (a new ctime even if size and mtime were put back) is a new image
    st = os.stat(napper)
    napper.write_bytes(napper.read_bytes())
    os.utime(napper, ns=(st.st_atime_ns, st.st_mtime_ns))
    replaced = subprocess.Popen([str(napper), "0.2"])
    assert _execs_of(sensor, replaced.pid, 0.6), "a rewritten file gets the whole path again"
    replaced.wait()


def test_the_agent_judges_a_tmp_binary_once_and_holds_its_later_starts(tmp_path, napper):
    with running_agent(tmp_path, "--sensor", "ebpf") as agent:
        # lives long enough to be read and judged on a loaded host (its verdict may come after its exit,
        # but only once its facts were read while it ran)
        proc = subprocess.Popen([str(napper), "2"])
        proc.wait()

        def hold() -> dict:
            return agent.status().get("counters", {}).get("execs", {}).get("image_hold", {})

        agent.wait_status(lambda d: hold().get("judged", 0) >= 1, timeout=20)
        before = hold()
        for _ in range(5):
            subprocess.run([str(napper), "0.1"], check=True)
        agent.wait_status(lambda d: hold().get("dropped", 0) >= before["dropped"] + 5, timeout=20)
        after = hold()
        # held and dropped with their exits: no facts, YARA, hash or scoring for them (other
        # jobs on a shared host may add theirs to these counts, never take ours away)
        assert after["held"] - before["held"] >= 5


def test_an_exec_sent_up_for_another_reason_is_never_held(sensor):
    """A plain program's exec promoted by age (it lived) goes up at once even when its image
    was judged: only execs sent up for their directory are held (no second 0.5 s wait)."""
    directory = Path(tempfile.mkdtemp(prefix="gg-hold-", dir="/var/cache"))
    program = directory / "plainnap"
    shutil.copy("/bin/sleep", program)
    try:
        # each lives 4 s; promoted after 0.5 s alive, its exec is read within 3.5 s on a loaded host
        first = subprocess.Popen([str(program), "4"])
        assert _execs_of(sensor, first.pid, 3.5, first=True), "promoted after 0.5 s alive"
        first.kill()
        first.wait()
        sensor.image_judged(first.pid, _identity(program))
        held = sensor.image_hold.counts["held"]
        again = subprocess.Popen([str(program), "4"])
        execs = _execs_of(sensor, again.pid, 3.5, first=True)
        assert execs and sensor.image_hold.counts["held"] == held
        again.kill()
        again.wait()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
