"""What one ``NvmlSampler.sample()`` costs per GPU, with every NVML call it makes timed.

The sampler gets the library through a proxy module whose ``nvml*`` functions note their own
time (the real module stays untouched); everything else (constants, error classes, ctypes
structs) is the library's own object.  Goal: 2 ms per GPU per sample.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable
from types import ModuleType

from gpuguard.sources.gpu import nvml

GOAL_MS = 2.0
WARM_UP = 2  # the first samples acquire handles and take the PCIe counters' baseline


class TimedLibrary:
    def __init__(self, module: ModuleType) -> None:
        self.calls: dict[str, list[float]] = {}
        self.module = types.ModuleType(module.__name__)
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("nvml") and callable(value) and not isinstance(value, type):
                value = self._timed(name, value)
            setattr(self.module, name, value)

    def _timed(self, name: str, fn: Callable) -> Callable:
        times = self.calls.setdefault(name, [])

        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - started)

        return call

    def reset(self) -> None:
        for times in self.calls.values():
            times.clear()


def _stats_ms(values: list[float]) -> dict:
    if not values:
        return {}
    ms = sorted(v * 1000 for v in values)
    return {
        "median": round(statistics.median(ms), 4),
        "p90": round(ms[int(0.9 * (len(ms) - 1))], 4),
        "max": round(ms[-1], 4),
    }


def measure(module: ModuleType, samples: int = 40, interval_s: float = 0.1) -> dict:
    """``samples`` timed samples, ``interval_s`` apart, after WARM_UP untimed ones."""
    timed = TimedLibrary(module)
    sampler = nvml.open_sampler(library=timed.module)
    try:
        for _ in range(WARM_UP):
            sampler.sample()
            time.sleep(interval_s)
        timed.reset()
        durations, gpus, processes = [], 0, 0
        for _ in range(samples):
            started = time.perf_counter()
            snap = sampler.sample()
            durations.append(time.perf_counter() - started)
            gpus, processes = len(snap.devices), max(processes, len(snap.processes))
            time.sleep(interval_s)
        pcie = sorted({d.pcie.mode for d in sampler._devices if d.pcie is not None})
        errors = snap.errors
    finally:
        sampler.close()
    per_sample = _stats_ms(durations)
    per_gpu = round(per_sample["median"] / max(gpus, 1), 4)
    return {
        "gpus": gpus,
        "processes": processes,
        "samples": samples,
        "sample_ms": per_sample,
        "per_gpu_ms": per_gpu,
        "goal_ms": GOAL_MS,
        "meets_goal": per_gpu <= GOAL_MS,
        "pcie_mode": pcie,
        "errors_last_sample": errors,
        "calls": {
            name: {"per_sample": round(len(times) / samples, 2), "ms": _stats_ms(times)}
            for name, times in sorted(timed.calls.items())
            if times
        },
    }
