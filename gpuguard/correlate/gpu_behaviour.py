"""Per-process GPU behaviour windows: the fingerprint of how a process uses its GPU.

:class:`GpuBehaviour` keeps, per process and bounded, the memory-controller load, power and
PCIe rate (device figures only while the process is the device's only user, ``solo``),
allocation stability and the duty-cycle shape (while watched or not, day or night).
:func:`profile` classifies them; ``gpuguard.detect.signals.gpu_behaviour`` reads it.  A figure no
vendor gave is ``None``, never 0.  What each window means and why: docs/gpus.md,
"Behaviour fingerprints"; cost: benchmarks/bench_behaviour.py.
"""

from __future__ import annotations

import math

from gpuguard.correlate.windows import SampleWindow

BEHAVIOUR_WINDOW_S = 300.0
ACTIVE_SM_PERCENT = 50.0
MAX_GAP_S = 60.0  # a longer gap between samples is not counted as observed time
NIGHT_HOURS = frozenset({22, 23, 0, 1, 2, 3, 4, 5})  # UTC, like the hour_of_day signal
MIN_PROFILE_SAMPLES = 5
MIN_PROFILE_WINDOW_S = 10.0
# Profile thresholds (percent): measured on an H100, see shared/traces/h100 and docs/gpus.md.
FLAT_SM_MEAN = 90.0  # hashing loop: 98.8
FLAT_SM_STDDEV = 3.0  # hashing loop: 0.7; CNN training: 22.6
COMPUTE_BOUND_MEMCTL = 10.0  # hashing loop: 0; CNN training: 61
MEMORY_HARD_MEMCTL = 80.0  # Ethash/KawPow/Autolykos keep the memory controller near 100
MEMORY_HARD_MEMCTL_STDDEV = 5.0
MEMORY_HARD_MIN_BYTES = 1 << 30
IDLE_SM_MEAN = 20.0
MIB = 1 << 20
# Programs a person or script runs to look at the GPU or the processes (kernel comm names).
MONITOR_NAMES = frozenset(
    {"nvidia-smi", "nvtop", "nvitop", "gpustat", "top", "htop", "btop", "atop", "glances"}
)


class GpuBehaviour:
    """Bounded behaviour windows of one process (see the module docstring)."""

    __slots__ = (
        "memctl",
        "power",
        "pcie_kbs",
        "alloc_bytes",
        "alloc_since",
        "last_time",
        "samples",
        "active",
        "watched_samples",
        "watched_active",
        "unwatched_samples",
        "unwatched_active",
        "day_s",
        "day_active_s",
        "night_s",
        "night_active_s",
    )

    def __init__(self, span_s: float = BEHAVIOUR_WINDOW_S) -> None:
        self.memctl = SampleWindow(span_s)
        self.power = SampleWindow(span_s)
        self.pcie_kbs = SampleWindow(span_s)
        self.alloc_bytes: int | None = None
        self.alloc_since: float | None = None
        self.last_time: float | None = None
        self.samples = self.active = 0
        self.watched_samples = self.watched_active = 0
        self.unwatched_samples = self.unwatched_active = 0
        self.day_s = self.day_active_s = self.night_s = self.night_active_s = 0.0

    def add(
        self,
        time: float,
        sm_util: float | None,
        mem_util: float | None,
        used_memory: int | None,
        solo_memctl: float | None = None,
        solo_power_w: float | None = None,
        solo_pcie_kbs: float | None = None,
        watched: bool = False,
    ) -> None:
        """One sample of the process (and of its device, ``solo_*``, when it is the device's only user)."""
        memctl = solo_memctl if solo_memctl is not None else mem_util
        if memctl is not None:
            self.memctl.add(time, memctl)
        if solo_power_w is not None:
            self.power.add(time, solo_power_w)
        if solo_pcie_kbs is not None:
            self.pcie_kbs.add(time, solo_pcie_kbs)
        if used_memory is not None and used_memory != self.alloc_bytes:
            self.alloc_bytes, self.alloc_since = used_memory, time
        previous, self.last_time = self.last_time, time
        if sm_util is None:
            return
        active = sm_util >= ACTIVE_SM_PERCENT
        self.samples += 1
        self.active += active
        if watched:
            self.watched_samples += 1
            self.watched_active += active
        else:
            self.unwatched_samples += 1
            self.unwatched_active += active
        if previous is not None and 0 < time - previous <= MAX_GAP_S:
            gap = time - previous
            if int(time // 3600) % 24 in NIGHT_HOURS:
                self.night_s += gap
                self.night_active_s += gap if active else 0.0
            else:
                self.day_s += gap
                self.day_active_s += gap if active else 0.0

    @property
    def untouched(self) -> bool:
        """No sample was ever added (every one sets ``last_time``)."""
        return self.last_time is None

    # -- derived figures (None: not available) -----------------------------------

    def allocation_stable_s(self) -> float | None:
        if self.alloc_since is None or self.last_time is None:
            return None
        return self.last_time - self.alloc_since

    def power_variation(self) -> float | None:
        """Device power standard deviation / mean while the process was its only user."""
        mean, variance = self.power.mean, self.power.variance
        if mean is None or variance is None or mean <= 0:
            return None
        return math.sqrt(variance) / mean

    def pcie_mb_s(self) -> float | None:
        mean = self.pcie_kbs.mean
        return mean / 1000.0 if mean is not None else None

    def duty_cycle(self) -> float | None:
        return self.active / self.samples if self.samples else None

    def pauses_when_watched(self, min_samples: int = 3) -> bool | None:
        """Active almost always unwatched, almost never while a monitor runs (None: too few of either)."""
        if self.watched_samples < min_samples or self.unwatched_samples < min_samples:
            return None
        return (
            self.unwatched_active / self.unwatched_samples >= 0.8
            and self.watched_active / self.watched_samples <= 0.2
        )

    def night_only(self, min_observed_s: float = 1800.0) -> bool | None:
        """Active most of the observed night and almost none of the observed day (None: too little of either)."""
        if self.night_s < min_observed_s or self.day_s < min_observed_s:
            return None
        return self.night_active_s / self.night_s >= 0.6 and self.day_active_s / self.day_s <= 0.1


def _mb(kbs: float) -> str:
    return f"{kbs / 1000.0:.1f} MB/s" if kbs < 1_000_000 else f"{kbs / 1_000_000:.1f} GB/s"


def _size(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MIB:.0f} MiB"


def profile(sm: SampleWindow, behaviour: GpuBehaviour) -> str | None:
    """``"<kind>: <figures>"`` where kind is compute-bound, memory-hard, flat, varying or idle; None: too little data.

    compute-bound: SM flat near 100 % with the memory controller nearly idle (hash loops);
    memory-hard: memory controller flat near 100 % on a multi-GB allocation that never changed
    (DAG-based miners); flat: SM flat near 100 % with no memory-controller figure or a busy one;
    varying: SM moves (training, batch jobs); idle: SM mostly low (inference between requests).
    """
    n = len(sm)
    if n < MIN_PROFILE_SAMPLES or sm.duration_s < MIN_PROFILE_WINDOW_S:
        return None
    mean, variance = sm.mean, sm.variance
    assert mean is not None and variance is not None
    stddev = math.sqrt(variance)
    memctl = behaviour.memctl.mean
    memctl_var = behaviour.memctl.variance
    stable_s = behaviour.allocation_stable_s()
    alloc = behaviour.alloc_bytes
    window = sm.duration_s
    stable_whole_window = stable_s is not None and stable_s >= window - 1.0
    if (
        memctl is not None
        and memctl_var is not None
        and memctl >= MEMORY_HARD_MEMCTL
        and math.sqrt(memctl_var) <= MEMORY_HARD_MEMCTL_STDDEV
        and alloc is not None
        and alloc >= MEMORY_HARD_MIN_BYTES
        and stable_whole_window
    ):
        kind = "memory-hard"
    elif mean >= FLAT_SM_MEAN and stddev <= FLAT_SM_STDDEV:
        kind = "compute-bound" if memctl is not None and memctl <= COMPUTE_BOUND_MEMCTL else "flat"
    elif mean < IDLE_SM_MEAN:
        kind = "idle"
    else:
        kind = "varying"
    parts = [f"SM {mean:.0f} ± {stddev:.1f}% for {window:.0f} s"]
    if memctl is not None:
        parts.append(f"memory-controller {memctl:.0f}%")
    pcie = behaviour.pcie_kbs.mean
    if pcie is not None:
        parts.append(f"PCIe {_mb(pcie)}")
    if alloc is not None and stable_s is not None:
        parts.append(f"allocation {_size(alloc)} unchanged for {stable_s:.0f} s")
    return f"{kind}: " + ", ".join(parts)
