"""The exec filter on the real kernel: a flood of short execs stays in the kernel and is counted,
yet every process that lives, connects or opens a GPU is seen in full, with its ancestry."""

from __future__ import annotations

import ctypes as ct
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuguard.events.model import Connect, Exec, Exit, GpuOpen
from tests.support.agent_run import AgentProcess
from tests.support.cgroup_start import in_cgroup
from tests.support.load import start_flood
from tests.support.workloads import build_c_program, build_workload, private_dev_command

EXEC_FLOOD = Path(__file__).resolve().parent / "workloads" / "exec_flood.c"
# outer sh forks an inner sh that forks "$@" (the trailing "; true" keeps each from exec'ing)
OUTER = '/bin/sh -c \'"$0" "$@"; true\' "$@"; true'
MINER_ARGS = ["-o", "stratum+tcp://pool.example.invalid:3333", "--donate-level", "1"]


@pytest.fixture(scope="module")
def sensor():
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    with Sensor(ProbeSettings(exec_filter=True), drain_interval=0.2, exec_names=["xmrig"]) as s:
        yield s


@contextmanager
def own_cgroup() -> Iterator[tuple[Path, int]]:
    """A cgroup for this test's processes: (its directory, its id)."""
    from gpuguard.respond.cgroup_blocks import cgroup2_mount

    cgroup = Path(cgroup2_mount()) / f"gg-exec-filter-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    cgroup.mkdir()
    try:
        yield cgroup, os.stat(cgroup).st_ino
    finally:
        if (cgroup / "cgroup.procs").read_text().strip():
            (cgroup / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 5
            while (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
                time.sleep(0.05)
        cgroup.rmdir()


def flood(rate: int, seconds: float, cgroup: Path) -> subprocess.Popen:
    """exec_flood (fork+exec of /bin/true) inside ``cgroup`` from its first instruction."""
    argv = [str(build_c_program(EXEC_FLOOD)), str(rate), str(seconds)]
    return start_flood(argv, cgroup, stdout=subprocess.PIPE, text=True)


def poll_until(sensor, seconds: float, done=lambda events: False) -> list:
    events: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        events += sensor.poll(50)
        if done(events):
            break
    return events


@pytest.mark.root
@pytest.mark.self_contained
def test_short_execs_are_counted_per_cgroup_and_not_sent_up(sensor):
    with own_cgroup() as (cgroup, cgroup_id):
        proc = flood(500, 2, cgroup)
        events = poll_until(sensor, 8, lambda _: proc.poll() is not None)
        done = int(proc.communicate(timeout=30)[0])
        events += poll_until(sensor, 1.0)
        sensor.exec_filter.read_counts()
        counted = sensor.exec_filter.aggregated.get(cgroup_id, 0)
    assert done > 100
    ours = [e for e in events if e.cgroup_id == cgroup_id]
    trues = [e for e in ours if isinstance(e, Exec) and e.filename.endswith("/true")]
    assert trues == []  # none went up
    assert [e for e in ours if e.kind == "exit" and e.comm == "true"] == []  # nor their exits
    # every /bin/true exec counted (the sh that moved itself into the cgroup ran before it)
    assert counted >= done
    assert counted <= done + 2  # plus at most sh's exec of the flooder, were it kept
    assert sensor.exec_filter.summary()["aggregated"] >= counted


@pytest.mark.root
@pytest.mark.self_contained
def test_a_short_exec_that_connects_is_sent_up_before_its_connect(sensor):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        script = f"import socket; socket.create_connection(('127.0.0.1', {port})).close()"
        proc = subprocess.Popen([sys.executable, "-c", script])
        events = poll_until(
            sensor,
            10,
            lambda evs: any(isinstance(e, Connect) and e.pid == proc.pid for e in evs),
        )
        proc.wait(10)
    mine = [e for e in events if e.pid == proc.pid and isinstance(e, Exec | Connect)]
    assert mine and isinstance(mine[0], Exec), [e.kind for e in mine]
    assert mine[0].filename == sys.executable or "python" in mine[0].filename
    assert any(isinstance(e, Connect) and e.port == port for e in mine)


def _sleeper_execs(sensor, seconds: str, within: float) -> tuple[int, list]:
    """``/bin/sleep SECONDS`` (a plain exec: kept in the kernel) polled for until its exec goes
    up or ``within`` s pass, then killed: (its pid, its Exec records)."""
    proc = subprocess.Popen(["/bin/sleep", seconds])
    try:
        events = poll_until(
            sensor, within, lambda evs: any(isinstance(e, Exec) and e.pid == proc.pid for e in evs)
        )
    finally:
        proc.kill()
        proc.wait()
    return proc.pid, [e for e in events if isinstance(e, Exec) and e.pid == proc.pid]


@pytest.mark.root
@pytest.mark.self_contained
def test_a_plain_exec_that_lives_is_sent_up_with_its_command_line(sensor):
    _pid, (exec_,) = _sleeper_execs(sensor, "6", 10)
    assert exec_.cmdline == ["/bin/sleep", "6"]
    assert exec_.ppid == os.getpid()


@pytest.mark.root
@pytest.mark.self_contained
def test_the_ancestry_of_a_gpu_opener_below_a_flood_of_short_execs_is_complete(sensor):
    # The opener runs from a directory the filter does not look for (not /tmp), below two
    # forking shells: none of the three is sent up at its exec; all three are at the GPU open.
    place = Path(f"/run/gg-exec-filter-{os.getpid()}")
    place.mkdir()
    try:
        opener = place / "trainer"
        shutil.copy(build_workload(), opener)
        command, env = private_dev_command([str(opener), "open:/dev/nvidia0", "sleep:2000"])
        with own_cgroup() as (cgroup, _):
            flooder = flood(2000, 30, cgroup)
            try:
                poll_until(sensor, 1.0)
                # outer sh forks inner sh, which forks unshare -> sh -> trainer (one pid)
                shells = subprocess.Popen(
                    ["/bin/sh", "-c", OUTER, "outer", *command],
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
                events = poll_until(
                    sensor,
                    15,
                    lambda evs: any(isinstance(e, GpuOpen) and e.comm == "trainer" for e in evs),
                )
                shells.wait(30)  # the trainer exits after its sleep, then both shells
            finally:
                flooder.terminate()
                flooder.wait(30)
    finally:
        shutil.rmtree(place, ignore_errors=True)
    (opened,) = [e for e in events if isinstance(e, GpuOpen) and e.comm == "trainer"]
    execs = {e.pid: e for e in events if isinstance(e, Exec)}
    assert opened.pid in execs and execs[opened.pid].filename == str(opener)
    chain, pid = [], opened.pid
    while pid != shells.pid:
        assert pid in execs, f"ancestor {pid} of the GPU opener was never sent up: {chain}"
        chain.append(execs[pid].filename)
        pid = execs[pid].ppid
    assert chain == [str(opener), "/bin/sh"]
    assert shells.pid in execs and execs[shells.pid].ppid == os.getpid()
    order = [id(e) for e in events]
    for pid in (opened.pid, execs[opened.pid].ppid, shells.pid):
        assert order.index(id(execs[pid])) < order.index(id(opened))


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


@pytest.mark.root
@pytest.mark.self_contained
def test_an_exec_flood_does_not_blind_the_agent_to_a_miner_started_during_it(tmp_path):
    agent = AgentProcess(tmp_path, "--sensor", "ebpf")
    miner = None
    with own_cgroup() as (cgroup, cgroup_id):
        floods: list[subprocess.Popen] = []
        try:
            agent.wait_ready()
            floods = [flood(2500, 120, cgroup) for _ in range(2)]
            agent.wait_status(
                lambda d: (
                    d["counters"]["execs"].get("aggregated_by_cgroup", {}).get(str(cgroup_id), 0)
                    > 2000
                ),
                60,
            )
            # a miner known only by its command line, through a shell; it never connects
            argv = [sys.executable, "-c", "import time; time.sleep(120)", *MINER_ARGS]
            miner = subprocess.Popen(["/bin/sh", "-c", "exec " + " ".join(map(_quote, argv))])
            doc = agent.wait_status(
                lambda d: any(f["pid"] == miner.pid for f in d.get("last_findings", [])), 30
            )
            still_flooding = all(f.poll() is None for f in floods)
        finally:
            if miner is not None:
                miner.kill()
                miner.wait()
            for f in floods:
                f.terminate()
                f.wait(30)
            agent.stop()
    (finding,) = [f for f in doc["last_findings"] if f["pid"] == miner.pid]
    assert finding["verdict"] in ("suspicious", "malicious")
    assert still_flooding
    execs = doc["counters"]["execs"]
    assert execs["aggregated_by_cgroup"][str(cgroup_id)] > 2000  # the flood stayed in the kernel
    assert agent.proc.returncode == 0, agent.stderr()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_short_exec_of_a_name_the_rules_list_goes_up_at_once(sensor):
    """The sensor sees the whole host: a round in which its ring lost exec records (another
    test's flood beside this one) proves nothing either way, and is run again."""
    place = Path(f"/run/gg-exec-filter-{os.getpid()}")
    place.mkdir()
    try:
        named = place / "XMRig"  # the basename is matched lower-cased
        shutil.copy("/bin/true", named)
        plain = place / "plain"
        shutil.copy("/bin/true", plain)
        for _ in range(3):
            lost_before = sensor.stats.lost["exec"]
            for path in (plain, named):
                subprocess.run([str(path)], check=True)
            events = poll_until(
                sensor,
                10,
                lambda evs: any(isinstance(e, Exec) and e.filename == str(named) for e in evs),
            )
            events += poll_until(sensor, 1.0)
            if sensor.stats.lost["exec"] == lost_before:
                break
    finally:
        shutil.rmtree(place, ignore_errors=True)
    filenames = {e.filename for e in events if isinstance(e, Exec)}
    assert str(named) in filenames, sensor.stats.lost
    assert str(plain) not in filenames  # short-lived and unlisted: counted, not sent up


@pytest.mark.root
@pytest.mark.self_contained
def test_a_tmp_program_costs_nothing_at_its_first_or_later_short_starts_and_goes_up_when_it_lives(
    sensor,
):
    """A program run from /tmp is kept in the kernel like any other: neither its first start nor
    its later ones send a record (the 400th start of a CI runner's test binary does not redo the
    first's work, and a never-seen one costs no more); one that lives past the filter's age goes
    up with its command line, then its end."""
    directory = Path(tempfile.mkdtemp(prefix="gg-exec-filter-", dir="/tmp"))
    napper = directory / "napper"
    shutil.copy("/bin/sleep", napper)
    try:
        with own_cgroup() as (cgroup, cgroup_id):
            for _ in range(3):  # the first sight of this file, then two more
                subprocess.run(in_cgroup([str(napper), "0.05"], cgroup), check=True)
            lives = subprocess.Popen(in_cgroup([str(napper), "1.5"], cgroup))
            events = poll_until(
                sensor, 10, lambda evs: any(isinstance(e, Exit) and e.pid == lives.pid for e in evs)
            )
            lives.wait(10)
            sensor.exec_filter.read_counts()
            counted = sensor.exec_filter.aggregated.get(cgroup_id, 0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ours = [e for e in events if e.cgroup_id == cgroup_id]
    assert [(e.kind, e.pid) for e in ours] == [("exec", lives.pid), ("exit", lives.pid)]
    assert ours[0].filename == str(napper) and ours[0].cmdline == [str(napper), "1.5"]
    assert counted == 4  # each start was kept in the kernel first, the one that lived too


FORKER = """import os, time
child = os.fork()
if child:
    print(child, flush=True)
else:
    os.close(1)  # the caller reads its parent's output to the end
    time.sleep(1.5)
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_the_forks_of_a_pending_process_end_without_a_record_unless_they_live(sensor):
    """The subshells of ``sh -c 'a | b'`` (forks that never exec) end as silently as the shell;
    a fork of a short program that lives on goes up as its parent's exec would have, then its
    end."""
    with own_cgroup() as (cgroup, cgroup_id):
        for _ in range(5):
            pipeline = "echo a | tr a b | wc -c >/dev/null"
            subprocess.run(in_cgroup(["/bin/sh", "-c", pipeline], cgroup), check=True)
        argv = [sys.executable, "-c", FORKER]
        out = subprocess.run(in_cgroup(argv, cgroup), check=True, stdout=subprocess.PIPE, text=True)
        child = int(out.stdout)
        events = poll_until(
            sensor, 10, lambda evs: any(isinstance(e, Exit) and e.pid == child for e in evs)
        )
    ours = [e for e in events if e.cgroup_id == cgroup_id]
    assert [(e.kind, e.pid) for e in ours] == [("exec", child), ("exit", child)], [
        (e.kind, e.pid, e.comm) for e in ours
    ]
    assert ours[0].cmdline == argv  # its image and command line are its parent's


def test_the_kernel_hash_is_fnv1a_and_names_come_from_the_rules_lists():
    from gpuguard.agent.stages.s1_produce.exec_interest import exec_interest
    from gpuguard.detect.ruleset.reload import RuleSetHolder
    from gpuguard.sources.ebpf.exec_filter import interest_keys, name_hash

    assert name_hash(b"") == 0xCBF29CE484222325
    assert name_hash(b"a") == 0xAF63DC4C8601EC8C  # the published FNV-1a 64 test vector
    names = exec_interest(RuleSetHolder(None, log=lambda line: None).current)
    assert "xmrig" in names and "nbminer" in names
    assert not {"sh", "bash", "busybox"} & set(names)  # a flood of sh -c stays in the kernel
    assert not [n for n in names if "/" in n or "*" in n]  # temp_exec_paths' "/tmp/*" is no name
    assert interest_keys(["XMRig", "a/b", ""]) == {name_hash(b"xmrig")}  # as the probe hashes


@pytest.mark.root
@pytest.mark.self_contained
def test_the_kernel_counts_each_exec_it_keeps_pending(sensor):
    """The count the sensor's idle skip relies on moves with every exec written to the map."""
    filt = sensor.exec_filter
    before = filt._added()
    subprocess.run(["/bin/true"], check=True)  # short and unlisted: kept in the kernel
    assert filt._added() >= before + 1


@pytest.mark.root
@pytest.mark.self_contained
def test_a_sensor_asleep_on_an_empty_pending_map_is_woken_by_the_next_kept_exec(sensor):
    """Once a walk finds exec_pending empty the sensor arms ``exec_wake`` and its waits stop
    counting the exec filter's turns; the next exec the kernel keeps clears it and sends a
    wake-up record, and the exec goes up once it has lived the filter's age."""
    filt = sensor.exec_filter
    wake = filt.wake_map
    deadline = time.monotonic() + 20  # other jobs' short execs come and go: a turn finds none
    while not (filt.pending_watch.known_empty and wake[wake.Key(0)].value == 1):
        assert time.monotonic() < deadline, "no walk found the pending map empty"
        sensor.poll(50)
    assert not filt.may_hold_execs  # the filter's turns no longer shorten the sensor's waits
    woken = sensor.stats.wakes
    pid, execs = _sleeper_execs(sensor, "3", 3)
    assert sensor.stats.wakes > woken  # ours, or another job's kept exec: the kernel woke us
    assert [e.pid for e in execs] == [pid]


@pytest.mark.root
@pytest.mark.self_contained
def test_a_wake_just_after_an_empty_walk_still_has_the_exec_go_up_at_its_age(sensor):
    """The kernel's wake-up can come before the filter's next turn (a walk that found the map
    empty set it 0.25 s on).  The sensor must then wait for that turn, not for its other work:
    pushed 30 s off here, as a quiet host's drain is seconds off, a process living 2 s would
    end unseen."""
    filt = sensor.exec_filter
    wake = filt.wake_map
    deadline = time.monotonic() + 20
    while not (filt.pending_watch.known_empty and wake[wake.Key(0)].value == 1):
        assert time.monotonic() < deadline, "no walk found the pending map empty"
        sensor.poll(50)
    far = time.monotonic() + 30
    activity = sensor.activity
    saved = sensor._next_drain, sensor._next_sweep, activity._next if activity else None
    sensor._next_drain = sensor._next_sweep = far
    if activity is not None:
        activity._next = far
    filt._next_promote = time.monotonic() + 0.25  # as the walk that found it empty left it
    proc = subprocess.Popen(["/bin/sleep", "2"])
    try:
        started, seen = time.monotonic(), None
        while seen is None and time.monotonic() - started < 4:
            for event in sensor.poll(5000):  # the agent's long poll: the sensor shortens it
                if isinstance(event, Exec) and event.pid == proc.pid:
                    seen = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
        sensor._next_drain, sensor._next_sweep = saved[:2]
        if activity is not None:
            activity._next = saved[2]
    assert seen is not None and seen < 1.8, seen  # age 0.5 s, then a turn: not the 30 s


# The exec filter's maps alone, as the probes declare them, in a program with no probe: only
# this test writes them, so a busy host's execs cannot move the count under it.
PENDING_MAPS = """
#include "gpuguard.h"
BPF_HASH(exec_pending, __u32, struct gg_exec, 64);
BPF_TABLE("lru_hash", __u32, __u8, exec_interest, 64);
BPF_HASH(exec_names, __u64, __u8, 64);
BPF_HASH(exec_aggregated, __u64, __u64, 64);
BPF_ARRAY(exec_filter_counts, __u64, GG_EXECF_SLOTS);
BPF_ARRAY(exec_wake, __u32, 1);
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_the_pending_walk_is_skipped_only_while_nothing_can_be_pending():
    from bcc import BPF

    from gpuguard.events.abi import ExecFilterCount, probe_dir
    from gpuguard.sources.ebpf.exec_filter import ExecFilter

    bpf = BPF(text=PENDING_MAPS.encode(), cflags=[f"-I{probe_dir()}"])
    try:
        filt = ExecFilter(bpf, decode=lambda value: (value.hdr.tgid, value.filename))
        pending, counts = bpf[b"exec_pending"], bpf[b"exec_filter_counts"]
        added = counts.Key(ExecFilterCount.PENDING_ADDED)
        boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)

        def keep(tgid: int, age_s: float) -> None:  # what the exec probe does
            value = pending.Leaf()
            value.hdr.tgid, value.hdr.time_ns = tgid, boot_ns - int(age_s * 1e9)
            value.filename = f"/usr/bin/job{tgid}".encode()
            pending[pending.Key(tgid)] = value
            counts[added] = ct.c_uint64(counts[added].value + 1)

        assert filt.take_old() == [] and filt.pending_watch.skipped == 0  # the first turn walks
        assert filt.take_old() == [] and filt.pending_watch.skipped == 1  # empty, count still
        keep(101, age_s=5.0)
        assert filt.take_old() == [(101, b"/usr/bin/job101")]  # the count moved: walked
        keep(102, age_s=0.0)  # young: stays pending after the next walk
        assert filt.take_old() == [] and filt.pending_watch.skipped == 1
        pending[pending.Key(102)] = _aged(pending[pending.Key(102)], 5.0)  # no count change
        assert filt.take_old() == [(102, b"/usr/bin/job102")]  # walked: the last one left some
        assert filt.take_old() == [] and filt.pending_watch.skipped == 2
        keep(103, age_s=5.0)
        filt.take(103)  # taken as an ancestor between two turns: the map is empty again
        assert (
            filt.take_old() == [] and filt.pending_watch.skipped == 2
        )  # but the count moved: walked
        assert filt.take_old() == [] and filt.pending_watch.skipped == 3
        # the kernel's wake-up (an exec kept into the empty map): the next look is when that
        # exec comes of age, not before (everything in the map is younger than it)
        from gpuguard.sources.ebpf.exec_filter import PROMOTE_AGE_S

        assert not filt.may_hold_execs
        woken_at = time.monotonic()
        filt.woken()
        assert filt.may_hold_execs
        assert woken_at + PROMOTE_AGE_S <= filt.next_turn <= time.monotonic() + PROMOTE_AGE_S
    finally:
        bpf.cleanup()


def _aged(value, age_s: float):
    value.hdr.time_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - int(age_s * 1e9)
    return value


@pytest.mark.root
@pytest.mark.self_contained
def test_a_long_poll_ends_when_the_sensors_periodic_work_falls_due(sensor):
    """The agent polls with a long timeout; the sensor shortens it to its next job, so a
    quiet host wakes it seldom yet a kept exec that lives still goes up about as soon."""
    sensor.request_watch(os.getpid())
    assert sensor.wait_ms(5000) == 0  # a request from another thread: carried out at once
    sensor.poll(0)
    soon = time.monotonic() + 0.3
    sensor._next_drain = min(sensor._next_drain, soon)
    assert sensor.wait_ms(5000) <= 301
    proc = subprocess.Popen(["/bin/sleep", "8"])  # plain: kept in the kernel, then promoted
    try:
        started = time.monotonic()
        seen = None
        while seen is None and time.monotonic() - started < 6:
            for event in sensor.poll(5000):
                if isinstance(event, Exec) and event.pid == proc.pid:
                    seen = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert seen is not None and seen < 3.0  # age 0.5 s, then the next 0.25 s turn, not 5 s


@pytest.mark.root
@pytest.mark.self_contained
def test_a_wait_for_records_ends_when_another_thread_wakes_the_sensor(sensor):
    """A stop or a request from another thread ends the sensor's wait at once (its eventfd),
    so an idle sensor may wait for its next periodic job without a short timer."""
    ring_wait = sensor._ring_wait
    assert ring_wait is not None  # ring buffers and libbpf's epoll fd, as on this kernel
    woken = ring_wait.interruptions
    threading.Timer(0.2, sensor.wake).start()
    deadline = time.monotonic() + 10
    while ring_wait.interruptions == woken and time.monotonic() < deadline:
        sensor.poll(3000)  # other jobs' records may end a wait first: wait again
    assert ring_wait.interruptions == woken + 1
