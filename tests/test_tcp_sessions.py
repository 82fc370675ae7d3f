"""The TCP stack's counters of GPU holders' sessions (tcp_info over sock_diag): agent, other netns, scan.

Real kernel throughout: a TLS-wrapped stratum session to a loopback pool that
answers every share and counts every byte on the wire; a socket pair inside a
network namespace made for the test; ``gpuguard scan`` with a window covering
several share intervals.  The rule's use of the inbound side is tested on
recorded-shape events (a download must not look like a pool).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
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
from gpuguard.sources.net.session_window import _record
from gpuguard.sources.net.tcp_sessions import (
    TcpSession,
    TcpSessionReader,
    decode_tcp_info,
    dump_tcp,
    read_sessions,
    socket_fds,
)
from tests.support.covert_host import TlsPool, scan_in_process
from tests.support.gpu_feed import feed_busy_gpu
from tests.support.workloads import run_with_gpu_nodes

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "tests" / "workloads" / "tls_stratum_client.py"
T = 1_795_305_600.0
REPLY = b'{"id":2,"result":true,"error":null}\n'


# ---- decoding ----------------------------------------------------------------------


def test_fields_beyond_the_kernels_tcp_info_length_are_absent_not_zero():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        client.sendall(b"x" * 300)
        peer.sendall(b"y" * 77)
        time.sleep(0.05)
        full = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)
        assert len(full) >= 160  # this kernel has the segment counters
        info = decode_tcp_info(full)
        assert (
            info["bytes_received"] == 77
            and info["data_segs_out"] == 1
            and info["bytes_sent"] == 300
        )
        old = decode_tcp_info(full[:104])  # a 4.0 kernel's length: no byte counters yet
        assert old["last_data_recv_ms"] is not None
        assert (
            old["bytes_received"] is None
            and old["data_segs_in"] is None
            and old["bytes_sent"] is None
        )
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_dump_maps_sockets_to_their_fds_with_counts_each_way():
    server = socket.create_server(("::1", 0), family=socket.AF_INET6)
    client = socket.create_connection(server.getsockname()[:2])
    peer, _ = server.accept()
    try:
        for _ in range(3):
            client.sendall(b"a" * 100)
            assert peer.recv(100)
            peer.sendall(b"b" * 40)
            assert client.recv(40)
        got = read_sessions([os.getpid()])
        mine = got.sessions[(os.getpid(), client.fileno())]
        assert mine.family == "ipv6" and mine.remote == f"[::1]:{server.getsockname()[1]}"
        assert (mine.bytes_sent, mine.data_segs_out, mine.bytes_received, mine.data_segs_in) == (
            300,
            3,
            120,
            3,
        )
        theirs = got.sessions[(os.getpid(), peer.fileno())]
        assert (theirs.bytes_received, theirs.data_segs_in) == (300, 3)
        assert (os.getpid(), server.fileno()) not in got.sessions  # a listener has no peer
        assert socket_fds(os.getpid())[os.fstat(client.fileno()).st_ino] == client.fileno()
    finally:
        for s in (client, peer, server):
            s.close()


def test_the_reader_dumps_only_for_new_sockets_and_asks_for_known_ones_by_tuple():
    server = socket.create_server(("127.0.0.1", 0))  # listening: a TCP socket no dump lists
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # not TCP: never asked for
    reader = TcpSessionReader()
    me = os.getpid()
    try:
        first = reader.read([me])
        assert reader.dumps == 1 and (me, udp.fileno()) not in first.sessions
        assert first.sessions[(me, client.fileno())].bytes_sent == 0
        client.sendall(b"z" * 500)
        assert peer.recv(500)
        second = reader.read([me])
        assert reader.dumps == 1 and reader.lookups == 2  # two known sockets, no dump
        assert second.sessions[(me, client.fileno())].bytes_sent == 500
        assert second.sessions[(me, peer.fileno())].bytes_received == 500
        other = socket.create_connection(server.getsockname())  # a new one: one dump
        other_peer, _ = server.accept()
        third = reader.read([me])
        assert reader.dumps == 2 and (me, other.fileno()) in third.sessions
        for s in (other, other_peer):
            s.close()
        reader.read([me])
        assert reader.dumps == 2  # closed sockets are simply gone
    finally:
        for s in (client, peer, server, udp):
            s.close()


# ---- the agent: the kernel's record joined with the stack's counters ----------------


@pytest.mark.root
@pytest.mark.self_contained
def test_a_tls_pool_session_shows_bytes_and_segments_each_way(tmp_path):
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    pool = TlsPool(tmp_path, reply=REPLY)
    sensor = Sensor(ProbeSettings(), drain_interval=0.2, sweep_interval=3600, activity_interval=0.5)
    sensor.start()
    miner = None
    events = []
    try:
        miner = run_with_gpu_nodes(
            [
                sys.executable,
                str(CLIENT),
                "127.0.0.1",
                str(pool.port),
                "stratum",
                "0.3",
                "/dev/nvidia0",
            ]
        )
        assert miner.stdout.readline() == b"ready\n"
        time.sleep(2.0)
        os.kill(miner.pid, signal.SIGSTOP)  # traffic stops: the counters settle
        wire = None
        while wire != (pool.wire_in, pool.wire_out, pool.sends, len(pool.received)):
            wire = (pool.wire_in, pool.wire_out, pool.sends, len(pool.received))
            time.sleep(0.5)
        pool_side = [
            t
            for t in read_sessions([os.getpid()]).sessions.values()
            if t.local == f"127.0.0.1:{pool.port}" and t.state == "ESTABLISHED"
        ]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            events.extend(sensor.poll(100))
            mine = [e for e in events if e.kind == "conn_activity" and e.pid == miner.pid]
            if mine and mine[-1].bytes_in == wire[1]:
                break
    finally:
        if miner is not None:
            miner.kill()
            miner.wait()
        sensor.close()
        pool.close()
    wire_in, wire_out, sends, _lines = wire
    last = [e for e in events if e.kind == "conn_activity" and e.pid == miner.pid][-1]
    shares = sum(chunk.count(b"mining.submit") for chunk in pool.received)
    assert shares >= 3 and last.remote == f"127.0.0.1:{pool.port}"
    # in: exactly what the pool put on the wire (handshake, tickets, one result per share)
    # (a tail-loss probe the pool's stack sent while the client delayed its ACK arrives twice: counted twice)
    assert len(pool_side) == 1
    assert (
        last.bytes_in == wire_out
        and sends <= last.data_segs_in <= sends + pool_side[0].total_retrans
    )
    assert (
        pool_side[0].bytes_received == wire_in
        and pool_side[0].data_segs_out == sends + pool_side[0].total_retrans
    )
    # out: the stack, the kernel's write record and the pool agree to the byte
    assert last.stack_bytes_out == last.bytes_out == wire_in
    assert shares + 1 <= last.data_segs_out <= last.writes_out  # one segment per TLS record written
    assert last.last_recv_s is not None and last.last_recv_s >= 0.4 and last.rtt_ms is not None


# ---- network namespaces -------------------------------------------------------------

_NETNS_PEER = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"q" * 123); peer.recv(123); peer.sendall(b"r" * 45); client.recv(45)
print(client.fileno(), flush=True)
time.sleep(60)
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_a_socket_in_another_network_namespace_is_seen():
    name = f"gg-tcpinfo-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    proc = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", _NETNS_PEER],
            stdout=subprocess.PIPE,
            text=True,
        )
        fd = int(proc.stdout.readline())
        assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
        inode = os.stat(f"/proc/{proc.pid}/fd/{fd}").st_ino
        assert inode not in dump_tcp(inodes={inode})  # invisible from this namespace
        home = os.stat("/proc/thread-self/ns/net").st_ino
        got = read_sessions([proc.pid])
        assert not got.unreadable
        session = got.sessions[(proc.pid, fd)]
        assert (
            session.bytes_sent,
            session.data_segs_out,
            session.bytes_received,
            session.data_segs_in,
        ) == (123, 1, 45, 1)
        assert (
            os.stat("/proc/thread-self/ns/net").st_ino == home
        )  # setns ran on a thread of its own
        reader = TcpSessionReader()
        reader.read([proc.pid])
        again = reader.read([proc.pid])
        assert (
            reader.dumps == 1 and again.sessions[(proc.pid, fd)].bytes_received == 45
        )  # looked up in its netns
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


# ---- the rule: the inbound side -------------------------------------------------------


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def _pool_like(pid, bytes_in, segs_in, age=310.0, seeded=False, segs_out=12):
    times = [T + 30 * i for i in range(8)]
    return ConnActivity(
        time=T + age,
        pid=pid,
        fd=5,
        age_s=age,
        bytes_out=1600,
        writes_out=10,
        small_writes=10,
        small_write_times=times,
        seeded=seeded,
        remote="127.0.0.1:443",
        bytes_in=bytes_in,
        data_segs_in=segs_in,
        stack_bytes_out=1600,
        data_segs_out=segs_out,
    )


def _rules_hit(ruleset, record, pid):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(
        ProcessFacts(pid=pid, start_time=T - 3600, comm="app", exe="/usr/bin/app", cmdline=["app"])
    )
    feed_busy_gpu(c, pid, 310)
    c.feed(record)
    verdict = next(v for v in engine.verdicts(T + 310) if v.pid == pid)
    return {e.rule_id: e.detail for e in verdict.evidence}, SignalReader(c.state_of(pid), T + 310)


def test_a_pool_answering_each_share_is_a_finding_with_both_directions_in_the_evidence(ruleset):
    hits, r = _rules_hit(ruleset, _pool_like(21, bytes_in=12 * 1024, segs_in=40, segs_out=41), 21)
    assert r["session_bytes_in_per_write"] == pytest.approx(299.7, abs=0.1)
    assert r["session_summary"] == (
        "session to 127.0.0.1:443 (fd 5): 41 writes out / 40 in, 1.6 KiB out / 12 KiB in, "
        "small writes every 30.0 ± 0.0 s, open 310 s"
    )
    assert (
        "session_summary=session to 127.0.0.1:443 (fd 5): 41 writes out / 40 in"
        in hits["net-steady-session-gpu-busy"]
    )


def test_a_download_with_a_steady_keepalive_is_not_a_pool(ruleset):
    hits, r = _rules_hit(ruleset, _pool_like(22, bytes_in=900 << 20, segs_in=640_000), 22)
    assert r["session_bytes_in_per_write"] > 16384
    assert "net-steady-session-gpu-busy" not in hits


def test_a_scan_window_stands_in_for_age_with_the_stacks_segment_count(ruleset):
    young = _pool_like(23, bytes_in=3000, segs_in=10, age=60.0, seeded=True, segs_out=4)
    assert (
        "net-steady-session-gpu-busy" not in _rules_hit(ruleset, young, 23)[0]
    )  # 4 segments: just connected
    old = _pool_like(24, bytes_in=30_000, segs_in=100, age=60.0, seeded=True, segs_out=100)
    assert "net-steady-session-gpu-busy" in _rules_hit(ruleset, old, 24)[0]


# ---- scan: write times from once-a-second snapshots -------------------------------------


def _snap(segs_out, sent, received=0, segs_in=0):
    return TcpSession(
        inode=1,
        family="ipv4",
        local="127.0.0.1:5000",
        remote="127.0.0.1:443",
        state="ESTABLISHED",
        bytes_sent=sent,
        bytes_received=received,
        data_segs_out=segs_out,
        data_segs_in=segs_in,
        last_data_sent_ms=0,
    )


def test_scan_window_write_times_and_window_counts_from_snapshots():
    points = [
        (
            T + i,
            _snap(100 + (i + 1) // 3 + (i >= 7) * 5, 9000 + 120 * ((i + 1) // 3) + (i >= 7) * 7000),
        )
        for i in range(10)
    ]
    record = _record(7, 5, points, "app", 0)
    assert record.small_write_times == [
        T + 2,
        T + 5,
        T + 8,
    ]  # the big burst at T + 7 is not a small write
    assert record.writes_out == 3 + 5 and record.bytes_out == 3 * 120 + 7000
    assert record.seeded and record.age_s == 9 and record.time_resolution_s == 1.0
    assert record.data_segs_out == 108 and record.remote == "127.0.0.1:443"


def test_a_scan_window_of_60_s_shows_a_15_s_cadence_from_three_writes(ruleset):
    points = [
        (
            T + i,
            _snap(
                200 + (i - 3) // 15 + 1 if i >= 3 else 200,
                30_000 + 150 * ((i - 3) // 15 + 1 if i >= 3 else 0),
                received=40_000,
                segs_in=220,
            ),
        )
        for i in range(0, 60)
    ]
    record = _record(25, 5, points, "app", 0)
    assert record.small_write_times == [T + 3, T + 18, T + 33, T + 48]
    record.small_write_times = record.small_write_times[
        1:
    ]  # the same, had the window started later
    hits, r = _rules_hit(ruleset, record, 25)
    assert r["session_cadence_s"] == 15 and r["session_age_s"] == 59
    assert (
        "session_summary=session to 127.0.0.1:443 (fd 5): 204 writes out / 220 in"
        in hits["net-steady-session-gpu-busy"]
    )
    two = _record(25, 5, points[:20], "app", 0)  # two writes: no cadence yet
    assert _rules_hit(ruleset, two, 26)[1]["session_cadence_s"] is None


@pytest.mark.root
@pytest.mark.self_contained
def test_scan_reports_the_session_cadence_of_a_gpu_holder(covert_host, capsys, tmp_path):
    rules = tmp_path / "cadence.yaml"
    rules.write_text(
        "version: 1\nrules:\n  - id: test-session-cadence\n    description: any steady session\n"
        "    severity: low\n    weight: 1\n    condition:\n"
        "      all:\n        - {signal: session_cadence_s, lte: 3}\n"
        "        - {signal: session_summary, matches: 'small writes every'}\n"
    )
    os.chmod(rules, 0o644)
    code, doc = scan_in_process(capsys, "--gpu-window", "7", "--rules", str(rules))
    covert = next(
        f for f in doc["findings"] if f.get("process", {}).get("pid") == covert_host["covert"].pid
    )
    evidence = next(
        e for e in covert["gpuguard"]["evidence"] if e["rule_id"] == "test-session-cadence"
    )
    port = covert_host["pool"].port
    assert f"session_summary=session to 127.0.0.1:{port} (fd " in evidence["detail"]
    assert (
        "small writes every 1.0 ± " in evidence["detail"]
    )  # the evidence cuts the rest of the summary
    # The pool's 1 s rhythm, seen through once-a-second snapshots: 1 (the median of whole
    # seconds) or a fraction either side.
    cadence = float(re.search(r"session_cadence_s=([0-9.]+)", evidence["detail"]).group(1))
    assert 0.9 <= cadence <= 1.1, evidence["detail"]
    assert doc["summary"]["counters"]["gpu_sessions"] >= 1
    # the HTTPS keepalive client holds no GPU: its session is not sampled
    assert not [
        f for f in doc["findings"] if f.get("process", {}).get("pid") == covert_host["https"].pid
    ]
