"""Huge pages on the real kernel: the sensor's mmap(MAP_HUGETLB)/shmget(SHM_HUGETLB) events,
the hugetlb facts /proc gives without a probe, and the rules on a stringless CPU miner.

Huge pages are really reserved here (/proc/sys/vm/nr_hugepages raised by what the test
needs and put back after), so the 2 MiB-page allocations succeed and show in /proc; the
1 GiB-page request fails with ENOMEM (none reserved) and is still seen at syscall entry.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.outputs.console import LiveView, format_event
from gpuguard.sources.proc.config_files import attach_config_files
from gpuguard.sources.proc.huge_pages import process_hugetlb, read_host_tuning
from gpuguard.sources.proc.process import collect_process_facts
from tests.support.cgroup_start import in_cgroups
from tests.support.hugepages import pool_held, reserved_huge_pages
from tests.support.load import own_cpu_group
from tests.support.workloads import build_workload, run_with_gpu_nodes

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]

MIB = 1 << 20
GIB = 1 << 30
RANDOMX_DATASET = 2181038080  # 2 GiB + 32 MiB, as RandomX allocates it


@contextmanager
def workload_in_opt(name: str):
    """The C workload copied to an ordinary /opt path under ``name`` (no miner string anywhere)."""
    directory = Path(f"/opt/gg-hugetlb-{os.getpid()}")
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / name
    shutil.copy2(build_workload(), binary)
    try:
        yield binary
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def start(argv: list[str], **popen_kwargs):
    proc = run_with_gpu_nodes(argv, **popen_kwargs)
    lines = []
    while (line := proc.stdout.readline()) not in (b"ready\n", b""):
        lines.append(line.decode().strip())
    assert line == b"ready\n", proc.stderr.read().decode()
    return proc, lines


def sensor_events_of(sensor, pids: set[int], until, timeout: float = 10.0) -> list:
    events: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(events):
        events.extend(e for e in sensor.poll(50) if e.pid in pids)
    return events


def smaps_rollup_hugetlb(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Hugetlb:", "Shared_Hugetlb:")):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize(
    "settings",
    [{"enter_hook": "tracepoint"}, {"enter_hook": "raw"}, {"perf_buffer": True}],
    ids=["tracepoint", "raw", "perf-buffer"],
)
def test_the_sensor_reports_huge_page_requests_and_proc_shows_the_mapping(settings):
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor(ProbeSettings(**settings), drain_interval=0.2, sweep_interval=3600)
    sensor.start()
    try:
        with reserved_huge_pages(4), workload_in_opt("worker") as binary:
            proc, said = start(
                [
                    str(binary),
                    f"hugemmap:{4 * MIB}:0",
                    f"hugemmap:{GIB}:30",
                    f"hugeshm:{4 * MIB}",
                    "ready",
                ]
            )
            try:
                events = sensor_events_of(
                    sensor, {proc.pid}, lambda ev: sum(e.kind == "huge_alloc" for e in ev) >= 3
                )
                facts = collect_process_facts(proc.pid)
                rollup = smaps_rollup_hugetlb(proc.pid)
            finally:
                proc.communicate(b"go\n", timeout=10)
    finally:
        sensor.close()
    assert said == ["hugemmap ok", "hugemmap 12", "hugeshm ok"]  # the 1 GiB pages: ENOMEM
    huge = [(e.source, e.length, e.page_size) for e in events if e.kind == "huge_alloc"]
    # Only the three huge requests: the loader's and libc's ordinary mmaps are filtered in the kernel.
    assert huge == [("mmap", 4 * MIB, 2 * MIB), ("mmap", GIB, GIB), ("shmget", 4 * MIB, 2 * MIB)]
    assert all(e.comm == "worker" for e in events if e.kind == "huge_alloc")
    shown = [
        format_event(e)
        for e in events
        if e.kind == "huge_alloc" and LiveView(io.StringIO())._shows(e)
    ]
    assert [line.split("worker", 1)[1].strip() for line in shown] == [
        "mmap 4 MiB in 2 MiB pages",
        "mmap 1 GiB in 1 GiB pages",
        "shmget 4 MiB in 2 MiB pages",
    ]
    # /proc without a probe: 8 MiB of 2 MiB pages mapped, the figure smaps_rollup gives too
    assert (facts.hugetlb_bytes, facts.hugetlb_page_size) == (8 * MIB, 2 * MIB)
    assert rollup == 8 * MIB


def test_a_process_without_huge_pages_has_zero_and_thp_is_not_counted():
    # This interpreter maps no hugetlb pages (transparent huge pages, if any, are not hugetlb).
    assert process_hugetlb(os.getpid()) == (0, None, [])
    assert process_hugetlb(2**22 + 12345) == (None, None, [])  # no such process


def _cpu_percent(pid: int, seconds: float = 1.0) -> float:
    probe = psutil.Process(pid)
    probe.cpu_percent(None)
    time.sleep(seconds)
    return probe.cpu_percent(None)


# A workload measured here has one core to itself: a cpu group of its own, capped at one core
# and weighing 16 tasks, so a busy host still leaves it the whole core while the other core
# stays the host's (nice -15 in an autogroup of its own took both for its 8 spinning threads,
# and stalled every other test of the run for up to 15 s).
ONE_CORE = {"tasks": 16, "cores": 1.0}


def run_measured(sensor, argv: list[str], huge_requests: int):
    """Start a workload, collect its sensor events, /proc facts and CPU %, then kill it.

    It runs with one core of its own (:data:`ONE_CORE`): the test machine's two cores are
    shared with other tests, and the point is a process that saturates what it is given, not
    a fair share of a busy host."""
    with own_cpu_group(**ONE_CORE) as core:
        return _measured(sensor, argv, huge_requests, core)


def _measured(sensor, argv: list[str], huge_requests: int, core: Path | None):
    proc, said = start(in_cgroups(argv, core))
    try:
        events = sensor_events_of(
            sensor, {proc.pid}, lambda ev: sum(e.kind == "huge_alloc" for e in ev) >= huge_requests
        )
        facts = collect_process_facts(proc.pid)
        # CPU over 1.5 s; a window in which others still took most of the cores is measured
        # again (five at most).
        for _ in range(5):
            facts.cpu_percent = _cpu_percent(proc.pid, 1.5)
            if facts.cpu_percent >= 90:
                break
        events += sensor_events_of(sensor, {proc.pid}, lambda ev: False, timeout=0.3)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    return proc, said, facts, events


def test_stringless_cpu_miner_is_suspicious_and_a_database_stays_clean():
    """A worker under /opt with no miner string: RandomX-sized huge pages (256 MiB cache in 2 MiB pages,
    a 2 GiB dataset asked for in 1 GiB pages), spinning threads on every core, one loopback session.  Then a
    database-like server: 256 MiB of 2 MiB huge pages in shared memory, as busy, a listening
    socket and no outgoing connection.  Real sensor events and /proc facts go through the engine."""
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    sensor = Sensor(ProbeSettings(), drain_interval=0.2, sweep_interval=3600)
    sensor.start()
    try:
        with reserved_huge_pages(130), workload_in_opt("worker") as miner_bin:
            database_bin = miner_bin.with_name("dbserver")
            shutil.copy2(miner_bin, database_bin)
            # One after the other: the two cores of a test machine are shared with other test runs.
            miner, miner_said, miner_facts, miner_events = run_measured(
                sensor,
                [
                    str(miner_bin),
                    f"hugemmap:{256 * MIB}:0",
                    f"hugemmap:{RANDOMX_DATASET}:30",
                    "spin:8",
                    f"connect:127.0.0.1:{port}",
                    "ready",
                ],
                huge_requests=2,
            )
            database, database_said, database_facts, database_events = run_measured(
                sensor,
                [str(database_bin), f"hugeshm:{256 * MIB}", "spin:8", "listen:0", "ready"],
                huge_requests=1,
            )
    finally:
        sensor.close()
        listener.close()
    assert miner_said == ["hugemmap ok", "hugemmap 12"] and database_said == ["hugeshm ok"]
    facts = {miner.pid: miner_facts, database.pid: database_facts}
    assert miner_facts.hugetlb_bytes == 256 * MIB and database_facts.hugetlb_bytes == 256 * MIB
    # both saturate what they get: the database is clean for what it lacks, not for being idle
    assert miner_facts.cpu_percent >= 90 and database_facts.cpu_percent >= 90, (
        miner_facts,
        database_facts,
    )
    assert {e.kind for e in miner_events} >= {"huge_alloc", "connect"}
    assert "connect" not in {e.kind for e in database_events}

    engine_input = sorted(miner_events + database_events, key=lambda e: e.time)
    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    for item in facts.values():
        correlator.feed(item)
    for event in engine_input:
        correlator.feed(event)
    later = (
        max(f.start_time for f in facts.values()) + 700
    )  # both have been up for over ten minutes
    verdicts = {v.pid: v for v in engine.verdicts(later)}
    mined = verdicts[miner.pid]
    assert {"cpu-hugepages-randomx-size", "cpu-hugepages-miner"} <= {
        e.rule_id for e in mined.evidence
    }
    assert mined.verdict == "suspicious", mined.explain()
    db = verdicts[database.pid]
    assert [e.rule_id for e in db.evidence] == ["cpu-hugepages-randomx-size"], db.explain()
    assert db.verdict == "clean", db.explain()
    # Right after start the same miner is not a verdict yet: the session is not long-lived.
    early = {v.pid: v for v in engine.verdicts(min(f.start_time for f in facts.values()) + 5)}
    assert early[miner.pid].verdict == "clean", early[miner.pid].explain()


def test_modprobe_msr_allow_writes_exec_is_seen():
    """The sensor's exec event (with the command line read at once) makes the modprobe a finding."""
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor(ProbeSettings(), drain_interval=0.2, sweep_interval=3600)
    sensor.start()
    try:
        with workload_in_opt("modprobe") as modprobe:
            # argv as `modprobe msr allow_writes=on` gives it ("ready" keeps the stand-in alive)
            loads, _ = start([str(modprobe), "ready", "msr", "allow_writes=on"])
            plain, _ = start([str(modprobe), "ready", "msr"])
            try:
                events = sensor_events_of(
                    sensor,
                    {loads.pid, plain.pid},
                    lambda ev: sum(e.kind == "exec" for e in ev) >= 2,
                )
            finally:
                for proc in (loads, plain):
                    proc.communicate(b"go\n", timeout=10)
    finally:
        sensor.close()
    execs = {e.pid: e for e in events if e.kind == "exec"}
    assert execs[loads.pid].cmdline[1:] == ["ready", "msr", "allow_writes=on"]
    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    for event in execs.values():
        correlator.feed(event)
    verdicts = {v.pid: v for v in engine.verdicts(time.time())}
    assert "cpu-msr-enable-writes" in {e.rule_id for e in verdicts[loads.pid].evidence}
    # a load without allow_writes is ordinary
    assert "cpu-msr-enable-writes" not in {e.rule_id for e in verdicts[plain.pid].evidence}


def test_a_real_reservation_is_a_host_finding_and_is_gone_after():
    from gpuguard.detect.host.tuning_checks import host_tuning_findings

    with pool_held():  # no other test's reservation moves the count meanwhile
        with reserved_huge_pages(3, pool_is_held=True):
            before_restore = read_host_tuning("/")
            findings = host_tuning_findings("/")
        after = read_host_tuning("/").reserved.get(2 << 20, 0)
    reserved = before_restore.reserved.get(2 << 20, 0)
    assert reserved >= 3 and before_restore.nr_hugepages == reserved
    assert [f.rule_id for f in findings if f.rule_id == "host-hugepages-reserved"] == [
        "host-hugepages-reserved"
    ]
    assert (
        f"/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages = {reserved}"
        in findings[-1].evidence
    )
    assert after == reserved - 3


def test_the_agent_gives_huge_page_users_a_cpu_window():
    """The agent has no CPU figures otherwise: the correlator names the candidates (a huge-page
    request seen), the sampler measures them from /proc between housekeeping periods."""
    from gpuguard.events.model import HugeAlloc
    from gpuguard.sources.proc.cpu_usage import CpuSampler

    with workload_in_opt("worker") as binary, own_cpu_group(**ONE_CORE) as core:
        busy, _ = start(in_cgroups([str(binary), "spin:8", "ready"], core))
        idle, _ = start([str(binary), "ready"])
        try:
            correlator = Correlator(
                facts_provider=collect_process_facts, config_reader=attach_config_files
            )
            now = time.time()
            for proc in (busy, idle):
                correlator.feed(
                    HugeAlloc(
                        time=now,
                        pid=proc.pid,
                        comm="worker",
                        source="mmap",
                        length=256 * MIB,
                        page_size=2 * MIB,
                    )
                )
            ordinary = collect_process_facts(os.getpid())
            correlator.feed(ordinary)  # no huge pages: not a candidate
            keys = {correlator.state_of(p.pid).key: p.pid for p in (busy, idle)}
            assert set(correlator.cpu_candidates()) == set(keys)
            sampler = CpuSampler()
            assert (
                sampler.sample(correlator.cpu_candidates()) == {}
            )  # the first look only starts the clock
            samples = {}
            for _ in range(5):  # the machine's cores are shared with other runs
                time.sleep(1.5)
                samples = sampler.sample(correlator.cpu_candidates())
                if samples[correlator.state_of(busy.pid).key] >= 90:
                    break
            for key, percent in samples.items():
                correlator.add_cpu_sample(key, now + 10, percent)
        finally:
            for proc in (busy, idle):
                proc.kill()
                proc.communicate(timeout=10)
    by_pid = {keys[k]: v for k, v in samples.items()}
    assert by_pid[busy.pid] >= 90 and by_pid[idle.pid] < 5, by_pid
    assert correlator.state_of(busy.pid).cpu.mean >= 90 and correlator.state_of(busy.pid).dirty
