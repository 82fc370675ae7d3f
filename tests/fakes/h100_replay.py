"""The real H100 recordings (tests/traces/h100) played into the fake ``pynvml``, a second at a time.

Each ``gpus --json`` line recorded on the H100 becomes the state of a :class:`FakeGpu`: the
device figures as NVML gave them, and the recording's one GPU process under a pid the caller
chooses (a real process it started, so /proc has it).  Code reading NVML then sees what the
H100 reported, in order.  The PCIe byte counters advance by the recorded KB/s, per-process
utilisation gets one sample stamped now, and the driver's sample history one value per 200 ms
(the H100 kept one per ~200 ms; a recorded second's value stands for its five).

Used by the GPU tests that take either NVML (tests/support/nvml_choice.py) and by the device
check's dry run (benchmarks/device/fake_host.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.fakes.fake_pynvml import FakeGpu, FakeProcess

TRACES = Path(__file__).resolve().parent.parent / "traces" / "h100"
HISTORY_SAMPLES = 70  # what nvmlDeviceGetSamples returned on the H100 (~14 s)
GPU_SAMPLES, MEMORY_SAMPLES, POWER_SAMPLES = 1, 2, 0  # pynvml's sampling types


def load_trace(name: str) -> list[dict]:
    """The lines of ``NAME.gpus.jsonl`` (or the one document of ``idle.gpus.json``)."""
    path = TRACES / (f"{name}.gpus.json" if name == "idle" else f"{name}.gpus.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def idle_gpu() -> FakeGpu:
    """The traced H100 at rest, as ``gpus --json`` saw it with nothing running."""
    device = load_trace("idle")[0]["devices"][0]
    gpu = FakeGpu(
        name=device["name"],
        uuid=device["uuid"],
        bus_id=device["pci_bus_id"],
        memory_total=device["memory_total"],
        power_limit_mw=int(device["power_limit_w"] * 1000),
        sm_clock_max=device["extra"]["sm_clock_max_mhz"],
    )
    _apply_device(gpu, device)
    return gpu


def driver_version() -> str:
    return load_trace("idle")[0]["devices"][0]["driver_version"]


def _apply_device(gpu: FakeGpu, device: dict) -> None:
    gpu.util_gpu = int(device["gpu_util"])
    gpu.util_memory = int(device["mem_util"])
    gpu.memory_used = device["memory_used"]
    gpu.power_mw = int(device["power_w"] * 1000)
    gpu.sm_clock = device["sm_clock_mhz"]
    gpu.mem_clock = device["mem_clock_mhz"]
    gpu.temperature = int(device["temperature_c"])
    gpu.pcie_tx_kbs, gpu.pcie_rx_kbs = device["pcie_tx_kbs"] or 0, device["pcie_rx_kbs"] or 0


class TraceFeed:
    """Plays one recording into ``gpu``: :meth:`step` applies the next recorded second."""

    def __init__(
        self,
        gpu: FakeGpu,
        name: str,
        pid: int | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gpu, self.name, self.pid, self.clock = gpu, name, pid, clock
        self.records = load_trace(name)
        self.position = 0
        self._last: float | None = None

    def step(self) -> dict:
        """Apply the next recorded second (the recording starts over at its end); return it."""
        record = self.records[self.position % len(self.records)]
        self.position += 1
        now = self.clock()
        elapsed = 1.0 if self._last is None else max(now - self._last, 0.0)
        self._last = now
        now_us = int(now * 1_000_000)
        gpu = self.gpu
        device = record["devices"][0]
        _apply_device(gpu, device)
        gpu.pcie_tx_bytes += int(gpu.pcie_tx_kbs * 1024 * elapsed)
        gpu.pcie_rx_bytes += int(gpu.pcie_rx_kbs * 1024 * elapsed)
        gpu.counters_time_us = now_us
        for kind, value in (
            (GPU_SAMPLES, gpu.util_gpu),
            (MEMORY_SAMPLES, gpu.util_memory),
            (POWER_SAMPLES, gpu.power_mw),
        ):
            series = gpu.history.setdefault(kind, [])
            series.extend((now_us - 800_000 + i * 200_000, value) for i in range(5))
            del series[:-HISTORY_SAMPLES]
        processes = record["processes"][:1] if self.pid is not None else []
        gpu.compute = [FakeProcess(self.pid, p["used_memory"]) for p in processes]
        gpu.util_samples = [
            (self.pid, now_us, int(p["sm_util"]), int(p["mem_util"] or 0), 0, 0)
            for p in processes
            if p["sm_util"] is not None
        ]
        return record

    def rest(self) -> None:
        """Back to the idle recording: no process, the device at rest."""
        _apply_device(self.gpu, load_trace("idle")[0]["devices"][0])
        self.gpu.compute, self.gpu.util_samples = [], []
