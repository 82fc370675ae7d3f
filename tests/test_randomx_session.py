"""The RandomX stand-in's pool session and fast mode, and `gpuguard scan` against it on a quiet
host and on a loaded one (real processes, real kernel, loopback pool)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuguard.events.payload import recognise_payload
from gpuguard.sources.net.session_window import one_look
from gpuguard.sources.proc.process import collect_process_facts
from tests.cases.make_cases import JA4_OPENSSL
from tests.support.hugepages import reserved_huge_pages
from tests.support.randomx import (
    INSTALL_DIR,
    LoopbackPool,
    build_standin,
    cpu_hog,
    start_standin,
    stop,
)
from tests.support.scan import findings_for_pid, scan_json
from tests.support.short_windows import rules_args, short_window_rules, shortened

MIB = 1 << 20


def test_the_standins_client_hello_is_openssls_default_without_sni_or_alpn():
    """The JA4 the golden case gives the throttled miner is what the stand-in really sends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(20)
    proc = subprocess.Popen([str(build_standin())], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = listener.getsockname()[1]
        proc.stdin.write(f"peer_port {port}\nthreads 1\nmemory 8\nrounding 0\n".encode())
        proc.stdin.close()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            hello = conn.recv(65536)
    finally:
        stop(proc)
        listener.close()
    protocol, detail = recognise_payload(hello[:512])
    assert protocol == "tls" and "sni" not in detail and "alpn" not in detail
    assert detail["ja4"] == JA4_OPENSSL


@pytest.mark.root
@pytest.mark.host_mutator
def test_the_standin_keeps_a_tls_session_with_job_pushes_and_small_submits():
    """Jobs pushed by the pool and submits at random moments, all small records: what tcp_info
    shows of it (scan's one look) is a quiet session with more segments in than out."""
    with tempfile.TemporaryDirectory(prefix="gg-rx-session-") as tmp:
        pool = LoopbackPool(Path(tmp), tls=True, push_s=(1.0, 3.0))
        miner = None
        try:
            miner = start_standin(pool, "feedsyncd", threads=1, memory_mib=8, submit_s=1.0)
            time.sleep(15)
            records, unreadable = one_look(
                [miner.pid], lambda pid: ("feedsyncd", 0), lambda pid: 15.0
            )
            pushes, submits = pool.pushes, pool.lines_in
        finally:
            stop(miner)
            pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    assert not unreadable
    assert pushes >= 4 and submits >= 4, (pushes, submits)
    (record,) = [r for r in records if r.remote.startswith("127.0.0.1:")]
    assert record.small_writes == record.writes_out >= submits  # each submit <= 1 KiB
    assert record.bytes_in / record.data_segs_in <= 1024  # jobs and replies: small records
    # one reply per submit, two more from the TLS 1.3 handshake, and the pushes beyond them
    assert record.data_segs_in - record.data_segs_out >= pushes // 2, record


@pytest.mark.root
@pytest.mark.host_mutator
def test_the_standins_fast_mode_maps_a_2_gib_dataset_in_huge_pages():
    """RandomX's fast mode: the 256 MiB cache and the 2080 MiB dataset built from it."""
    with tempfile.TemporaryDirectory(prefix="gg-rx-fast-") as tmp:
        pool = LoopbackPool(Path(tmp), tls=True)
        miner = None
        try:
            with reserved_huge_pages((256 + 2080) // 2 + 2):
                try:
                    miner = start_standin(pool, "feedsyncd", threads=1, dataset=True)
                    facts = collect_process_facts(miner.pid)
                finally:
                    stop(miner)  # before the huge pages go back
        finally:
            stop(miner)
            pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    assert facts is not None
    assert facts.hugetlb_bytes == (256 + 2080) * MIB, facts.hugetlb_bytes


def _verdict(doc: dict, pid: int) -> tuple[str, set[str]]:
    found = findings_for_pid(doc, pid)
    if not found:
        return "clean", set()
    assert len(found) == 1, found
    return found[0]["gpuguard"]["verdict"], set(found[0]["gpuguard"]["rule_ids"])


@pytest.mark.root
@pytest.mark.host_mutator
def test_gpuguard_scan_flags_the_standin_on_a_quiet_host_and_on_a_loaded_one():
    """Its cache in huge pages, TLS to an IP with no SNI, settings on stdin: a 0.5 s scan finds
    it from lifetime evidence (a thread runnable all its life, the huge pages, its session
    read once) on a quiet host, and again once two CPU hogs and a second copy at nice 19 with
    one thread load the host.  The rules' windows are shortened six-fold (a minute of spinning
    is 10 s, a two-minute quiet session 20 s: tests/support/short_windows.py).  Assertions are
    about the processes this test started only."""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="gg-scan-rx-") as tmp:
        rules = rules_args(short_window_rules(Path(tmp)))
        pool = LoopbackPool(Path(tmp), tls=True, push_s=(10.0, 40.0))
        try:
            with reserved_huge_pages(2 * 128 + 4):
                try:
                    quiet = start_standin(pool, "nodestatd", threads=1, submit_s=15)
                    procs.append(quiet)
                    time.sleep(shortened(60) + 5)  # cpu-hugepages-miner: a minute of spinning
                    code, quiet_doc, _ = scan_json("--no-yara", *rules)
                    hogs = [cpu_hog(300), cpu_hog(300)]
                    procs += hogs
                    throttled = start_standin(pool, "syncagent", threads=1, nice=19, submit_s=15)
                    procs.append(throttled)
                    # the throttled copy's minute, and the first one's two-minute quiet session
                    time.sleep(shortened(120))
                    _, loaded_doc, _ = scan_json("--no-yara", *rules)
                    assert all(p.poll() is None for p in procs), "a workload died early"
                finally:
                    for proc in procs:  # before the huge pages go back
                        stop(proc)
        finally:
            pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    assert code == 1  # something reached suspicious
    verdict, rules_seen = _verdict(quiet_doc, quiet.pid)
    assert verdict in ("suspicious", "malicious"), (verdict, rules_seen)
    assert {"cpu-hugepages-randomx-size", "cpu-hugepages-miner"} <= rules_seen
    # on the loaded host: the throttled copy from its lifetime alone, and the first one again,
    # now with its pool session read once (past the quiet-session rule's window)
    verdict, rules_seen = _verdict(loaded_doc, throttled.pid)
    assert verdict in ("suspicious", "malicious"), (verdict, rules_seen)
    verdict, rules_seen = _verdict(loaded_doc, quiet.pid)
    assert verdict in ("suspicious", "malicious"), (verdict, rules_seen)
    assert "net-quiet-session-cpu-spinning" in rules_seen, rules_seen
    for hog in hogs:  # busy, but nothing else odd
        assert _verdict(loaded_doc, hog.pid)[0] == "clean"
