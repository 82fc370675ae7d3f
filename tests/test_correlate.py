"""The correlator: keys, pid reuse, live facts, scan-style feeds, bounds, expiry, inheritance."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import Connect, Exec, Exit, GpuIoctl, GpuOpen, Lost, NetPayload
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from gpuguard.sources.proc.config_files import attach_config_files
from gpuguard.sources.proc.process import collect_process_facts

T = 1_700_000_000.0


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def facts(pid, start, comm="app", exe="/usr/bin/app", **kw):
    return ProcessFacts(
        pid=pid, start_time=start, comm=comm, exe=exe, cmdline=kw.pop("cmdline", [exe]), **kw
    )


def test_pid_reuse_never_merges():
    c = Correlator(facts_provider=None)
    c.feed(facts(10, T, comm="first"))
    c.feed(Connect(time=T + 1, pid=10, address="1.1.1.1", port=3333))
    c.feed(Exit(time=T + 2, pid=10))
    c.feed(facts(10, T + 5, comm="second"))
    c.feed(Connect(time=T + 6, pid=10, address="2.2.2.2", port=80))
    states = list(c.states())
    assert [s.key for s in states] == [ProcessKey(10, T), ProcessKey(10, T + 5)]
    assert [(s.comm, dict(s.connections)) for s in states] == [
        ("first", {("1.1.1.1", 3333): 1}),
        ("second", {("2.2.2.2", 80): 1}),
    ]
    assert states[0].exited_at == T + 2 and states[1].exited_at is None


def test_pid_reuse_without_exit_event_closes_the_old_process():
    c = Correlator(facts_provider=None)
    c.feed(facts(10, T))
    c.feed(facts(10, T + 100))
    old, new = c.states()
    assert old.exited_at == T + 100 and new.exited_at is None
    assert c.state_of(10) is new


def test_events_before_facts_are_rekeyed_to_the_same_process():
    c = Correlator(facts_provider=None)
    c.feed(
        GpuOpen(time=T + 0.5, pid=20, comm="x", path="/dev/nvidia-uvm", device_class="nvidia-uvm")
    )
    (provisional,) = c.states()
    assert provisional.provisional and provisional.key == ProcessKey(20, T + 0.5)
    c.feed(facts(20, T, comm="x"))
    (state,) = c.states()
    assert state is provisional and state.key == ProcessKey(20, T) and not state.provisional
    assert state.gpu_device_classes == {"nvidia-uvm"}


def test_live_facts_provider_with_a_real_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        c = Correlator(facts_provider=collect_process_facts, config_reader=attach_config_files)
        c.feed(Connect(time=T, pid=child.pid, address="127.0.0.1", port=9))
        state = c.state_of(child.pid)
        assert not state.provisional
        assert state.facts.exe == os.path.realpath(sys.executable)
        assert state.key.start_time == state.facts.start_time > 0
        assert state.facts.ancestors[0].pid == os.getpid()
        assert state.facts.config_files == {}  # read, but no config beside it
    finally:
        child.kill()
        child.wait()


def test_the_correlator_reads_nothing_unless_given_its_readers(tmp_path):
    """No /proc reader by default: a process it meets is provisional until facts come in."""
    (tmp_path / "config.json").write_text('{"pools": [{"url": "pool.example:3333"}]}')
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path)
    try:
        alone = Correlator()
        alone.feed(Connect(time=T, pid=child.pid, address="127.0.0.1", port=9))
        state = alone.state_of(child.pid)
        assert state.provisional and state.facts is None
        facts_only = Correlator(facts_provider=collect_process_facts)
        facts_only.feed(Connect(time=T, pid=child.pid, address="127.0.0.1", port=9))
        assert facts_only.state_of(child.pid).facts.config_files == {}  # not read: no reader
        both = Correlator(facts_provider=collect_process_facts, config_reader=attach_config_files)
        both.feed(Connect(time=T, pid=child.pid, address="127.0.0.1", port=9))
        assert list(both.state_of(child.pid).facts.config_files) == ["config.json"]
    finally:
        child.kill()
        child.wait()


def test_live_reads_config_files_in_cwd(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"pools": [{"url": "pool.supportxmr.com:3333"}], "donate-level": 1}'
    )
    os.mkfifo(tmp_path / "config.ini")  # a FIFO must never be opened (it would block)
    (tmp_path / "cfg.json").symlink_to("/etc/shadow")  # nor a symlink
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "-c", "cfg.json"], cwd=tmp_path
    )
    try:
        c = Correlator(facts_provider=collect_process_facts, config_reader=attach_config_files)
        c.feed(GpuOpen(time=T, pid=child.pid, path="/dev/nvidia0", device_class="nvidia"))
        assert list(c.state_of(child.pid).facts.config_files) == ["config.json"]
    finally:
        child.kill()
        child.wait()


def test_scan_style_feed_without_kernel_events(ruleset):
    """What `gpuguard scan` feeds: facts, synthesized opens/connects, a GPU snapshot."""
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(
        facts(
            30,
            T,
            comm="xmrig",
            exe="/tmp/xmrig",
            cmdline=["/tmp/xmrig", "-o", "stratum+tcp://pool.minexmr.com:4444"],
        )
    )
    c.feed(GpuOpen(time=T + 60, pid=30, path="/dev/nvidia-uvm", device_class="nvidia-uvm"))
    c.feed(Connect(time=T + 60, pid=30, address="5.6.7.8", port=4444))
    c.feed(
        GpuSnapshot(
            time=T + 60,
            source="nvml",
            devices=[DeviceSample("nvidia", 0, memory_total=16 << 30)],
            processes=[ProcessGpuUsage(30, "nvidia", 0, sm_util=97.0, used_memory=2 << 30)],
        )
    )
    (verdict,) = engine.verdicts(T + 60)
    assert verdict.verdict == "malicious"
    assert {
        "miner-binary-name",
        "miner-cmdline-stratum",
        "miner-cmdline-pool-domain",
        "net-pool-port",
        "net-connected-to-configured-pool",
        "exe-in-temp-dir",
        "gpu-compute-from-temp-dir",
    } <= {e.rule_id for e in verdict.evidence}


def test_snapshot_aggregates_devices_and_memory_total():
    c = Correlator(facts_provider=None)
    c.feed(facts(40, T))
    c.feed(
        GpuSnapshot(
            time=T + 1,
            source="nvml",
            devices=[
                DeviceSample("nvidia", 0, memory_total=80 << 30),
                DeviceSample("nvidia", 1, memory_total=80 << 30),
            ],
            processes=[
                ProcessGpuUsage(40, "nvidia", 0, sm_util=90.0, used_memory=10 << 30),
                ProcessGpuUsage(40, "nvidia", 1, sm_util=70.0, used_memory=30 << 30),
                ProcessGpuUsage(40, "nvidia", 1, sm_util=None, used_memory=None),
            ],
        )
    )
    s = c.state_of(40)
    assert (s.gpu_util.latest, s.gpu_memory.latest, s.gpu_memory_total) == (
        90.0,
        float(40 << 30),
        160 << 30,
    )


def test_ioctls_are_named_and_categorised_from_the_command_number():
    c = Correlator(facts_provider=None)
    c.feed(facts(50, T))
    c.feed(GpuIoctl(time=T + 1, pid=50, device_class="nvidia-uvm", command=27, count=4))
    c.feed(GpuIoctl(time=T + 2, pid=50, device_class="nvidia-ctl", command=0xC020462A, count=10))
    c.feed(
        GpuIoctl(
            time=T + 3,
            pid=50,
            device_class="nvidia-ctl",
            command=0xC020462A,
            command_name="NV_ESC_RM_CONTROL",
            count=1,
        )
    )
    s = c.state_of(50)
    assert s.ioctl_counts == {"UVM_REGISTER_CHANNEL": 4, "NV_ESC_RM_CONTROL": 11}
    assert s.ioctl_categories == {"submit", "query"} and s.ioctl_total == 15
    assert s.gpu_device_classes == {"nvidia-uvm", "nvidia-ctl"}


def test_exec_updates_identity_and_payloads_are_bounded():
    c = Correlator(facts_provider=None)
    c.feed(facts(60, T, comm="sh", exe="/usr/bin/dash"))
    c.feed(
        Exec(
            time=T + 1,
            pid=60,
            comm="xmrig",
            filename="/tmp/xmrig",
            ppid=1,
            cmdline=["/tmp/xmrig", "-o", "a.b:3333"],
        )
    )
    for i in range(40):
        c.feed(
            NetPayload(
                time=T + 2 + i,
                pid=60,
                fd=i,
                protocol="stratum",
                detail={"method": "mining.submit", "id": i},
            )
        )
        c.feed(
            NetPayload(
                time=T + 2 + i,
                pid=60,
                fd=i,
                protocol="stratum",
                detail={"method": "mining.subscribe"},
            )
        )
    s = c.state_of(60)
    assert (s.comm, s.exe, s.cmdline[0], s.ppid) == ("xmrig", "/tmp/xmrig", "/tmp/xmrig", 1)
    assert len(s.payloads) == 16 and s.payload_protocols == {"stratum"}
    assert (
        sum(p.detail == {"method": "mining.subscribe"} for p in s.payloads) == 1
    )  # repeats are kept once


def test_a_process_first_seen_at_its_exec_reads_proc_once():
    """The facts read when the state is created already describe the new image: no second read,
    no second enrichment (YARA); a later exec of the same process reads them again."""
    images = {
        70: [
            facts(
                70,
                T,
                comm="xmrig",
                exe="/tmp/xmrig",
                ppid=9,
                cmdline=["/tmp/xmrig", "-o", "p:3333"],
            ),
            facts(70, T, comm="kworker", exe="/tmp/kworker", ppid=9, cmdline=["/tmp/kworker"]),
        ]
    }
    reads: list[int] = []
    enriched: list[str] = []

    def provider(pid):
        reads.append(pid)
        return images[pid][0]

    c = Correlator(
        facts_provider=provider,
        on_new_facts=lambda state, f: enriched.append(f.exe),
    )
    c.feed(
        Exec(
            time=T + 0.01,
            pid=70,
            comm="xmrig",
            filename="/tmp/xmrig",
            ppid=9,
            cmdline=["/tmp/xmrig"],
        )
    )
    s = c.state_of(70)
    assert reads == [70] and enriched == ["/tmp/xmrig"]
    # /proc's facts win over the event's (a full command line, not the probe's truncated one)
    assert (s.comm, s.exe, s.cmdline, s.ppid, s.key.start_time) == (
        "xmrig",
        "/tmp/xmrig",
        ["/tmp/xmrig", "-o", "p:3333"],
        9,
        T,
    )
    assert s.dirty and not s.provisional
    images[70].pop(0)  # it execs again: a new image, read again
    c.feed(
        Exec(
            time=T + 5,
            pid=70,
            comm="kworker",
            filename="/tmp/kworker",
            ppid=9,
            cmdline=["/tmp/kworker"],
        )
    )
    assert reads == [70, 70] and enriched == ["/tmp/xmrig", "/tmp/kworker"]
    assert (s.comm, s.exe) == ("kworker", "/tmp/kworker")


def test_a_process_first_seen_at_its_exec_keeps_the_events_identity_where_proc_is_silent():
    c = Correlator(facts_provider=lambda pid: facts(71, T, comm="", exe="", cmdline=[]))
    c.feed(
        Exec(
            time=T + 0.01,
            pid=71,
            comm="miner",
            filename="/tmp/miner",
            ppid=4,
            cmdline=["/tmp/miner", "-t"],
        )
    )
    s = c.state_of(71)
    assert (s.comm, s.exe, s.cmdline, s.ppid) == ("miner", "/tmp/miner", ["/tmp/miner", "-t"], 4)


def test_only_changes_mark_a_process_for_rescoring(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(62, T))
    c.feed(Connect(time=T + 1, pid=62, address="1.1.1.1", port=443))
    c.feed(GpuIoctl(time=T + 1, pid=62, device_class="nvidia-ctl", command=0xC020462A, count=3))
    c.feed(GpuOpen(time=T + 1, pid=62, path="/dev/nvidiactl", device_class="nvidia-ctl"))
    assert len(engine.score(T + 1)) == 1
    c.feed(Connect(time=T + 2, pid=62, address="1.1.1.1", port=443))  # a repeat
    c.feed(GpuIoctl(time=T + 2, pid=62, device_class="nvidia-ctl", command=0xC020462A, count=3))
    c.feed(GpuOpen(time=T + 2, pid=62, path="/dev/nvidiactl", device_class="nvidia-ctl"))
    assert engine.score(T + 2) == [] and c.state_of(62).connect_total == 2

    def usage(t):
        return GpuSnapshot(
            time=t, source="nvml", processes=[ProcessGpuUsage(62, "nvidia", 0, sm_util=50.0)]
        )

    c.feed(usage(T + 3))
    assert len(engine.score(T + 3)) == 1  # first GPU sample
    c.feed(usage(T + 4))
    assert engine.score(T + 4) == []  # within 10 s
    c.feed(usage(T + 13))
    assert len(engine.score(T + 13)) == 1
    assert len(engine.score(T + 14, everything=True)) == 1


def test_counts_mark_dirty_when_a_rule_reads_them(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "version: 1\nrules:\n  - id: busy\n    description: many connects\n    severity: low\n"
        "    weight: 50\n    condition: {signal: connect_count, gte: 3}\n"
    )
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, load_ruleset([path]))
    c.feed(facts(63, T))
    for i in range(3):
        c.feed(Connect(time=T + i, pid=63, address="1.1.1.1", port=443))
    (v,) = engine.score(T + 3)
    assert v.score == 50


def test_connection_table_is_bounded():
    c = Correlator(facts_provider=None)
    c.feed(facts(61, T))
    for port in range(1000):
        c.feed(Connect(time=T + 1, pid=61, address="1.1.1.1", port=port))
    s = c.state_of(61)
    assert len(s.connections) == 64 and s.connect_total == 1000


def test_max_processes_evicts_least_recently_active():
    c = Correlator(facts_provider=None, max_processes=3)
    for pid in (1, 2, 3):
        c.feed(facts(pid, T + pid))
    c.feed(Connect(time=T + 10, pid=1, address="1.1.1.1", port=1))  # 1 becomes recent
    c.feed(facts(4, T + 4))
    assert sorted(s.pid for s in c.states()) == [1, 3, 4]
    assert c.counters["evicted"] == 1


def test_expire_exited_and_idle():
    c = Correlator(facts_provider=None, idle_expiry_s=100, exit_grace_s=10)
    c.feed(facts(1, T))
    c.feed(facts(2, T))
    c.feed(Connect(time=T + 50, pid=2, address="1.1.1.1", port=1))
    c.feed(facts(3, T))
    c.feed(Exit(time=T + 60, pid=3))
    c.expire(T + 65)
    assert sorted(s.pid for s in c.states()) == [1, 2, 3]
    c.expire(T + 71)
    assert sorted(s.pid for s in c.states()) == [1, 2]
    c.expire(T + 101)
    assert sorted(s.pid for s in c.states()) == [2]
    assert c.counters["expired"] == 2


def test_a_clean_exited_process_is_forgotten_early_and_one_worth_keeping_stays_for_the_grace(
    ruleset,
):
    c = Correlator(facts_provider=None, exit_grace_s=30, clean_exit_grace_s=2)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(10, T))  # clean, nothing observed
    c.feed(facts(11, T, comm="xmrig", exe="/usr/bin/xmrig"))  # evidence: a miner's name
    c.feed(facts(12, T))  # clean, but a tracked child
    c.feed(facts(13, T + 1, comm="helper", exe="/usr/bin/helper", ppid=12))
    c.feed(facts(14, T))  # clean, used a GPU
    c.feed(GpuOpen(time=T + 1, pid=14, path="/dev/nvidia0", device_class="nvidia"))
    c.feed(facts(15, T))  # clean, connected somewhere
    c.feed(Connect(time=T + 1, pid=15, address="10.0.0.1", port=443))
    c.feed(facts(16, T))  # clean, exits but is not scored again
    verdicts = {v.pid: v for v in engine.score(T + 2)}
    assert verdicts[10].score == 0 and not verdicts[10].evidence and verdicts[11].score > 0
    assert c.get(ProcessKey(13, T + 1)).parent_key == ProcessKey(12, T)
    for pid in (10, 11, 12, 14, 15):
        c.feed(Exit(time=T + 10, pid=pid))
    engine.score(T + 10)
    c.feed(Exit(time=T + 10, pid=16))  # dirty: its last change is not scored
    c.expire(T + 11)  # within the short grace: all kept
    assert sorted(s.pid for s in c.states()) == [10, 11, 12, 13, 14, 15, 16]
    c.expire(T + 13)
    assert sorted(s.pid for s in c.states()) == [11, 12, 13, 14, 15, 16]
    assert {v.pid: v.score for v in engine.score(T + 13)} == {16: 0}
    c.expire(T + 13)  # 16 is now scored clean: forgotten
    assert sorted(s.pid for s in c.states()) == [11, 12, 13, 14, 15]
    c.expire(T + 41)  # the full grace: all exited ones go
    assert sorted(s.pid for s in c.states()) == [13]
    assert c.counters["expired"] == 6


def test_clean_exits_are_forgotten_as_later_exits_arrive_without_waiting_for_expire(ruleset):
    c = Correlator(facts_provider=None, exit_grace_s=30, clean_exit_grace_s=2)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(20, T))
    c.feed(facts(21, T, comm="xmrig", exe="/usr/bin/xmrig"))
    c.feed(facts(22, T))
    engine.score(T)
    c.feed(Exit(time=T + 1, pid=20))
    c.feed(Exit(time=T + 1, pid=21))
    engine.score(T + 1)
    c.feed(Exit(time=T + 2.5, pid=22))  # 1.5 s after the first exits: all kept
    assert sorted(s.pid for s in c.states()) == [20, 21, 22]
    c.feed(facts(23, T + 3))
    c.feed(Exit(time=T + 3.5, pid=23))  # the next sweep: 20 is forgotten, 21 has evidence
    assert sorted(s.pid for s in c.states()) == [21, 22, 23]
    assert c.counters["expired"] == 1


def test_lost_events_are_counted():
    c = Correlator(facts_provider=None)
    c.feed(facts(70, T))
    c.feed(Lost(time=T + 1, pid=70, what="payload", count=5))
    assert c.counters["lost_events"] == 5 and c.state_of(70).lost_events == 5


def test_children_inherit_a_parents_verdict(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    miner_cmd = ["/tmp/xmrig", "-o", "stratum+tcp://pool.supportxmr.com:3333", "--donate-level=1"]
    c.feed(facts(80, T, comm="xmrig", exe="/tmp/xmrig", cmdline=miner_cmd))
    c.feed(
        facts(
            81,
            T + 1,
            comm="helper",
            exe="/usr/bin/helper",
            ppid=80,
            ancestors=[Ancestor(80, "xmrig", "/tmp/xmrig")],
        )
    )
    verdicts = {v.pid: v for v in engine.score(T + 2)}
    assert verdicts[80].verdict == "malicious"
    child = verdicts[81]
    assert [e.rule_id for e in child.evidence] == ["ancestry-suspicious-parent"]
    assert child.evidence[0].detail == "parent_verdict=malicious (in list suspicious_verdicts)"
    assert child.score == 20 and child.verdict == "clean"


def test_child_seen_before_parent_is_rescored_when_the_parent_turns_bad(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(91, T + 1, comm="helper", exe="/usr/bin/helper", ppid=90))
    c.feed(facts(90, T, comm="app", exe="/usr/bin/app"))
    assert {v.pid: v.score for v in engine.score(T + 2)} == {90: 0, 91: 0}
    assert engine.score(T + 3) == []  # nothing changed: nothing rescored
    c.feed(
        NetPayload(time=T + 4, pid=90, protocol="stratum", detail={"method": "mining.subscribe"})
    )
    c.feed(NetPayload(time=T + 4, pid=90, protocol="cryptonote", detail={"agent": "XMRig/6.21.0"}))
    rescored = {v.pid: v for v in engine.score(T + 5)}
    assert rescored[90].verdict == "malicious"
    assert rescored[91].score == 20  # re-dirtied by the parent's change


def test_set_ruleset_rescores_everything(ruleset, tmp_path):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(95, T, comm="xmrig", exe="/usr/bin/xmrig"))
    assert engine.score(T)[0].score == 35
    site = tmp_path / "site.yaml"
    site.write_text("version: 1\nrules:\n  - id: miner-binary-name\n    override: {weight: 80}\n")
    engine.set_ruleset(load_ruleset([shipped_rules_file(), site]))
    (v,) = engine.score(T)
    assert (v.score, v.verdict) == (80, "malicious")


def test_set_ruleset_rejudges_the_living_never_the_ended(ruleset, tmp_path):
    """A reload rescores the processes that live; one that ended and was judged since is not
    judged again (a reload must not re-report history), one that ended unjudged still is."""
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    for pid in (96, 97):
        c.feed(facts(pid, T, comm="xmrig", exe="/usr/bin/xmrig"))
    c.feed(facts(98, T + 1, comm="helper", exe="/usr/bin/helper", ppid=97))
    assert {v.pid for v in engine.score(T + 1)} == {96, 97, 98}
    c.feed(Exit(time=T + 2, pid=96, exit_code=0))
    c.feed(Exit(time=T + 2, pid=98, exit_code=0))
    assert {v.pid for v in engine.score(T + 2)} == {96, 98}  # judged once more, at their end
    c.feed(facts(99, T + 3, comm="xmrig", exe="/usr/bin/xmrig"))
    c.feed(Exit(time=T + 3, pid=99, exit_code=0))  # ends before its first judgment
    site = tmp_path / "site.yaml"
    site.write_text("version: 1\nrules:\n  - id: miner-binary-name\n    override: {weight: 80}\n")
    engine.set_ruleset(load_ruleset([shipped_rules_file(), site]))
    rescored = {v.pid: v for v in engine.score(T + 4)}
    # 97 lives (and turns malicious); 96 and 98 (its child, whose parent changed) ended judged
    assert set(rescored) == {97, 99} and rescored[97].verdict == "malicious"
    engine.set_ruleset(load_ruleset([shipped_rules_file()]))
    assert {v.pid for v in engine.score(T + 5)} == {97}


def test_unknown_items_are_counted_not_fatal():
    c = Correlator(facts_provider=None)
    c.feed("not an item")  # type: ignore[arg-type]
    assert c.counters["ignored"] == 1 and len(c) == 0


def test_score_needs_a_ruleset():
    with pytest.raises(ValueError):
        DetectionEngine(Correlator(facts_provider=None), None).score(T)


def test_facts_of_an_old_process_count_as_seen_now():
    c = Correlator(facts_provider=None, idle_expiry_s=100)
    c.feed(Connect(time=T + 10_000, pid=1, address="1.1.1.1", port=1))  # the clock is now T + 10000
    c.feed(facts(2, T))  # started long ago, seen now
    c.expire(T + 10_050)
    assert 2 in [s.pid for s in c.states()]


def test_eviction_under_a_fork_flood_is_batched():
    c = Correlator(facts_provider=None, max_processes=100)
    for pid in range(1, 1001):
        c.feed(facts(pid, T + pid))
    assert len(c) <= 100 and c.state_of(1000) is not None
    assert c.counters["evicted"] == 900


def test_decoy_connections_and_payloads_do_not_hide_the_pool(ruleset):
    """The bounded tables (64 endpoints, 16 payloads) fill up; what comes after still counts."""
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(77, T))
    for i in range(200):
        c.feed(
            Connect(
                time=T + 1, pid=77, family="ipv4", address=f"10.1.{i // 250}.{i % 250}", port=443
            )
        )
        c.feed(
            NetPayload(
                time=T + 1, pid=77, fd=5, protocol="tls", detail={"sni": f"cdn{i}.example.com"}
            )
        )
    engine.score(T + 1)
    c.feed(Connect(time=T + 2, pid=77, family="ipv4", address="198.51.100.7", port=3333))
    c.feed(
        NetPayload(
            time=T + 2,
            pid=77,
            fd=6,
            protocol="cryptonote",
            detail={"method": "login", "login": "4" + "A" * 94, "agent": "XMRig/6.21.0"},
        )
    )
    state = c.state_of(77)
    assert len(state.connections) == 64 and len(state.payloads) == 16  # the tables stay bounded
    assert state.dirty
    (verdict,) = engine.score(T + 2)
    rules = {e.rule_id for e in verdict.evidence}
    assert {"net-pool-port", "net-miner-agent", "net-wallet-login"} <= rules, rules
