"""Pool sessions inside TLS: per-connection activity records of GPU holders, kept in the kernel.

Real kernel: a Python client holding a GPU-named node (private /dev) speaks a
TLS-wrapped stratum session (python ssl, self-signed certificate made with
openssl) to a loopback endpoint on 443, one share a second; the sensor's
records show the cadence.  An HTTPS client with keepalives that holds no GPU
gets no record at all.  The rule itself (15-60 s cadences, minutes of age) is
tested on recorded-shape events.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.events.model import ConnActivity
from gpuguard.events.process_facts import ProcessFacts
from tests.support.gpu_feed import feed_busy_gpu
from tests.support.workloads import run_with_gpu_nodes

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "tests" / "workloads" / "tls_stratum_client.py"
T = 1_795_305_600.0
TESTED_SIGNALS = {
    "session_cadence_s",
    "session_age_s",
    "session_bytes_per_s",
    "session_summary",
    "session_segments_out",
    "session_bytes_in_per_write",
}


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def _activity(pid, fd, age, times, bytes_out=2100, seeded=False):
    return ConnActivity(
        time=T + age,
        pid=pid,
        fd=fd,
        age_s=age,
        bytes_out=bytes_out,
        writes_out=len(times) + 3,
        small_writes=len(times) + 3,
        small_write_times=times,
        seeded=seeded,
    )


def test_steady_cadence_signals_and_evidence(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(
        ProcessFacts(
            pid=7,
            start_time=T,
            comm="python3",
            exe="/opt/app/python3",
            cmdline=["python3", "svc.py"],
        )
    )
    feed_busy_gpu(c, 7)
    c.feed(_activity(7, 5, 310.0, [T + 100 + 30 * i + (0.2 if i % 2 else 0.0) for i in range(8)]))
    c.feed(_activity(7, 6, 400.0, [T + 1, T + 2, T + 50, T + 51]))  # irregular: a person, a script
    r = SignalReader(c.state_of(7), T + 310)
    assert r["session_cadence_s"] == pytest.approx(30.0, abs=0.3)
    assert r["session_age_s"] == 310.0 and r["session_bytes_per_s"] == pytest.approx(6.77, abs=0.01)
    assert (
        r["session_summary"]
        == "session on fd 5: 11 writes out, 2.1 KiB out, small writes every 30.2 ± 0.4 s, open 310 s"
    )
    assert r["session_bytes_in_per_write"] is None  # no tcp_info: the inbound side is absent, not 0
    verdict = next(v for v in engine.verdicts(T + 310) if v.pid == 7)
    session = next(e for e in verdict.evidence if e.rule_id == "net-steady-session-gpu-busy")
    assert (
        "session_summary=session on fd 5: 11 writes out, 2.1 KiB out, small writes every 30.2"
        in session.detail
    )


@pytest.mark.parametrize(
    "times,why",
    [
        ([T + 2 * i for i in range(8)], "2 s: a chatty protocol, not a pool"),
        ([T + 30 * i for i in range(3)], "three writes: no cadence yet"),
        ([T, T + 10, T + 40, T + 45, T + 90], "irregular"),
    ],
)
def test_no_session_finding_without_a_pool_cadence(ruleset, times, why):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(ProcessFacts(pid=8, start_time=T, comm="app", exe="/usr/bin/app", cmdline=["app"]))
    feed_busy_gpu(c, 8)
    c.feed(_activity(8, 5, 300.0, times))
    verdict = next(v for v in engine.verdicts(T + 300) if v.pid == 8)
    assert "net-steady-session-gpu-busy" not in {e.rule_id for e in verdict.evidence}, why


def test_a_steady_session_without_a_busy_gpu_is_not_a_finding(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(ProcessFacts(pid=9, start_time=T, comm="app", exe="/usr/bin/app", cmdline=["app"]))
    c.feed(_activity(9, 5, 600.0, [T + 60 * i for i in range(8)]))
    verdict = next(v for v in engine.verdicts(T + 600) if v.pid == 9)
    assert verdict.score == 0


def test_sessions_are_bounded_keeping_the_longest_lived():
    c = Correlator(facts_provider=None)
    c.feed(ProcessFacts(pid=10, start_time=T, comm="app", exe="/usr/bin/app"))
    for fd in range(40):
        c.feed(_activity(10, fd, float(fd), [T]))
    sessions = c.state_of(10).sessions
    assert len(sessions) == 16 and min(sessions) == 24


@pytest.mark.root
@pytest.mark.self_contained
def test_the_kernel_records_a_tls_pool_session_of_a_gpu_holder(tmp_path):
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor
    from tests.support.covert_host import TlsPool

    pool = TlsPool(tmp_path)
    sensor = Sensor(ProbeSettings(), drain_interval=0.2, sweep_interval=3600, activity_interval=0.5)
    sensor.start()
    procs = []
    try:
        miner = run_with_gpu_nodes(
            [
                sys.executable,
                str(CLIENT),
                "127.0.0.1",
                str(pool.port),
                "stratum",
                "1",
                "/dev/nvidia0",
            ]
        )
        procs.append(miner)
        browser = run_with_gpu_nodes(
            [sys.executable, str(CLIENT), "127.0.0.1", str(pool.port), "https", "1"]
        )
        procs.append(browser)
        assert miner.stdout.readline() == b"ready\n" and browser.stdout.readline() == b"ready\n"
        events = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            events.extend(sensor.poll(100))
            mine = [e for e in events if e.kind == "conn_activity" and e.pid == miner.pid]
            if mine and mine[-1].age_s >= 9:  # the ring (8 times) holds only shares by then
                break
        assert sensor.activity is not None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        sensor.close()
        pool.close()
    assert any(b"mining.submit" in chunk for chunk in pool.received)  # stratum inside TLS
    records = [e for e in events if e.kind == "conn_activity" and e.pid == miner.pid]
    assert records, [e.kind for e in events if e.pid == miner.pid]
    last = records[-1]
    assert not last.seeded and last.age_s >= 9 and last.small_writes >= 9
    assert 0 < last.bytes_out < 4096  # the handshake and ~130-byte TLS records: few bytes
    gaps = [b - a for a, b in zip(last.small_write_times, last.small_write_times[1:], strict=False)]
    assert gaps and all(0.8 < g < 1.5 for g in gaps), gaps  # one share a second, seen through TLS
    # the HTTPS keepalive client holds no GPU: the kernel keeps nothing about it
    assert not [e for e in events if e.kind == "conn_activity" and e.pid == browser.pid]
    c = Correlator(facts_provider=None)
    c.feed(
        ProcessFacts(
            pid=miner.pid, start_time=last.time - last.age_s - 1, comm="python3", exe=sys.executable
        )
    )
    for e in records:
        c.feed(e)
    assert SignalReader(c.state_of(miner.pid), last.time)["session_cadence_s"] == pytest.approx(
        1.0, abs=0.3
    )


HOLDER = """
import os, socket, sys
gpu = os.open("/dev/nvidia0", os.O_RDWR)
port = int(sys.argv[1])
socks = []
def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"x")
    socks.append(s)
    return s.fileno()
print(" ".join(str(connect()) for _ in range(3)), flush=True)
sys.stdin.readline()
socks.pop(0).close()
spacer = os.open("/dev/null", os.O_RDONLY)     # takes the closed fd's number: the next socket gets a new one
print(connect(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_activity_slots_are_bounded_counted_when_full_and_freed_on_close():
    """Two activity slots for the whole host: the third connection is counted lost, a close
    frees a slot.  The slots are the host's: a round in which another process opened a GPU
    node (another test's GPU holder, whose connections take slots too) proves nothing either
    way, and is run again."""
    for _ in range(3):
        failed, foreign = _activity_slot_round()
        if failed is None or not foreign:
            break
    if failed is not None:
        raise failed


def _activity_slot_round() -> tuple[AssertionError | None, set[int]]:
    """(the round's failed assertion or None, the other processes seen holding a GPU node)."""
    import socket

    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # connections complete in the backlog; nobody needs to accept
    sensor = Sensor(
        ProbeSettings(activity_slots=2),
        drain_interval=0.2,
        sweep_interval=3600,
        activity_interval=0.3,
    )
    sensor.start()
    holder = run_with_gpu_nodes([sys.executable, "-c", HOLDER, str(listener.getsockname()[1])])
    events: list = []

    def recorded_fds(until):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            events.extend(sensor.poll(100))
            fds = {e.fd for e in events if e.kind == "conn_activity" and e.pid == holder.pid}
            if until(fds):
                return fds
        return {e.fd for e in events if e.kind == "conn_activity" and e.pid == holder.pid}

    try:
        first, second, third = (int(x) for x in holder.stdout.readline().split())
        assert recorded_fds(lambda fds: len(fds) >= 2) == {
            first,
            second,
        }  # the third found no free slot
        recorded_fds(
            lambda fds: sensor.stats.lost["activity"] > 0
        )  # lost counts are read on the drain
        assert sensor.stats.lost["activity"] == 1
        holder.stdin.write(b"go\n")
        holder.stdin.flush()
        fourth = int(holder.stdout.readline())
        assert fourth not in (first, second, third)
        assert fourth in recorded_fds(lambda fds: fourth in fds)  # the closed first's slot, reused
        assert sensor.stats.lost["activity"] == 1
        failed = None
    except AssertionError as exc:
        failed = exc
    finally:
        holder.kill()
        holder.wait()
        events.extend(sensor.drain())
        sensor.close()
        listener.close()
    foreign = {
        e.pid
        for e in events
        if e.kind in ("gpu_open", "conn_activity") and e.pid not in (holder.pid, 0)
    }
    return failed, foreign


CHATTER = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    s.sendall(b'{"id":4,"method":"keepalived"}\\n')
    time.sleep(0.3)
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_the_agent_watches_the_sessions_of_a_process_scored_above_the_threshold(tmp_path):
    """No GPU: a process whose command line names a stratum pool scores above ``sessions.watch_score``
    and the agent gives its connection an activity record; the same program with a
    plain command line stays below it and gets none."""
    import socket
    import subprocess
    import threading

    from gpuguard.agent.config import AgentConfig
    from gpuguard.agent.pipeline import Agent
    from tests.support.agent_run import until

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = str(listener.getsockname()[1])
    agent = Agent(
        AgentConfig(
            sensor="ebpf",
            log_path=str(tmp_path / "agent.log"),
            status_path=tmp_path / "status.json",
            gpu_sources=[],
        ),
        install_signals=False,
        stderr=lambda line: None,
        sampler_openers={},
    )
    assert agent.config.session_watch_score == 1  # any score
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    procs = []
    try:
        until(lambda: agent.ready.is_set() or not thread.is_alive(), 120)
        assert agent.ready.is_set(), "the agent did not start"
        # the same program; only the suspect's command line names a pool (the agent reads it from /proc)
        suspect = subprocess.Popen(
            [sys.executable, "-c", CHATTER, port, f"--url=stratum+tcp://pool.example:{port}"],
            stdout=subprocess.PIPE,
        )
        procs.append(suspect)
        plain = subprocess.Popen([sys.executable, "-c", CHATTER, port], stdout=subprocess.PIPE)
        procs.append(plain)
        assert suspect.stdout.readline() == b"ready\n" and plain.stdout.readline() == b"ready\n"

        def sessions_of(pid):
            state = next(
                (s for s in list(agent.correlator.unordered_states()) if s.pid == pid), None
            )
            return state, (dict(state.sessions) if state is not None else {})

        state, sessions = until(
            lambda: (lambda s: s if s[1] else None)(sessions_of(suspect.pid)), 40
        )
        record = next(iter(sessions.values()))
        # seeded if the connect came before the watch, else recorded at the connect: counted either way
        assert (
            record.writes_out >= 1
            and record.small_writes >= 1
            and record.remote.endswith(f":{port}")
        )
        assert state.verdict is not None and state.verdict.score >= 20
        plain_state, plain_sessions = sessions_of(plain.pid)
        assert plain_state is not None and (
            plain_state.verdict is None or plain_state.verdict.score < 20
        )
        assert plain_sessions == {}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        agent.request_stop()
        thread.join(30)
        listener.close()
