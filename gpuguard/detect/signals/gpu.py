"""Rule signals of GPU use: device opens, ioctls and their rates, utilisation and memory windows."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal

RATE_PERIOD_S = 10.0  # a rate over the last minute falls within 10 s of a process going quiet


@signal(
    "gpu_device_classes",
    "texts",
    "gpu",
    "GPU device classes opened (nvidia, nvidia-ctl, nvidia-uvm, kfd, drm-render, pci-bar, mem...)",
    reads=("gpu_device_classes",),
)
def gpu_device_classes(s: ProcessState, now: float) -> set[str]:
    return s.gpu_device_classes


@signal(
    "device_classes_written",
    "texts",
    "gpu",
    "device classes it opened for writing (msr, msr-config, hugepages-config: CPU miners tuning the host)",
    reads=("device_classes_written",),
)
def device_classes_written(s: ProcessState, now: float) -> set[str]:
    return s.device_classes_written


@signal("gpu_paths", "texts", "gpu", "GPU device paths opened", reads=("gpu_paths",))
def gpu_paths(s: ProcessState, now: float) -> set[str]:
    return s.gpu_paths


@signal(
    "ioctl_names", "texts", "gpu", "decoded GPU ioctl command names issued", reads=("ioctl_counts",)
)
def ioctl_names(s: ProcessState, now: float) -> set[str]:
    return set(s.ioctl_counts)


@signal(
    "ioctl_categories",
    "texts",
    "gpu",
    "GPU ioctl categories issued (submit, memory, query, setup, other)",
    reads=("ioctl_categories",),
)
def ioctl_categories(s: ProcessState, now: float) -> set[str]:
    return s.ioctl_categories


@signal("ioctl_total", "number", "gpu", "GPU ioctls issued in total", reads=("ioctl_total",))
def ioctl_total(s: ProcessState, now: float) -> int:
    return s.ioctl_total


@signal(
    "ioctl_query_only",
    "bool",
    "gpu",
    "every GPU ioctl was a query or set-up (a monitor, not a compute job)",
    reads=("ioctl_categories",),
)
def ioctl_query_only(s: ProcessState, now: float) -> bool | None:
    if not s.ioctl_categories:
        return None
    return s.ioctl_categories <= {"query", "setup"}


def _category_rate(s: ProcessState, now: float, category: str) -> float:
    window = s.ioctl_rates.get(category)
    return window.rate(now) if window is not None else 0.0


@signal(
    "ioctl_rate_submit",
    "number",
    "gpu",
    "'submit' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_rate_submit(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "submit")


@signal(
    "ioctl_rate_memory",
    "number",
    "gpu",
    "'memory' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_rate_memory(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "memory")


@signal(
    "ioctl_rate_query",
    "number",
    "gpu",
    "'query' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_rate_query(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "query")


@signal(
    "ioctl_rate_setup",
    "number",
    "gpu",
    "'setup' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_rate_setup(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "setup")


@signal(
    "ioctl_rate_other",
    "number",
    "gpu",
    "'other' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_rate_other(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "other")


@signal(
    "ioctl_command_rate",
    "number",
    "gpu",
    "GPU ioctls per second over the last minute of one decoded command, "
    "named by the condition's `command:` (e.g. UVM_REGISTER_CHANNEL)",
    parameter="command",
    reads=("ioctl_command_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def ioctl_command_rate(s: ProcessState, now: float, command: str | None = None) -> float | None:
    if command is None:
        return None
    window = s.ioctl_command_rates.get(command)
    return window.rate(now) if window is not None else 0.0


@signal(
    "gpu_util_mean",
    "number",
    "gpu",
    "mean per-process GPU (SM) utilisation %, last 5 minutes",
    reads=("gpu_util",),
)
def gpu_util_mean(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.mean


@signal(
    "gpu_util_variance",
    "number",
    "gpu",
    "variance of per-process GPU utilisation, last 5 minutes (miners: very low)",
    reads=("gpu_util",),
)
def gpu_util_variance(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.variance


@signal(
    "gpu_util_min",
    "number",
    "gpu",
    "lowest per-process GPU utilisation %, last 5 minutes",
    reads=("gpu_util",),
)
def gpu_util_min(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.minimum


@signal(
    "gpu_util_latest", "number", "gpu", "latest per-process GPU utilisation %", reads=("gpu_util",)
)
def gpu_util_latest(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.latest


@signal(
    "gpu_util_samples",
    "number",
    "gpu",
    "GPU utilisation samples in the window",
    reads=("gpu_util",),
)
def gpu_util_samples(s: ProcessState, now: float) -> int:
    return len(s.gpu_util)


@signal(
    "gpu_util_window_s",
    "number",
    "gpu",
    "seconds covered by the GPU utilisation window",
    reads=("gpu_util",),
)
def gpu_util_window_s(s: ProcessState, now: float) -> float:
    return s.gpu_util.duration_s


@signal("gpu_memory_bytes", "number", "gpu", "GPU memory used now, bytes", reads=("gpu_memory",))
def gpu_memory_bytes(s: ProcessState, now: float) -> float | None:
    return s.gpu_memory.latest


@signal(
    "gpu_memory_fraction",
    "number",
    "gpu",
    "GPU memory used / total of its GPUs (0-1)",
    reads=("gpu_memory", "gpu_memory_total"),
)
def gpu_memory_fraction(s: ProcessState, now: float) -> float | None:
    used = s.gpu_memory.latest
    if used is None or not s.gpu_memory_total:
        return None
    return used / s.gpu_memory_total
