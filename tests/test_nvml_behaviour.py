"""NVML for behaviour: PCIe without the 20 ms call, accounting mode, the driver's sample history."""

from __future__ import annotations

import pynvml
import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.gpu import nvml
from gpuguard.sources.gpu.nvml_pcie import COUNTERS, SLOW_EVERY_S, THROUGHPUT
from tests.fakes.fake_pynvml import MIB, FakeAccounting, FakeGpu, FakeNvml, FakeProcess

NOW = 1_795_382_400.0
NOW_US = int(NOW * 1_000_000)


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def open_fake(fake: FakeNvml, clock: Clock):
    return nvml.open_sampler(proc_root="/nonexistent", library=fake.module, clock=clock)


def test_pcie_from_byte_counters_never_calls_the_20ms_throughput():
    gpu = FakeGpu(pcie_tx_kbs=999, pcie_rx_kbs=999)  # what the throughput call would say
    fake, clock = FakeNvml([gpu]), Clock()
    sampler = open_fake(fake, clock)
    first = sampler.sample().devices[0]
    assert (first.pcie_tx_kbs, first.pcie_rx_kbs) == (None, None)  # a rate needs two readings
    # one second later the H100 hashing loop had moved ~1.5 MB out and ~1.4 MB in
    gpu.pcie_tx_bytes, gpu.pcie_rx_bytes, gpu.counters_time_us = 1527 * 1024, 1418 * 1024, 1_000_000
    clock.t += 1
    second = sampler.sample().devices[0]
    assert (second.pcie_tx_kbs, second.pcie_rx_kbs) == (1527, 1418)
    assert "nvmlDeviceGetPcieThroughput" not in fake.call_counts
    assert sampler._devices[0].pcie.mode == COUNTERS
    gpu.pcie_tx_bytes, gpu.counters_time_us = 0, 2_000_000  # counter reset: no rate, no error
    clock.t += 1
    third = sampler.sample()
    assert third.devices[0].pcie_tx_kbs is None and third.errors == []


def test_without_counters_the_throughput_is_read_on_a_slow_cadence():
    gpu = FakeGpu(pcie_tx_kbs=1545, pcie_rx_kbs=1407, pcie_counters=False)
    fake, clock = FakeNvml([gpu]), Clock()
    sampler = open_fake(fake, clock)
    readings = []
    for _ in range(int(SLOW_EVERY_S) * 2):
        readings.append(sampler.sample().devices[0].pcie_tx_kbs)
        clock.t += 1
    assert sampler._devices[0].pcie.mode == THROUGHPUT
    assert readings[0] == 1545 and readings[int(SLOW_EVERY_S)] == 1545
    assert readings.count(None) == len(readings) - 2  # None between readings, not the old value
    assert fake.call_counts["nvmlDeviceGetPcieThroughput"] == 4  # TX + RX, twice in 60 samples


def test_a_library_without_field_values_falls_back():
    fake, clock = FakeNvml([FakeGpu(pcie_tx_kbs=10, pcie_rx_kbs=20)]), Clock()
    fake.remove("nvmlDeviceGetFieldValues")
    snap = open_fake(fake, clock).sample()
    assert (snap.devices[0].pcie_tx_kbs, snap.devices[0].pcie_rx_kbs) == (
        10,
        20,
    ) and snap.errors == []


def test_accounting_records_running_and_exited_pids():
    gpu = FakeGpu(compute=[FakeProcess(2236, 520 * MIB)])
    gpu.accounting = {  # the H100's answers: 15 s into the hashing loop, and a user that already exited
        2236: FakeAccounting(50, 0, 520 * MIB, NOW_US - 15_000_000, 15_000, running=True),
        1999: FakeAccounting(57, 0, 520 * MIB, NOW_US - 3600_000_000, 20_399, running=False),
    }
    fake, clock = FakeNvml([gpu]), Clock()
    sampler = open_fake(fake, clock)
    sampler.sample()
    assert sampler.accounting() == ([], []) and sampler.accounting_status() == {
        0: False
    }  # off by default
    assert sampler.set_accounting(True) == [("changed", "nvml gpu0: accounting mode on (was off)")]
    assert sampler.set_accounting(True) == [
        ("unchanged", "nvml gpu0: accounting mode on (was already)")
    ]
    records, errors = sampler.accounting()
    assert errors == []
    by_pid = {r.pid: r for r in records}
    assert (
        by_pid[2236].running
        and by_pid[2236].gpu_util == 50.0
        and by_pid[2236].max_memory == 520 * MIB
    )
    assert not by_pid[1999].running and by_pid[1999].duration_s == pytest.approx(20.399)
    assert by_pid[1999].start_time == pytest.approx(NOW - 3600)


def test_accounting_errors_are_lines_not_exceptions():
    gpu = FakeGpu(accounting_mode=1, failing={"nvmlDeviceGetAccountingPids": 4})
    sampler = open_fake(FakeNvml([gpu]), Clock())
    sampler.sample()
    assert sampler.accounting() == ([], ["nvml gpu0 accounting: Insufficient Permissions"])


def _h100_history(
    start_us: int, n: int = 70, gpu: int = 100, mem: int = 0, power_mw: int = 395_000
):
    """nvmlDeviceGetSamples as the H100 kept it: ~70 samples, one per ~200 ms."""
    return {
        1: [(start_us + i * 200_000, gpu) for i in range(n)],
        2: [(start_us + i * 200_000, mem) for i in range(n)],
        0: [(start_us + i * 200_000, power_mw + (i % 3) * 1000) for i in range(n)],
    }


def test_history_credits_the_sole_user_with_the_device_samples():
    gpu = FakeGpu(
        compute=[FakeProcess(2236, 520 * MIB)], history=_h100_history(NOW_US - 14_000_000)
    )
    sampler = open_fake(FakeNvml([gpu]), Clock())
    sampler.sample()
    history = sampler.history()
    assert len(history) == 14 and [s.time for s in history] == sorted(s.time for s in history)
    usage = history[0].processes[0]
    assert (usage.pid, usage.sm_util, usage.mem_util, usage.used_memory) == (2236, 100.0, 0.0, None)
    assert history[0].devices[0].power_w == pytest.approx(396.0, abs=1.0)
    shared = FakeGpu(
        compute=[FakeProcess(1, MIB), FakeProcess(2, MIB)],
        history=_h100_history(NOW_US - 14_000_000),
    )
    sampler = open_fake(FakeNvml([shared]), Clock())
    sampler.sample()
    assert all(s.processes == [] and s.devices[0].gpu_util == 100.0 for s in sampler.history())


def test_history_of_a_driver_without_samples_is_empty():
    sampler = open_fake(FakeNvml([FakeGpu()]), Clock())
    sampler.sample()
    assert sampler.history() == []


def test_accounting_reaches_the_process_it_belongs_to():
    from gpuguard.events.gpu_accounting import GpuAccounting

    c = Correlator(facts_provider=None)
    c.feed(ProcessFacts(pid=2236, start_time=NOW - 700, comm="worker", exe="/opt/svc/bin/worker"))
    c.feed(GpuAccounting(2236, "nvidia", 0, None, 99.0, 0.0, 520 * MIB, NOW - 690, 690.0, True))
    c.feed(
        GpuAccounting(2236, "nvidia", 0, None, 10.0, 0.0, MIB, NOW - 9000, 60.0, True)
    )  # an older pid 2236
    state = c.state_of(2236)
    r = SignalReader(state, NOW)
    assert (r["gpu_lifetime_util_mean"], r["gpu_lifetime_s"]) == (99.0, 690.0)
    c.feed(ProcessFacts(pid=3000, start_time=NOW - 700, comm="other", exe="/usr/bin/other"))
    assert (
        SignalReader(c.state_of(3000), NOW)["gpu_lifetime_s"] is None
    )  # accounting off / never on a GPU


def test_the_names_the_adapter_calls_exist_in_the_real_pynvml():
    for name in (
        "nvmlDeviceGetFieldValues",
        "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
        "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
        "nvmlDeviceGetSamples",
        "NVML_GPU_UTILIZATION_SAMPLES",
        "NVML_MEMORY_UTILIZATION_SAMPLES",
        "NVML_TOTAL_POWER_SAMPLES",
        "nvmlDeviceGetAccountingMode",
        "nvmlDeviceSetAccountingMode",
        "nvmlDeviceGetAccountingPids",
        "nvmlDeviceGetAccountingStats",
        "NVML_FEATURE_ENABLED",
        "NVML_FEATURE_DISABLED",
        "NVML_SUCCESS",
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_FUNCTION_NOT_FOUND",
    ):
        assert hasattr(pynvml, name), name
        assert hasattr(FakeNvml().module, name), name
    assert [f[0] for f in pynvml.c_nvmlFieldValue_t._fields_] == [
        f[0] for f in FakeNvml().module.c_nvmlFieldValue_t._fields_
    ]
    assert [f[0] for f in pynvml.c_nvmlAccountingStats_t._fields_] == [
        f[0] for f in FakeNvml().module.c_nvmlAccountingStats_t._fields_
    ]
