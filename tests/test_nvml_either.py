"""The NVML adapter against whichever NVML the run gives: the fake by default, the real GPU with
``GPUGUARD_REAL_NVML=1`` (benchmarks/device_check.sh on a GPU machine; tests/support/nvml_choice.py).

Each test asserts what holds on any NVIDIA GPU: contract units and ranges, the process it
started being listed with its memory and SM use, the 20 ms PCIe call kept off the sample path,
an idle GPU reading the same twice.  On the fake the figures are the real H100's recordings.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from gpuguard.agent.stages.s1_produce.producers import quiet_view
from gpuguard.sources.gpu import nvml
from tests.support.nvml_choice import (
    NvmlUnderTest,
    open_nvml,
    start_gpu_process,
    stop_gpu_process,
)

pytestmark = pytest.mark.gpu

BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
SETTLE_S = 20.0  # a process's memory leaves NVML's view within this after it exits


@pytest.fixture
def under_test() -> NvmlUnderTest:
    return open_nvml()


@pytest.fixture
def gpu_process(under_test):
    process = start_gpu_process(under_test)
    try:
        yield process
    finally:
        stop_gpu_process(process)


class CallCount:
    """The library with each ``nvml*`` function counted (the real module is left untouched)."""

    def __init__(self, module) -> None:
        self.counts: dict[str, int] = {}
        self.module = type(sys)("pynvml")
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("nvml") and callable(value):
                value = self._counted(name, value)
            setattr(self.module, name, value)

    def _counted(self, name, fn):
        def call(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call


def test_every_device_reads_in_contract_units(under_test):
    library = under_test.library()
    sampler = nvml.open_sampler(library=library)
    try:
        snap = sampler.sample()
        under_test.tick()
        again = sampler.sample()
    finally:
        sampler.close()
    assert snap.errors == [] and again.errors == [], (snap.errors, again.errors)
    assert len(snap.devices) >= 1
    for dev in again.devices:
        assert dev.extra["state"] == "ok" and dev.vendor == "nvidia"
        assert dev.name and dev.uuid.startswith(("GPU-", "MIG-")), (dev.name, dev.uuid)
        assert BUS_ID.match(dev.pci_bus_id), dev.pci_bus_id
        assert re.match(r"^\d+\.\d+", dev.driver_version), dev.driver_version
        assert 0 < dev.memory_used <= dev.memory_total
        assert 0 <= dev.gpu_util <= 100 and 0 <= dev.mem_util <= 100
        assert 0 < dev.power_w <= 1.5 * dev.power_limit_w and dev.power_limit_w >= 50
        assert 0 < dev.sm_clock_mhz <= dev.extra["sm_clock_max_mhz"]
        assert dev.mem_clock_mhz > 0 and 0 < dev.temperature_c < 110
        assert isinstance(dev.mig_mode, bool)


def test_pcie_rates_arrive_without_the_20ms_call_on_every_sample(under_test):
    counted = CallCount(under_test.library())
    sampler = nvml.open_sampler(library=counted.module)
    try:
        rates = []
        for _ in range(4):
            rates.append(sampler.sample().devices[0].pcie_tx_kbs)
            under_test.tick()
        mode = sampler._devices[0].pcie.mode
    finally:
        sampler.close()
    assert any(r is not None and r >= 0 for r in rates), rates
    # byte counters: never; the throughput fallback: TX + RX once per slow period
    assert counted.counts.get("nvmlDeviceGetPcieThroughput", 0) <= 2, (mode, counted.counts)


def test_a_gpu_process_is_listed_with_its_memory_and_sm_use(under_test, gpu_process):
    sampler = nvml.open_sampler(library=under_test.library())
    try:
        seen = []
        for _ in range(6):  # the first sighting carries no utilisation (NVML's first sample)
            mine = [p for p in sampler.sample().processes if p.pid == gpu_process.pid]
            seen += mine
            if mine and mine[0].sm_util is not None:
                break
            under_test.tick()
        uuids = {d.uuid for d in sampler.sample().devices}
    finally:
        sampler.close()
    assert seen, f"pid {gpu_process.pid} never listed"
    last = seen[-1]
    assert last.kind == "compute" and last.device_uuid in uuids
    assert last.used_memory and last.used_memory >= 64 << 20, last.used_memory
    assert last.ns_pid is None  # the test's own pid namespace: no container pid to map
    assert last.sm_util is not None and last.sm_util >= 50, last  # a hashing loop keeps SM busy


def test_gpus_command_names_the_gpu_process(under_test, gpu_process, monkeypatch, capsys):
    from gpuguard.cli import main

    monkeypatch.setitem(sys.modules, "pynvml", under_test.library())
    assert main(["gpus", "--json", "--source", "nvml"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sources"] == ["nvml"] and len(doc["devices"]) >= 1
    (row,) = [p for p in doc["processes"] if p["pid"] == gpu_process.pid]
    assert row["name"] == gpu_process.comm and row["used_memory"] > 0


def test_an_idle_gpu_reads_the_same_twice(under_test):
    sampler = nvml.open_sampler(library=under_test.library())
    try:
        views = []
        for _ in range(int(SETTLE_S / 0.5)):
            views.append(quiet_view(sampler.sample()))
            if len(views) >= 3 and views[-1] is not None and views[-1] == views[-2] == views[-3]:
                break
            under_test.tick(0.5)
    finally:
        sampler.close()
    assert views[-1] is not None and views[-1] == views[-2] == views[-3], views[-3:]


def test_the_driver_history_is_one_snapshot_per_second(under_test, gpu_process):
    sampler = nvml.open_sampler(library=under_test.library())
    try:
        sampler.sample()
        under_test.tick()
        history = sampler.history()
    finally:
        sampler.close()
    assert len(history) >= 2, history
    times = [s.time for s in history]
    assert times == sorted(set(times)) and all(t == int(t) for t in times)
    for snap in history:
        for dev in snap.devices:
            assert 0 <= dev.gpu_util <= 100 and dev.extra["history"] is True
            assert dev.power_w is None or 0 < dev.power_w < 2000
