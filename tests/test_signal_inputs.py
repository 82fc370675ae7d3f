"""Every rule signal reads exactly the inputs it declares (``Signal.reads``).

Caching and rescoring (gpuguard.detect.signals.rescore) are derived from the declarations, so a
signal reading an undeclared input would be cached too long or not rescored.  Each signal is
run against a proxy of the state that records the fields it touches, on the states the golden
cases replay to plus a few built here, at two times far apart (a value that moves with the
clock must declare "now").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.cases import CAPTURE, replay
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.score import score_process
from gpuguard.detect.signals.definition import Signal
from gpuguard.detect.signals.rescore import INPUTS
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.model import CpuActivity
from gpuguard.events.process_facts import Ancestor, ProcessFacts

CASES = Path(__file__).parent / "cases"
T = 1_700_002_800.0


class StateRecorder:
    """A ProcessState that records which fields are read (``network.<field>`` for the
    NetworkView's, ``facts.<field>`` for the facts': looking whether there are facts is part of
    reading one of their fields).  It is a new object to detect's memo, which holds nothing for
    it, so every derivation reads its inputs; the generations the memo stamps its entries with
    are bookkeeping, not inputs, and are not recorded."""

    def __init__(self, state: ProcessState, seen: set[str], prefix: str = "") -> None:
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_seen", seen)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        value = getattr(self._state, name)
        if not self._prefix and name in ("facts_gen", "network_gen", "devices_gen"):
            return value
        if not self._prefix and name == "network":
            return StateRecorder(value, self._seen, "network.")
        if not self._prefix and name == "facts":
            return None if value is None else StateRecorder(value, self._seen, "facts.")
        self._seen.add(self._prefix + name)
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AssertionError(f"a signal wrote {name} on the state")


def inputs_read(signal: Signal, states: list[ProcessState]) -> set[str]:
    """The inputs ``signal`` read on ``states``; "now" when its value differed 7 hours later."""
    seen: set[str] = set()
    for state in states:
        values = []
        for now in (state.last_seen + 30, state.last_seen + 7 * 3600):
            args = (now, "UVM_REGISTER_CHANNEL") if signal.parameter else (now,)
            values.append(signal.compute(StateRecorder(state, seen), *args))
        if values[0] != values[1]:
            seen.add("now")
    return seen


def built_states() -> list[ProcessState]:
    """States with what the golden cases lack: config files, payloads, recent ioctls, YARA."""
    miner = ProcessState(ProcessKey(9, T), first_seen=T, last_seen=T)
    miner.set_facts(
        ProcessFacts(
            pid=9,
            start_time=T,
            comm="kworker/0:1",
            exe="/memfd:x (deleted)",
            cmdline=["./x", "-o", "stratum+tcp://pool.supportxmr.com:3333", "-a", "rx/0"],
            uid=1000,
            username="bob",
            exe_deleted=True,
            environ_readable=True,
            ld_preload="/tmp/h.so",
            config_files={"config.json": '{"pools": [{"url": "gulf.moneroocean.stream:3333"}]}'},
            ancestors=[Ancestor(900, "bash", "/usr/bin/bash")],
        )
    )
    miner.add_connection("1.2.3.4", 3333)
    miner.add_payload(T, "tls", {"sni": "gulf.moneroocean.stream", "ja4": "t13i310900_e8f1"})
    miner.add_payload(T, "socks5", {"target_host": "pool.supportxmr.com", "target_port": 3333})
    miner.add_payload(T, "cryptonote", {"method": "login", "login": "4" + "A" * 94, "agent": "x"})
    miner.add_gpu_device("nvidia-uvm", "/dev/nvidia-uvm", written=True)
    for category, name in (
        ("submit", "UVM_REGISTER_CHANNEL"),
        ("query", "NV_ESC_RM_CONTROL"),
        ("memory", "UVM_MAP_EXTERNAL_ALLOCATION"),
        ("setup", "NV_ESC_CARD_INFO"),
        ("other", "NV_ESC_RM_FREE"),
    ):
        miner.add_ioctl(T, name, category, 40)
    for n in range(6):
        miner.add_gpu_sample(T - 60 + 10 * n, 99.0, 3 << 30)
    miner.gpu_memory_total = 16 << 30
    miner.add_huge_alloc(256 << 20, 2 << 20)
    miner.add_yara_result({"xmrig_strings"}, {"miner"})
    miner.cpu_activity = CpuActivity(
        time=T, pid=9, threads=4, spinning_threads=4, spin_span_s=30.0, runnable_max=1.0,
        ran_share=0.9, fpu_samples=100, fpu_round_nondefault=40, fpu_round_changes=30,
        fpu_span_s=20.0,
    )  # fmt: skip
    miner.exited_at = T + 5
    child = ProcessState(ProcessKey(10, T), first_seen=T, last_seen=T)
    child.parent_verdict = score_process(miner, load_ruleset([shipped_rules_file()]), T)
    return [miner, child, ProcessState(ProcessKey(11, T), first_seen=T, last_seen=T)]


@pytest.fixture(scope="module")
def states() -> list[ProcessState]:
    ruleset = load_ruleset([shipped_rules_file()])
    found = built_states()
    for case in sorted(CASES.iterdir()):
        if (case / CAPTURE).exists():
            found += list(replay(case / CAPTURE, ruleset)[1].unordered_states())
    return found


def test_every_signal_reads_exactly_what_it_declares(states):
    wrong = {}
    for name, signal in SIGNALS.items():
        read = inputs_read(signal, states)
        if read != signal.reads:
            wrong[name] = {
                "undeclared": sorted(read - signal.reads),
                "never read here": sorted(signal.reads - read),
            }
    assert not wrong, (
        f"signals whose reads differ from their declaration (Signal.reads): {wrong}; a read "
        "never seen needs a state above that takes that branch"
    )


def test_every_declared_input_is_known_to_the_rescore_policy():
    for signal in SIGNALS.values():
        assert signal.reads and signal.reads <= INPUTS.keys(), signal.name


def test_an_undeclared_read_is_caught(states):
    def sneaky(s, now):
        return s.exe if s.comm else None

    signal = Signal("sneaky", "text", "identity", "", sneaky, reads=frozenset({"comm"}))
    assert inputs_read(signal, states) == {"comm", "exe"}

    def clock(s, now):
        return now - s.key.start_time

    signal = Signal("clock", "number", "time", "", clock, reads=frozenset({"key"}))
    assert inputs_read(signal, states) == {"key", "now"}
