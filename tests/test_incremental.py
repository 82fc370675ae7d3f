"""Incremental scoring equals scoring from scratch.

The correlator rescores a process only for additions some rule reads, and
``score_process`` keeps rule outcomes on the state until what they read
changes.  These tests check both shortcuts against a full evaluation: a
random stream of events is fed, and after every rescoring pass each
process's current verdict must equal a from-scratch evaluation of its state.
"""

from __future__ import annotations

import copy
import random

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.state import (
    NEW_ADDRESS,
    NEW_DEVICE_CLASS,
    NEW_GPU_PATH,
    NEW_IOCTL_CATEGORY,
    NEW_IOCTL_NAME,
    NEW_PAYLOAD,
    NEW_PORT,
    ProcessKey,
    ProcessState,
)
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.scoring.score import score_process
from gpuguard.detect.signals import memo
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.rescore import (
    COUNT_SIGNALS,
    DEVICES,
    GPU_CHECK_EVERY_S,
    GPU_SAMPLE_SIGNALS,
    NETWORK,
    SIGNALS_READING,
    signal_kind,
)
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import Connect, Exec, GpuIoctl, GpuOpen, NetPayload
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from tests.support.memo import set_aside

HOUR = 1_700_002_800.0  # the start of an hour: hour_of_day stays the same for the whole stream
TIME_SIGNALS = frozenset(name for name, s in SIGNALS.items() if s.group == "time")

# Rules that read what the shipped ones do not (addresses, paths, ioctl names, counts), so the
# correlator must rescore for those additions too.
SITE_RULES = """\
version: 1
rules:
  - id: site-address
    description: connected to the lab network
    severity: low
    weight: 5
    condition: {signal: connect_addresses, cidr_in_list: lab_networks}
  - id: site-path
    description: opened the second GPU
    severity: low
    weight: 5
    condition: {signal: gpu_paths, contains: /dev/nvidia1}
  - id: site-ioctl-name
    description: registered a UVM channel
    severity: low
    weight: 5
    condition: {signal: ioctl_names, contains: UVM_REGISTER_CHANNEL}
  - id: site-many-connects
    description: many connects
    severity: low
    weight: 5
    condition: {signal: connect_count, gte: 6}
  - id: site-busy-channel
    description: registers UVM channels often
    severity: low
    weight: 5
    condition: {signal: ioctl_command_rate, command: UVM_REGISTER_CHANNEL, gte: 0.2}
lists:
  lab_networks: [10.9.0.0/16]
"""

IOCTLS = [
    ("nvidia-ctl", 0xC020462A),
    ("nvidia-ctl", 0xC030462B),
    ("nvidia-uvm", 27),
    ("nvidia-uvm", 33),
    ("kfd", 0xC0584B02),
    ("drm-render", 0xC0186444),
]
DEVICE_NODES = [
    ("/dev/nvidia0", "nvidia"),
    ("/dev/nvidia1", "nvidia"),
    ("/dev/nvidiactl", "nvidia-ctl"),
    ("/dev/nvidia-uvm", "nvidia-uvm"),
    ("/dev/kfd", "kfd"),
    ("/dev/mem", "mem"),
]
PAYLOADS = [
    ("stratum", {"method": "mining.subscribe", "agent": "xmrig/6.21"}),
    ("tls", {"sni": "huggingface.co"}),
    ("tls", {"sni": "gulf.moneroocean.stream"}),
    ("socks5", {"target_host": "pool.supportxmr.com", "target_port": 3333}),
    ("cryptonote", {"method": "login", "login": "4" + "A" * 94, "agent": "XMRig/6.21"}),
]


def facts(pid: int, miner: bool) -> ProcessFacts:
    cmdline = (
        ["./x", "-o", "stratum+tcp://pool.supportxmr.com:3333", "--donate-level=1"]
        if miner
        else ["python3", "train.py", "--epochs", "3"]
    )
    return ProcessFacts(
        pid=pid,
        start_time=HOUR,
        comm="kworker/0:1" if miner else "python3",
        exe="/dev/shm/.x" if miner else "/usr/bin/python3.11",
        cmdline=cmdline,
        uid=1000,
        username="bob",
        exe_deleted=miner,
        environ_readable=True,
        ancestors=[Ancestor(900, "bash", "/usr/bin/bash")],
    )


def random_event(rng: random.Random, pid: int, t: float):
    roll = rng.random()
    if roll < 0.35:
        dc, cmd = rng.choice(IOCTLS)
        return GpuIoctl(time=t, pid=pid, device_class=dc, command=cmd, count=rng.randint(1, 9))
    if roll < 0.6:
        return Connect(
            time=t,
            pid=pid,
            family="ipv4",
            address=rng.choice(["10.9.1.1", "10.0.0.2", "1.2.3.4", "5.6.7.8"]),
            port=rng.choice([443, 3333, 6379, 14444, 29500]),
        )
    if roll < 0.8:
        path, dc = rng.choice(DEVICE_NODES)
        return GpuOpen(time=t, pid=pid, path=path, device_class=dc, fd=5)
    if roll < 0.95:
        protocol, detail = rng.choice(PAYLOADS)
        return NetPayload(time=t, pid=pid, fd=7, protocol=protocol, detail=dict(detail))
    miner = rng.random() < 0.5
    f = facts(pid, miner)
    return Exec(time=t, pid=pid, comm=f.comm, filename=f.exe, cmdline=f.cmdline)


def from_scratch(state: ProcessState, ruleset, now: float):
    with set_aside(state):
        return score_process(state, ruleset, now)


def essence(verdict, ruleset):
    """What a verdict says: score, verdict, the rules matched; and the evidence text of rules that
    read no GPU window (a GPU sample that changes no rule's answer does not rescore, so those
    rules' evidence quotes the figures of the last scoring: gpuguard.detect.scoring.engine)."""
    gpu_rules = {rule.id for rule in ruleset.rules if set(rule.signals) & GPU_SAMPLE_SIGNALS}
    return (
        verdict.score,
        verdict.verdict,
        [
            (e.rule_id, e.weight, None if e.rule_id in gpu_rules else e.detail)
            for e in verdict.evidence
        ],
    )


@pytest.fixture(params=["shipped", "shipped+site"])
def ruleset(request, tmp_path):
    paths = [shipped_rules_file()]
    if request.param == "shipped+site":
        site = tmp_path / "site.yaml"
        site.write_text(SITE_RULES)
        paths.append(site)
    return load_ruleset(paths)


@pytest.mark.parametrize("seed", range(4))
def test_incremental_verdicts_equal_full_evaluation(ruleset, seed):
    rng = random.Random(seed)
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    pids = list(range(100, 120))
    for pid in pids:
        c.feed(facts(pid, miner=pid % 4 == 0))
    t = HOUR
    checked = rescored = pending = 0
    for step in range(1500):
        t += 0.5
        c.feed(random_event(rng, rng.choice(pids), t))
        if (
            step % 20 == 0
        ):  # GPU samples every 10 s: rescored when a rule's GPU test answers differently
            c.feed(
                GpuSnapshot(
                    time=t,
                    source="test",
                    devices=[DeviceSample("nvidia", 0, memory_total=80 << 30)],
                    processes=[
                        ProcessGpuUsage(
                            pid=p,
                            vendor="nvidia",
                            device_index=0,
                            sm_util=rng.choice([20.0, 97.0, 97.5]),
                            used_memory=rng.choice([1, 70]) << 30,
                        )
                        for p in pids[:8]
                    ],
                )
            )
        if step % 7 == 0:
            rescored += len(engine.score(t))
            for state in c.states():
                if state in c.gpu_moved:
                    # Its new GPU samples wait for the engine's next look (bounded delay): the
                    # last look, or scoring, was less than GPU_CHECK_EVERY_S ago.
                    assert t - memo.entries_of(state)["gpu-answers"][1][1] < GPU_CHECK_EVERY_S
                    pending += 1
                    continue
                # At the verdict's own time: rates and windows are functions of the clock.
                full = from_scratch(state, ruleset, state.verdict.time)
                assert essence(state.verdict, ruleset) == essence(full, ruleset), (
                    seed,
                    step,
                    state.key,
                )
                checked += 1
    assert t - HOUR < 3600 and checked > 4000 and rescored > 200 and pending > 20


def test_rescoring_is_skipped_only_for_additions_no_rule_reads(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(facts(7, miner=False))
    engine.score(HOUR)
    c.feed(Connect(time=HOUR + 1, pid=7, family="ipv4", address="1.1.1.1", port=443))
    engine.score(HOUR + 1)
    c.feed(
        Connect(time=HOUR + 2, pid=7, family="ipv4", address="10.9.0.1", port=443)
    )  # a new address only
    reads_addresses = "connect_addresses" in ruleset.signals_used
    assert c.state_of(7).dirty is reads_addresses
    assert [v.pid for v in engine.score(HOUR + 2)] == ([7] if reads_addresses else [])
    c.feed(
        Connect(time=HOUR + 3, pid=7, family="ipv4", address="10.9.0.1", port=14444)
    )  # a new port
    assert c.state_of(7).dirty
    assert "net-pool-port" in [e.rule_id for e in engine.score(HOUR + 3)[0].evidence]


def test_kept_outcomes_are_not_reused_by_another_rule_set(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text(
        "version: 1\nrules:\n  - {id: r, description: python, severity: low, weight: 10, "
        "condition: {signal: comm, is: python3}}\n"
    )
    two = tmp_path / "two.yaml"
    two.write_text(
        one.read_text().replace("weight: 10", "weight: 30").replace("python3", "kworker/0:1")
    )
    state = ProcessState(ProcessKey(5, HOUR), first_seen=HOUR, last_seen=HOUR)
    state.set_facts(facts(5, miner=False))
    assert score_process(state, load_ruleset([one]), HOUR).score == 10
    assert score_process(state, load_ruleset([two]), HOUR).score == 0
    state.set_facts(facts(5, miner=True))
    assert score_process(state, load_ruleset([two]), HOUR).score == 30


def all_signals(state: ProcessState, now: float) -> dict:
    memo.forget(state)
    reader = SignalReader(state, now)
    return {
        name: copy.copy(reader[name]) for name in SIGNALS
    }  # some values are the state's own sets


def rich_state() -> ProcessState:
    state = ProcessState(ProcessKey(9, HOUR), first_seen=HOUR, last_seen=HOUR)
    f = facts(9, miner=True)
    f.cmdline = f.cmdline + ["--url", "10.0.0.9:5555"]
    f.config_files = {"config.json": '{"pools": [{"url": "gulf.moneroocean.stream:10128"}]}'}
    state.set_facts(f)
    state.add_connection("1.2.3.4", 443)
    state.add_payload(HOUR, "tls", {"sni": "huggingface.co"})
    state.add_gpu_device("nvidia", "/dev/nvidia0")
    state.add_ioctl(HOUR, "NV_ESC_RM_CONTROL", "query", 3)
    return state


ADDITIONS = [
    ("new port", lambda s: s.add_connection("1.2.3.4", 5555), NEW_PORT),
    ("new address", lambda s: s.add_connection("10.0.0.9", 443), NEW_ADDRESS),
    ("new endpoint", lambda s: s.add_connection("8.8.8.8", 3333), NEW_PORT | NEW_ADDRESS),
    ("known endpoint", lambda s: s.add_connection("1.2.3.4", 443), 0),
    (
        "new payload",
        lambda s: s.add_payload(HOUR, "socks5", {"target_host": "pool.x.com", "target_port": 3333}),
        NEW_PAYLOAD,
    ),
    (
        "new payload detail",
        lambda s: s.add_payload(HOUR, "tls", {"sni": "pool.supportxmr.com"}),
        NEW_PAYLOAD,
    ),
    ("repeated payload", lambda s: s.add_payload(HOUR, "tls", {"sni": "huggingface.co"}), 0),
    ("new device class", lambda s: s.add_gpu_device("kfd"), NEW_DEVICE_CLASS),
    ("new gpu path", lambda s: s.add_gpu_device("nvidia", "/dev/nvidia3"), NEW_GPU_PATH),
    (
        "new class and path",
        lambda s: s.add_gpu_device("mem", "/dev/mem"),
        NEW_DEVICE_CLASS | NEW_GPU_PATH,
    ),
    ("new ioctl name", lambda s: s.add_ioctl(HOUR, "NV_ESC_RM_ALLOC", "query", 1), NEW_IOCTL_NAME),
    (
        "new ioctl category",
        lambda s: s.add_ioctl(HOUR, "UVM_REGISTER_CHANNEL", "submit", 1),
        NEW_IOCTL_NAME | NEW_IOCTL_CATEGORY,
    ),
    ("repeated ioctl", lambda s: s.add_ioctl(HOUR, "NV_ESC_RM_CONTROL", "query", 5), 0),
]


@pytest.mark.parametrize("name,apply,bits", ADDITIONS, ids=[a[0] for a in ADDITIONS])
def test_an_addition_changes_only_the_signals_said_to_read_it(name, apply, bits):
    state = rich_state()
    before = all_signals(state, HOUR + 60)
    assert apply(state) == bits
    after = all_signals(state, HOUR + 60)
    allowed = set(COUNT_SIGNALS | TIME_SIGNALS)
    for bit, readers in SIGNALS_READING.items():
        if bits & bit:
            allowed |= readers
    changed = {n for n in SIGNALS if before[n] != after[n]}
    assert changed <= allowed, (
        f"{name}: {sorted(changed - allowed)} changed but are not listed in SIGNALS_READING"
    )
    if bits:
        assert changed - COUNT_SIGNALS, f"{name}: reported as new but no signal changed"


def set_parent_verdict(state: ProcessState) -> None:
    parent = ProcessState(ProcessKey(1, HOUR))
    parent.set_facts(facts(1, miner=True))
    state.parent_verdict = score_process(parent, load_ruleset([shipped_rules_file()]), HOUR)


# Changes that are not additions: values kept on the state must not depend on them.
UPDATES = [
    ("gpu sample", lambda s: s.add_gpu_sample(HOUR + 30, 55.0, 3 << 30)),
    ("gpu memory total", lambda s: setattr(s, "gpu_memory_total", 16 << 30)),
    ("yara match", lambda s: (s.yara_matches.add("xmrig_strings"), s.yara_tags.add("miner"))),
    ("parent verdict", set_parent_verdict),
    ("repeated connect", lambda s: s.add_connection("1.2.3.4", 443)),
    ("repeated ioctl", lambda s: s.add_ioctl(HOUR + 30, "NV_ESC_RM_CONTROL", "query", 50)),
    ("exit", lambda s: setattr(s, "exited_at", HOUR + 40)),
]


@pytest.mark.parametrize(
    "name,apply",
    UPDATES + [(n, a) for n, a, _ in ADDITIONS],
    ids=[u[0] for u in UPDATES] + [a[0] for a in ADDITIONS],
)
def test_kept_signal_values_depend_only_on_what_drops_them(name, apply):
    state = rich_state()
    before = all_signals(state, HOUR + 60)
    result = apply(state)
    bits = result if name in [a[0] for a in ADDITIONS] else 0
    after = all_signals(state, HOUR + 60)
    may_change = {None}
    if bits & (NEW_PORT | NEW_ADDRESS | NEW_PAYLOAD):
        may_change.add(NETWORK)
    if bits & (NEW_DEVICE_CLASS | NEW_GPU_PATH | NEW_IOCTL_NAME | NEW_IOCTL_CATEGORY):
        may_change.add(DEVICES)
    wrong = {
        n: signal_kind(n)
        for n in SIGNALS
        if before[n] != after[n] and signal_kind(n) not in may_change
    }
    assert not wrong, f"{name} changed signals whose values are kept on the state: {wrong}"


def test_kept_signal_values_do_not_depend_on_the_time():
    state = rich_state()
    for n in range(4):
        state.add_gpu_sample(HOUR + 5 * n, 90.0 + n, 1 << 30)
    early, late = all_signals(state, HOUR + 60), all_signals(state, HOUR + 7 * 3600)
    wrong = [n for n in SIGNALS if early[n] != late[n] and signal_kind(n) is not None]
    assert not wrong


def test_kept_values_are_dropped_when_what_they_read_changes():
    state = ProcessState(ProcessKey(9, HOUR), first_seen=HOUR, last_seen=HOUR)
    state.set_facts(facts(9, miner=False))
    state.add_connection("1.2.3.4", 443)
    ruleset = load_ruleset([shipped_rules_file()])
    before = score_process(state, ruleset, HOUR + 60)
    assert before.score == 0
    state.add_connection("1.2.3.4", 3333)  # a pool port: the kept network outcomes are stale now
    after = score_process(state, ruleset, HOUR + 60)
    assert [e.rule_id for e in after.evidence] == ["net-pool-port"]
    state.add_gpu_device(
        "pci-bar", "/sys/bus/pci/devices/0000:01:00.0/resource1"
    )  # and the device outcomes
    assert "gpu-raw-bar-access" in [
        e.rule_id for e in score_process(state, ruleset, HOUR + 60).evidence
    ]
    state.set_facts(facts(9, miner=True))  # new facts (exec): everything is evaluated again
    assert "miner-cmdline-stratum" in [
        e.rule_id for e in score_process(state, ruleset, HOUR + 60).evidence
    ]


CLOCK_RULES = """\
version: 1
rules:
  - id: night
    description: runs at night
    severity: low
    weight: 50
    condition: {signal: hour_of_day, gte: 22}
  - id: old
    description: older than ten minutes
    severity: low
    weight: 20
    condition: {signal: age_s, gt: 600}
  - id: child-of-busy-parent
    description: parent scores high
    severity: low
    weight: 10
    condition: {signal: parent_score, gte: 40}
  - id: parent-gpu
    description: uses a GPU device
    severity: low
    weight: 30
    condition: {signal: gpu_device_classes, contains: kfd}
"""


def test_clock_rules_fire_without_another_event(tmp_path):
    path = tmp_path / "clock.yaml"
    path.write_text(CLOCK_RULES)
    ruleset = load_ruleset([path])
    evening = HOUR - (HOUR % 86400) + 21 * 3600 + 2400  # 21:40 UTC
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    f = facts(7, miner=False)
    f.start_time = evening
    c.feed(f)
    assert engine.score(evening)[0].score == 0
    assert engine.score(evening + 30) == []  # nothing changed, same minute
    (v,) = engine.score(evening + 660)  # 21:51: a new minute, age > 600 s
    assert [e.rule_id for e in v.evidence] == ["old"]
    assert engine.score(evening + 690) == []  # the same minute again
    (v,) = engine.score(evening + 1205)  # 22:00:05: a new hour
    assert {e.rule_id for e in v.evidence} == {"night", "old"} and v.score == 70


def test_children_are_rescored_when_the_parent_score_changes(tmp_path):
    path = tmp_path / "clock.yaml"
    path.write_text(CLOCK_RULES)
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, load_ruleset([path]))
    parent, child = facts(10, miner=False), facts(11, miner=False)
    child.ppid = 10
    noon = HOUR - (HOUR % 86400) + 12 * 3600
    parent.start_time = child.start_time = noon
    c.feed(parent)
    c.feed(child)
    engine.score(noon)
    c.feed(GpuOpen(time=noon + 1, pid=10, path="/dev/kfd", device_class="kfd", fd=3))
    verdicts = {v.pid: v for v in engine.score(noon + 1)}
    assert (
        verdicts[10].score == 30 and verdicts[10].verdict == "clean"
    )  # the verdict did not change
    assert verdicts[11].score == 0  # 30 < 40: rescored, no match
    c.feed(GpuOpen(time=noon + 2, pid=10, path="/dev/kfd", device_class="kfd", fd=3))
    assert engine.score(noon + 2) == []


def test_command_rates_are_kept_only_when_a_rule_reads_them(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE_RULES)
    for paths, tracked in (([shipped_rules_file()], False), ([shipped_rules_file(), site], True)):
        c = Correlator(facts_provider=None)
        engine = DetectionEngine(c, load_ruleset(paths))
        c.feed(facts(30, miner=False))
        for i in range(30):
            c.feed(GpuIoctl(time=HOUR + i, pid=30, device_class="nvidia-uvm", command=27, count=3))
        state = c.state_of(30)
        assert bool(state.ioctl_command_rates) is tracked and bool(state.ioctl_rates) is tracked
        rules = {e.rule_id for e in engine.score(HOUR + 30)[0].evidence}
        assert ("site-busy-channel" in rules) is tracked
