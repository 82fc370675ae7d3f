"""Scoring leaves out the rules that cannot match, and gives the same evidence as every rule.

``RuleSet.groups_for`` drops a rule when its condition is false with the values its signals
have while the inputs they read are blank (detect.signals.blank); in one pass, processes
whose inputs to a group of kept rules are equal share one evaluation (``RuleGroup.alike``).
Each state below is scored both ways: through ``score_process``, all in one pass, against
every enabled rule evaluated on a fresh reader.  The states cover each input alone on a
quiet process, a miner and a masquerader, the golden cases' states and the built states of
tests/test_signal_inputs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.cases import CAPTURE, replay
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.model import RuleGroup, RuleSet
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.score import score_process
from gpuguard.detect.signals import blank
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import DeviceSample
from gpuguard.events.model import ConnActivity, CpuActivity
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from tests.support.memo import set_aside
from tests.support.signal_states import built_states

CASES = Path(__file__).parent / "cases"
T = 1_700_002_800.0


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return load_ruleset([shipped_rules_file()])


def _facts(pid: int, **fields) -> ProcessFacts:
    base = dict(
        pid=pid,
        start_time=T,
        ppid=1,
        comm="sleep",
        exe="/usr/bin/sleep",
        cmdline=["sleep", "3600"],
        uid=1000,
        username="bob",
        environ_readable=True,
        ancestors=[Ancestor(1, "systemd", "/usr/lib/systemd/systemd")],
    )
    base.update(fields)
    return ProcessFacts(**base)


def _quiet(pid: int, **fields) -> ProcessState:
    state = ProcessState(ProcessKey(pid, T), first_seen=T, last_seen=T)
    state.set_facts(_facts(pid, **fields))
    return state


def _miner(pid: int) -> ProcessState:
    return _quiet(
        pid,
        comm="xmrig",
        exe="/tmp/.x/xmrig",
        cmdline=["./xmrig", "-o", "stratum+tcp://pool.supportxmr.com:3333", "--donate-level=1"],
    )


def _gpu(state: ProcessState, sm: float, memctl: float, samples: int = 31, solo=False) -> None:
    """GPU samples every 10 s up to T, 15 of the device's 16 GiB in use."""
    state.gpu_memory_total = 16 << 30
    for n in range(samples):
        device = DeviceSample(
            "nvidia", 0, mem_util=memctl, power_w=250.0, pcie_tx_kbs=1000, pcie_rx_kbs=1000
        )
        state.add_gpu_sample(
            T - 10 * (samples - 1 - n), sm, 15 << 30, memctl, solo=device if solo else None
        )


def _masquerader(pid: int) -> ProcessState:
    return _quiet(pid, comm="kworker/0:1", exe="/usr/local/bin/kw", cmdline=["kw"])


# One input each, given to a quiet process and to a miner: every way a blank input stops being one.
ADDITIONS = {
    "connection to a pool port": lambda s: s.add_connection("198.51.100.7", 3333),
    "connection to 443": lambda s: s.add_connection("198.51.100.7", 443),
    "stratum payload": lambda s: s.add_payload(
        T, "stratum", {"method": "mining.subscribe", "agent": "XMRig/6.21"}
    ),
    "tls payload": lambda s: s.add_payload(T, "tls", {"sni": "gulf.moneroocean.stream"}),
    "socks5 payload": lambda s: s.add_payload(
        T, "socks5", {"target_host": "pool.minexmr.com", "target_port": 4444}
    ),
    "compute device": lambda s: s.add_gpu_device("nvidia-uvm", "/dev/nvidia-uvm"),
    "raw BAR": lambda s: s.add_gpu_device("pci-bar", "/sys/bus/pci/devices/0/resource0"),
    "msr written": lambda s: s.add_gpu_device("msr", "/dev/cpu/0/msr", written=True),
    "hugepages-config written": lambda s: s.add_gpu_device(
        "hugepages-config", "/proc/sys/vm/nr_hugepages", written=True
    ),
    "submit ioctls": lambda s: s.add_ioctl(T, "UVM_REGISTER_CHANNEL", "submit", 50),
    "hashing GPU, its device's only user": lambda s: _gpu(s, sm=99.0, memctl=1.0, solo=True),
    "memory-hard GPU": lambda s: _gpu(s, sm=99.0, memctl=90.0),
    "GPU memory hog": lambda s: (
        _gpu(s, sm=1.0, memctl=0.0),
        setattr(s, "gpu_device_shared", True),
    ),
    "NVML lifetime": lambda s: (
        _gpu(s, sm=99.0, memctl=1.0, samples=3),
        setattr(
            s,
            "gpu_lifetime",
            GpuAccounting(s.pid, "nvidia", 0, None, 96.0, 1.0, 15 << 30, T - 7200, 7200.0, True),
        ),
    ),
    "GPU shared": lambda s: setattr(s, "gpu_device_shared", True),
    "CPU window": lambda s: [s.cpu.add(T - 200 + 10 * n, 99.0) for n in range(21)],
    "spinning threads": lambda s: setattr(
        s,
        "cpu_activity",
        CpuActivity(time=T, pid=s.pid, threads=4, spinning_threads=4, spin_span_s=600.0),
    ),
    "FPU rounding": lambda s: setattr(
        s,
        "cpu_activity",
        CpuActivity(
            time=T,
            pid=s.pid,
            threads=1,
            spinning_threads=1,
            spin_span_s=60.0,
            fpu_samples=100,
            fpu_round_nondefault=40,
            fpu_round_changes=30,
            fpu_span_s=60.0,
        ),
    ),  # fmt: skip
    "RandomX huge pages": lambda s: s.add_huge_alloc(2181038016, 2 << 20),
    "1 GiB pages": lambda s: s.add_huge_alloc(1 << 30, 1 << 30),
    "YARA match": lambda s: s.add_yara_result({"xmrig_strings"}, {"miner"}),
    "session": lambda s: s.add_session(
        ConnActivity(
            time=T,
            pid=s.pid,
            fd=5,
            age_s=600.0,
            bytes_out=4000,
            writes_out=40,
            small_writes=40,
            small_write_times=[T - 600 + 15 * n for n in range(40)],
            remote="198.51.100.7:3333",
        )
    ),  # fmt: skip
    "exited": lambda s: setattr(s, "exited_at", T + 1),
}


def varied_states() -> list[ProcessState]:
    states = []
    pid = 100
    for base in (_quiet, _miner, _masquerader):
        states.append(base(pid))
        pid += 1
        for add in ADDITIONS.values():
            state = base(pid)
            add(state)
            states.append(state)
            pid += 1
    everything = _miner(pid)
    for add in ADDITIONS.values():
        add(everything)
    states.append(everything)
    facts_only = [
        dict(comm="kworker/0:1", exe="/dev/shm/k", cmdline=["[kworker/0:1]"]),
        dict(exe="/memfd:x", exe_deleted=True, exe_memfd=True),
        dict(exe="/memfd:runc_cloned:/proc/self/exe", exe_deleted=True, exe_memfd=True),
        dict(exe="/opt/x/bin/x", exe_deleted=True),
        dict(ld_preload="/usr/lib/libprocesshider.so"),
        dict(config_files={"config.json": '{"pools": [{"url": "pool.supportxmr.com:3333"}]}'}),
        dict(container_id="abc123", ancestors=[Ancestor(50, "sh", "/bin/sh")], exe="/tmp/x"),
        dict(ancestors=[Ancestor(50, "cron", "/usr/sbin/cron")], exe="/tmp/x"),
        dict(hugetlb_bytes=2181038016, hugetlb_page_size=2 << 20),
        dict(comm="modprobe", exe="/usr/sbin/modprobe", cmdline=["modprobe", "msr", "allow_writes=on"]),
        dict(comm="", exe="", cmdline=[], ppid=2, kernel_thread=True),
    ]  # fmt: skip
    for fields in facts_only:
        states.append(_quiet(pid, **fields))
        pid += 1
    states.append(ProcessState(ProcessKey(pid, T), provisional=True, comm="x"))  # no facts yet
    return states


def golden_states(ruleset: RuleSet) -> list[ProcessState]:
    found = []
    for case in sorted(CASES.iterdir()):
        if (case / CAPTURE).exists():
            found += list(replay(case / CAPTURE, ruleset)[1].unordered_states())
    return found


def _every_rule(state: ProcessState, ruleset: RuleSet, now: float) -> list[tuple[str, str]]:
    """(rule, witnesses) of every enabled rule that matches, each evaluated on a fresh reader."""
    with set_aside(state):
        reader = SignalReader(state, now)
        out = []
        for rule in ruleset.rules:
            witnesses = rule.condition(reader)
            if witnesses is not None:
                out.append((rule.id, "; ".join(witnesses)))
    return sorted(out)


def differences(ruleset: RuleSet, states: list[ProcessState]) -> list[str]:
    """Each state whose scored evidence differs from what every rule gives, or that had a rule
    left out which matches it (scored as one pass: outcomes shared between processes alike)."""
    wrong = []
    alike: dict = {}
    for state in states:
        now = max(state.last_seen, T) + 30
        full = _every_rule(state, ruleset, now)
        left_in = {r.id for _, rules, _ in ruleset.groups_for(state) for r in rules}
        left_out = [rule for rule, _ in full if rule not in left_in]
        with set_aside(state):
            verdict = score_process(state, ruleset, now, None, alike)
        scored = sorted((e.rule_id, e.detail) for e in verdict.evidence)
        if scored != full or left_out:
            wrong.append(
                f"pid {state.pid}: scored {scored}, every rule {full}, left out {left_out}"
            )
        total = max(0, min(100, sum(r.weight for r in ruleset.rules if r.id in dict(full))))
        if verdict.score != total:
            wrong.append(f"pid {state.pid}: score {verdict.score}, every rule {total}")
    return wrong


@pytest.fixture(scope="module")
def states(ruleset) -> list[ProcessState]:
    return varied_states() + built_states() + golden_states(ruleset)


def test_the_states_match_many_rules(ruleset, states):
    matched = {rule for s in states for rule, _ in _every_rule(s, ruleset, T + 30)}
    assert len(matched) >= 40, sorted(r.id for r in ruleset.rules if r.id not in matched)


def test_the_rules_left_in_give_the_evidence_of_every_rule(ruleset, states):
    assert differences(ruleset, states) == []


def test_a_quiet_process_computes_no_signal_of_a_blank_input(ruleset):
    state = _quiet(7)
    reader = SignalReader(state, T + 30)
    score_process(state, ruleset, T + 30, reader)
    blank_only = {
        name for name in reader if blank.foldable(name) and not SIGNALS[name].reads & _given(state)
    }
    assert blank_only == set()
    evaluated = sum(len(rules) for _, rules, _ in ruleset.groups_for(state))
    assert evaluated < len(ruleset.rules) / 2


def _given(state: ProcessState) -> set[str]:
    probe = blank.BlankProbe(blank.inputs_of(SIGNALS))
    return {name for name, is_blank in zip(probe.inputs, probe(state), strict=True) if not is_blank}


WRONGLY_BLANK = [
    "cmdline",
    "facts.ancestors",
    "facts.config_files",
    "facts.container_id",
    "facts.exe_deleted",
    "network.ports",
    "network.methods",
    "payload_protocols",
    "gpu_device_classes",
    "gpu_paths",
    "device_classes_written",
    "ioctl_categories",
    "gpu_util",
    "gpu_behaviour",
    "gpu_device_shared",
    "cpu",
    "cpu_activity",
    "huge_requests",
    "yara_tags",
    "sessions",
]


@pytest.mark.parametrize("wrong", WRONGLY_BLANK)
def test_a_probe_that_calls_a_given_input_blank_is_caught(states, wrong):
    """The comparison above fails when the fast path skips what it must not: here a probe
    that answers "blank" for an input some state was given."""
    fresh = load_ruleset([shipped_rules_file()])
    probe = blank.BlankProbe(blank.inputs_of(fresh.signals_used))
    at = probe.inputs.index(wrong)

    class Lying:
        inputs = probe.inputs

        def __call__(self, state: ProcessState) -> tuple[bool, ...]:
            answers = list(probe(state))
            answers[at] = True
            return tuple(answers)

    fresh._blank_probe = Lying()
    assert differences(fresh, states)


def test_a_key_that_leaves_out_an_input_is_caught(states, monkeypatch):
    """Processes share a kept outcome only when every input its rules read is equal: a key
    that leaves one out (here: every input) gives one process another's evidence."""
    monkeypatch.setattr(blank.InputValues, "__call__", lambda self, state: ())
    assert differences(load_ruleset([shipped_rules_file()]), states)


def test_processes_alike_share_one_evaluation(ruleset):
    alike: dict = {}
    evaluated = []
    for pid in range(3):
        state = _quiet(200 + pid)
        reader = SignalReader(state, T + 30)
        score_process(state, ruleset, T + 30, reader, alike)
        evaluated.append(len(reader))
    assert evaluated[1] < evaluated[0] / 2 and evaluated[2] == evaluated[1]
    other = _quiet(210, cmdline=["sleep", "60"])  # another command line: evaluated again
    reader = SignalReader(other, T + 30)
    score_process(other, ruleset, T + 30, reader, alike)
    assert len(reader) == evaluated[0]
    again = _quiet(211)  # outside a pass: nothing shared
    reader = SignalReader(again, T + 30)
    score_process(again, ruleset, T + 30, reader)
    assert len(reader) == evaluated[0]


def test_every_golden_case_replays_to_the_same_verdicts_with_every_rule(ruleset, monkeypatch):
    def replayed() -> list[dict]:
        out = []
        for case in sorted(CASES.iterdir()):
            if (case / CAPTURE).exists():
                fresh = load_ruleset([shipped_rules_file()])
                out += [v.to_json() for v in replay(case / CAPTURE, fresh)[0]]
        return out

    fast = replayed()
    monkeypatch.setattr(
        RuleSet,
        "groups_for",
        lambda self, state: tuple(RuleGroup(c, rules, None) for c, rules in self.evaluation_groups),
    )
    assert fast == replayed()
