"""GPU behaviour fingerprints: windows, signals, rules, and the real H100 traces replayed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.correlate.gpu_behaviour import GpuBehaviour, profile
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.correlate.windows import SampleWindow
from gpuguard.detect.cases import replay, run_case
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import Exec, Exit
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.wire import iter_recording
from gpuguard.events.wire_format import item_record

TRACES = Path(__file__).resolve().parent / "traces"
CASES = sorted(p for p in (TRACES / "cases").iterdir() if (p / "expected.yaml").is_file())
T = 1_795_305_600.0  # 2026-11-22 00:00 UTC
GIB = 1 << 30


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


# -- the real traces and the synthetic variants --------------------------------------


def test_every_trace_case_is_there():
    assert {p.name for p in CASES} == {
        "h100_hashing_loop_blanked",
        "h100_cnn_training",
        "h100_inference_server",
        "synthetic_memory_hard",
        "synthetic_time_gated",
        "synthetic_pauses_when_watched",
        "synthetic_burn_in",
    }


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_trace_case(case, ruleset):
    result = run_case(case, ruleset)
    assert result.passed, "\n".join(result.report_lines())


def test_hashing_loop_evidence_names_the_behaviour(ruleset):
    verdicts, _ = replay(TRACES / "cases" / "h100_hashing_loop_blanked" / "capture.ggrec", ruleset)
    (verdict,) = verdicts
    shape = next(e for e in verdict.evidence if e.rule_id == "gpu-hashing-shape")
    assert (
        "compute-bound: SM 99 ± 0.7% for 73 s, memory-controller 0%, PCIe 2.9 MB/s, "
        "allocation 520 MiB unchanged for 73 s" in shape.detail
    )
    # Nothing but behaviour: the blanked identity gives no other evidence.
    assert all("behaviour" in e.tags for e in verdict.evidence)


def test_converter_reproduces_the_committed_recordings():
    spec = importlib.util.spec_from_file_location("convert_h100", TRACES / "convert_h100.py")
    converter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converter)
    cases = converter.all_cases()
    assert set(cases) == {p.name for p in CASES}
    for name, (items, synthetic, _) in cases.items():
        committed = [
            item_record(i) for i in iter_recording(TRACES / "cases" / name / "capture.ggrec")
        ]
        assert committed == [item_record(i) for i in items], name
        assert name.startswith("synthetic_") == synthetic


# -- windows and profile ----------------------------------------------------------------


def _feed(
    behaviour: GpuBehaviour,
    sm: SampleWindow,
    n: int,
    sm_value,
    memctl=None,
    used=GIB,
    power=None,
    pcie=None,
    watched=lambda i: False,
    start=T,
    step=1.0,
):
    for i in range(n):
        t = start + i * step
        value = sm_value(i) if callable(sm_value) else sm_value
        sm.add(t, value)
        behaviour.add(
            t, value, None, used(i) if callable(used) else used, memctl, power, pcie, watched(i)
        )


def test_absent_figures_stay_absent_not_zero():
    behaviour, sm = GpuBehaviour(), SampleWindow()
    _feed(behaviour, sm, 30, 99.0)  # no memory-controller, power or PCIe figure at all
    assert (
        behaviour.memctl.mean is None
        and behaviour.power_variation() is None
        and behaviour.pcie_mb_s() is None
    )
    text = profile(sm, behaviour)
    assert (
        text.startswith("flat: SM 99 ± 0.0% for 29 s")
        and "memory-controller" not in text
        and "PCIe" not in text
    )


def test_profile_kinds():
    cases = {
        "compute-bound": dict(sm_value=99.0, memctl=0.0, power=395.0, pcie=3000.0),
        "memory-hard": dict(sm_value=97.0, memctl=99.0, used=5 * GIB, power=430.0, pcie=3000.0),
        "varying": dict(sm_value=lambda i: 40.0 + 50 * (i % 2), memctl=60.0),
        "idle": dict(sm_value=lambda i: 5.0 * (i % 3), memctl=0.0),
    }
    for kind, kwargs in cases.items():
        behaviour, sm = GpuBehaviour(), SampleWindow()
        _feed(behaviour, sm, 30, **kwargs)
        assert profile(sm, behaviour).startswith(kind + ":"), kind
    behaviour, sm = GpuBehaviour(), SampleWindow()
    _feed(behaviour, sm, 4, 99.0)
    assert profile(sm, behaviour) is None  # too few samples to say anything


def test_memory_hard_needs_an_allocation_that_never_changed():
    behaviour, sm = GpuBehaviour(), SampleWindow()
    _feed(behaviour, sm, 30, 97.0, memctl=99.0, used=lambda i: 5 * GIB + (i // 10) * GIB)
    assert not profile(sm, behaviour).startswith("memory-hard")
    assert behaviour.allocation_stable_s() == 9.0


def test_pauses_when_watched_and_night_only():
    behaviour, sm = GpuBehaviour(), SampleWindow()
    _feed(
        behaviour, sm, 60, lambda i: 0.0 if 20 <= i < 30 else 99.0, watched=lambda i: 20 <= i < 30
    )
    assert behaviour.pauses_when_watched() is True
    steady, sm2 = GpuBehaviour(), SampleWindow()
    _feed(steady, sm2, 60, 99.0, watched=lambda i: 20 <= i < 30)  # keeps working while watched
    assert steady.pauses_when_watched() is False
    assert GpuBehaviour().pauses_when_watched() is None
    night, sm3 = GpuBehaviour(), SampleWindow()
    # T is midnight UTC: 24 hours a minute apart, busy only 22-06.
    _feed(
        night,
        sm3,
        24 * 60,
        lambda i: 99.0 if (i // 60) % 24 in (22, 23, 0, 1, 2, 3, 4, 5) else 0.0,
        step=60.0,
    )
    assert night.night_only() is True
    always, sm4 = GpuBehaviour(), SampleWindow()
    _feed(always, sm4, 24 * 60, 99.0, step=60.0)
    assert always.night_only() is False
    assert night.day_s + night.night_s == pytest.approx((24 * 60 - 1) * 60.0)


# -- signals --------------------------------------------------------------------------


def _state() -> ProcessState:
    state = ProcessState(ProcessKey(100, T), first_seen=T, last_seen=T)
    state.set_facts(
        ProcessFacts(
            pid=100, start_time=T, comm="app", exe="/usr/bin/app", cmdline=["/usr/bin/app"]
        )
    )
    return state


def _solo(memctl=0.0, power=395.0, tx=1500, rx=1400):
    return DeviceSample("nvidia", 0, mem_util=memctl, power_w=power, pcie_tx_kbs=tx, pcie_rx_kbs=rx)


TESTED_SIGNALS = {
    "gpu_profile",
    "gpu_memory_controller_mean",
    "gpu_power_variation",
    "gpu_pcie_mb_s",
    "gpu_allocation_stable_s",
    "gpu_memory_growth_fraction",
    "gpu_device_shared",
    "gpu_duty_cycle",
    "gpu_pauses_when_watched",
    "gpu_night_only",
    "gpu_lifetime_util_mean",
    "gpu_lifetime_s",
}  # the last two: tests/test_nvml_behaviour.py


def test_behaviour_signals():
    state = _state()
    for i in range(20):
        state.add_gpu_sample(
            T + i,
            99.0 if i % 4 else 10.0,
            2 * GIB if i < 10 else 3 * GIB,
            1.0,
            _solo(power=400.0 if i % 2 else 380.0),
            watched=False,
        )
    state.gpu_memory_total = 10 * GIB
    state.gpu_device_shared = False
    r = SignalReader(state, T + 20)
    assert r["gpu_profile"] == (
        "varying: SM 77 ± 38.5% for 19 s, memory-controller 0%, PCIe 2.9 MB/s, "
        "allocation 3.0 GiB unchanged for 9 s"
    )
    assert (
        r["gpu_memory_controller_mean"] == 0.0
    )  # the device's figure wins while it is the only user
    assert r["gpu_power_variation"] == pytest.approx(10 / 390)
    assert r["gpu_pcie_mb_s"] == pytest.approx(2.9)
    assert r["gpu_allocation_stable_s"] == 9.0
    assert r["gpu_memory_growth_fraction"] == pytest.approx(0.1)
    assert r["gpu_device_shared"] is False
    assert r["gpu_duty_cycle"] == 0.75
    assert r["gpu_pauses_when_watched"] is None and r["gpu_night_only"] is None
    empty = SignalReader(_state(), T)
    assert all(empty[name] is None for name in TESTED_SIGNALS)


def _snapshot(t, procs, device=None):
    device = device or DeviceSample(
        "nvidia",
        0,
        memory_total=80 * GIB,
        mem_util=0.0,
        power_w=395.0,
        pcie_tx_kbs=1500,
        pcie_rx_kbs=1400,
    )
    return GpuSnapshot(time=t, source="nvml", devices=[device], processes=procs)


def _facts(pid, comm="app", exe="/usr/bin/app"):
    return ProcessFacts(pid=pid, start_time=T, comm=comm, exe=exe, cmdline=[exe])


def test_device_figures_are_attributed_only_to_a_sole_user():
    c = Correlator(facts_provider=None)
    c.feed(_facts(1))
    c.feed(_facts(2))
    for i in range(10):
        procs = [ProcessGpuUsage(1, "nvidia", 0, sm_util=99.0, mem_util=3.0, used_memory=GIB)]
        if i >= 5:
            procs.append(
                ProcessGpuUsage(2, "nvidia", 0, sm_util=1.0, mem_util=0.0, used_memory=GIB)
            )
        c.feed(_snapshot(T + i, procs))
    one, two = c.state_of(1), c.state_of(2)
    assert len(one.gpu_behaviour.power) == 5 and len(two.gpu_behaviour.power) == 0
    assert (
        one.gpu_behaviour.memctl.values() == [0.0] * 5 + [3.0] * 5
    )  # device while alone, own share after
    assert one.gpu_device_shared is True and two.gpu_device_shared is True


def test_monitors_mark_samples_as_watched():
    c = Correlator(facts_provider=None)
    c.feed(_facts(1))
    for i in range(30):
        if i == 10:
            c.feed(
                Exec(time=T + i - 0.5, pid=50, comm="nvidia-smi", filename="/usr/bin/nvidia-smi")
            )
        if i == 20:
            c.feed(Exit(time=T + i - 0.5, pid=50, comm="nvidia-smi", exit_code=0))
        busy = not 10 <= i < 20
        c.feed(
            _snapshot(
                T + i,
                [ProcessGpuUsage(1, "nvidia", 0, sm_util=99.0 if busy else 0.0, used_memory=GIB)],
            )
        )
    behaviour = c.state_of(1).gpu_behaviour
    assert (behaviour.watched_samples, behaviour.watched_active, behaviour.unwatched_samples) == (
        10,
        0,
        20,
    )
    assert behaviour.pauses_when_watched() is True


def test_memory_hog_needs_a_shared_gpu(ruleset):
    def run(shared: bool):
        c = Correlator(facts_provider=None)
        engine = DetectionEngine(c, ruleset)
        c.feed(_facts(1))
        c.feed(_facts(2))
        for i in range(0, 200, 5):
            procs = [ProcessGpuUsage(1, "nvidia", 0, sm_util=1.0, used_memory=70 * GIB)]
            if shared:
                procs.append(ProcessGpuUsage(2, "nvidia", 0, sm_util=60.0, used_memory=4 * GIB))
            c.feed(_snapshot(T + i, procs))
        verdict = next(v for v in engine.verdicts(T + 200) if v.pid == 1)
        return {e.rule_id for e in verdict.evidence}, verdict.verdict

    assert run(True) == ({"gpu-memory-hog"}, "suspicious")
    assert run(False) == (set(), "clean")


def test_memory_growth_ten_minutes_in(ruleset):
    c = Correlator(facts_provider=None)
    engine = DetectionEngine(c, ruleset)
    c.feed(_facts(1))
    for i in range(0, 900, 10):  # +2 GiB a minute, for 15 minutes, on an 80 GiB GPU
        c.feed(
            _snapshot(
                T + i,
                [ProcessGpuUsage(1, "nvidia", 0, sm_util=30.0, used_memory=GIB + i * GIB // 30)],
            )
        )
    verdict = next(v for v in engine.verdicts(T + 900))
    assert "gpu-memory-growing" in {e.rule_id for e in verdict.evidence}
    assert verdict.verdict == "clean"  # a leak alone is worth a note, not an alert


def test_raw_bar_access_evidence_names_the_device(ruleset):
    from gpuguard.events.model import GpuOpen

    c = Correlator(facts_provider=None)

    engine = DetectionEngine(c, ruleset)
    c.feed(_facts(1, comm="dumper", exe="/usr/local/bin/dumper"))
    c.feed(
        GpuOpen(
            time=T + 1,
            pid=1,
            path="/sys/bus/pci/devices/0000:18:00.0/resource1",
            device_class="pci-bar",
            fd=3,
            flags=os.O_RDWR,
        )
    )
    verdict = next(v for v in engine.verdicts(T + 2) if v.pid == 1)
    raw = next(e for e in verdict.evidence if e.rule_id == "gpu-raw-bar-access")
    assert "gpu_paths=/sys/bus/pci/devices/0000:18:00.0/resource1" in raw.detail
    assert (verdict.pid, verdict.comm, verdict.exe) == (
        1,
        "dumper",
        "/usr/local/bin/dumper",
    )  # the holder


def test_window_minimum_kept_in_order_equals_a_pass_over_the_window():
    """The SM and memory windows keep their minimum in a monotonic queue (O(1) reads):
    it must equal min() over the samples kept, whatever expires them (span or count)."""
    import random

    rng = random.Random(7)
    for trial in range(100):
        span, most = rng.choice([5.0, 20.0, 300.0]), rng.choice([3, 10, 600])
        tracked, plain = SampleWindow(span, most, track_minimum=True), SampleWindow(span, most)
        assert tracked.minimum is None
        t = T
        for i in range(200):
            t += rng.choice([0.0, 0.5, 1.0, 3.0, 30.0])
            value = rng.choice([1.0, 2.0, 3.0, rng.random() * 10])
            tracked.add(t, value)
            plain.add(t, value)
            assert tracked.minimum == plain.minimum == min(plain.values()), (trial, i)


def test_window_mean_and_variance_equal_a_pass_over_the_window():
    """Mean and variance come from running sums shifted to a recent mean: they must equal a
    pass over the samples kept for flat signals (SM 99 %, memory controller 0 %), a signal
    that jumps and then stays flat (the case that loses digits), noise, and large values."""
    import random
    import statistics

    rng = random.Random(11)
    shapes = {
        "flat": lambda i: 99.0,
        "jump then flat": lambda i: 0.0 if i < 50 else 99.0 + rng.gauss(0, 0.01),
        "allocation made, then kept": lambda i: 0.0 if i < 50 else 4e9 + rng.gauss(0, 0.5),
        "noise": lambda i: rng.uniform(0, 100),
        "large, small spread": lambda i: 4e9 + rng.gauss(0, 0.5),  # bytes of GPU memory
    }
    for trial in range(120):
        name = list(shapes)[trial % len(shapes)]
        window = SampleWindow(rng.choice([5.0, 30.0, 300.0]), rng.choice([10, 100, 600]))
        t = T
        for i in range(rng.randint(2, 800)):
            t += rng.uniform(0.1, 2.0)
            window.add(t, shapes[name](i))
            if len(window) >= 2 and rng.random() < 0.2:
                values = window.values()
                assert window.mean == pytest.approx(statistics.fmean(values), rel=1e-9, abs=1e-9), (
                    name,
                    i,
                )
                assert window.variance == pytest.approx(
                    statistics.pvariance(values), rel=1e-6, abs=1e-6
                ), (name, i)
