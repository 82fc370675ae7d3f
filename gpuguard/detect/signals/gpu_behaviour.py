"""Rule signals of GPU behaviour over time (correlate.gpu_behaviour) and NVML accounting."""

from __future__ import annotations

from gpuguard.correlate.gpu_behaviour import profile
from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal


@signal(
    "gpu_profile",
    "text",
    "gpu-behaviour",
    "GPU behaviour profile and its figures: 'compute-bound: SM 99 ± 0.7% for 74 s, memory-controller 0%, ...' "
    "(kinds: compute-bound, memory-hard, flat, varying, idle)",
    reads=("gpu_behaviour", "gpu_util"),
)
def gpu_profile(s: ProcessState, now: float) -> str | None:
    return profile(s.gpu_util, s.gpu_behaviour)


@signal(
    "gpu_memory_controller_mean",
    "number",
    "gpu-behaviour",
    "mean memory-controller load % (the device's while it is the only user, else its own NVML share), last 5 minutes",
    reads=("gpu_behaviour",),
)
def gpu_memory_controller_mean(s: ProcessState, now: float) -> float | None:
    return s.gpu_behaviour.memctl.mean


@signal(
    "gpu_power_variation",
    "number",
    "gpu-behaviour",
    "device power standard deviation / mean while it was the device's only user (hashing loop on an H100: 0.02)",
    reads=("gpu_behaviour",),
)
def gpu_power_variation(s: ProcessState, now: float) -> float | None:
    return s.gpu_behaviour.power_variation()


@signal(
    "gpu_pcie_mb_s",
    "number",
    "gpu-behaviour",
    "device PCIe TX+RX MB/s while it was the device's only user, last 5 minutes (training: ~1,800; hashing: ~3)",
    reads=("gpu_behaviour",),
)
def gpu_pcie_mb_s(s: ProcessState, now: float) -> float | None:
    return s.gpu_behaviour.pcie_mb_s()


@signal(
    "gpu_allocation_stable_s",
    "number",
    "gpu-behaviour",
    "seconds its GPU memory has not changed",
    reads=("gpu_behaviour",),
)
def gpu_allocation_stable_s(s: ProcessState, now: float) -> float | None:
    return s.gpu_behaviour.allocation_stable_s()


@signal(
    "gpu_memory_growth_fraction",
    "number",
    "gpu-behaviour",
    "growth of its GPU memory over the last 5 minutes, as a fraction of its GPUs' total memory",
    reads=("gpu_memory", "gpu_memory_total"),
)
def gpu_memory_growth_fraction(s: ProcessState, now: float) -> float | None:
    latest, lowest = s.gpu_memory.latest, s.gpu_memory.minimum
    if latest is None or lowest is None or not s.gpu_memory_total:
        return None
    return max(0.0, latest - lowest) / s.gpu_memory_total


@signal(
    "gpu_device_shared",
    "bool",
    "gpu-behaviour",
    "another process used one of its GPUs in the latest sample",
    reads=("gpu_device_shared",),
)
def gpu_device_shared(s: ProcessState, now: float) -> bool | None:
    return s.gpu_device_shared


@signal(
    "gpu_duty_cycle",
    "number",
    "gpu-behaviour",
    "fraction of its GPU samples with SM >= 50 % (0-1)",
    reads=("gpu_behaviour",),
)
def gpu_duty_cycle(s: ProcessState, now: float) -> float | None:
    return s.gpu_behaviour.duty_cycle()


@signal(
    "gpu_pauses_when_watched",
    "bool",
    "gpu-behaviour",
    "busy while no monitor runs, idle while nvidia-smi/top/nvtop... run (at least 3 samples of each)",
    reads=("gpu_behaviour",),
)
def gpu_pauses_when_watched(s: ProcessState, now: float) -> bool | None:
    return s.gpu_behaviour.pauses_when_watched()


@signal(
    "gpu_night_only",
    "bool",
    "gpu-behaviour",
    "busy most of the observed night (22-06 UTC), idle by day (at least 30 min observed of each)",
    reads=("gpu_behaviour",),
)
def gpu_night_only(s: ProcessState, now: float) -> bool | None:
    return s.gpu_behaviour.night_only()


@signal(
    "gpu_lifetime_util_mean",
    "number",
    "gpu-behaviour",
    "lifetime average GPU utilisation % from NVML accounting mode (start-up included); absent when accounting is off",
    reads=("gpu_lifetime",),
)
def gpu_lifetime_util_mean(s: ProcessState, now: float) -> float | None:
    return s.gpu_lifetime.gpu_util if s.gpu_lifetime is not None else None


@signal(
    "gpu_lifetime_s",
    "number",
    "gpu-behaviour",
    "seconds it has used the GPU, from NVML accounting mode",
    reads=("gpu_lifetime",),
)
def gpu_lifetime_s(s: ProcessState, now: float) -> float | None:
    return s.gpu_lifetime.duration_s if s.gpu_lifetime is not None else None
