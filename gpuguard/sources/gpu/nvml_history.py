"""What NVML keeps of the past: per-process accounting and ~14 s of device samples.

Details: docs/internals.md, "nvml_history".
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from gpuguard.events.gpu_accounting import GpuAccounting

_VALUE_FIELDS = (
    "dVal",
    "uiVal",
    "ulVal",
    "ullVal",
    "sllVal",
    "siVal",
    "usVal",
)  # by NVML_VALUE_TYPE_*


def accounting_enabled(nvml: ModuleType, handle: Any) -> bool:
    return nvml.nvmlDeviceGetAccountingMode(handle) == nvml.NVML_FEATURE_ENABLED


def set_accounting_mode(nvml: ModuleType, handle: Any, on: bool) -> None:
    """Turn accounting on or off for one GPU (changes host state; root only)."""
    nvml.nvmlDeviceSetAccountingMode(
        handle, nvml.NVML_FEATURE_ENABLED if on else nvml.NVML_FEATURE_DISABLED
    )


def read_accounting(
    nvml: ModuleType, handle: Any, device_index: int, uuid: str | None
) -> list[GpuAccounting]:
    """Every pid NVML accounted on this GPU (running or exited); [] when accounting is off."""
    if not accounting_enabled(nvml, handle):
        return []
    out = []
    for pid in nvml.nvmlDeviceGetAccountingPids(handle):
        try:
            stats = nvml.nvmlDeviceGetAccountingStats(handle, pid)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_FOUND:  # dropped from the buffer meanwhile
                continue
            raise
        out.append(
            GpuAccounting(
                pid=int(pid),
                vendor="nvidia",
                device_index=device_index,
                device_uuid=uuid,
                gpu_util=float(stats.gpuUtilization),
                mem_util=float(stats.memoryUtilization),
                max_memory=int(stats.maxMemoryUsage) if stats.maxMemoryUsage is not None else None,
                start_time=stats.startTime / 1e6 if stats.startTime else None,
                duration_s=stats.time / 1000.0,
                running=bool(stats.isRunning),
            )
        )
    return out


def read_device_samples(
    nvml: ModuleType, handle: Any, sampling_type: int
) -> list[tuple[float, float]]:
    """``[(time s, value)]`` of one sampling type from the driver's buffer; [] when it holds none."""
    try:
        value_type, samples = nvml.nvmlDeviceGetSamples(handle, sampling_type, 0)
    except nvml.NVMLError as exc:
        if exc.value == nvml.NVML_ERROR_NOT_FOUND:
            return []
        raise
    field = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
    return [(s.timeStamp / 1e6, float(getattr(s.sampleValue, field))) for s in samples]


def per_second(samples: list[tuple[float, float]]) -> dict[int, float]:
    """Mean value per whole second (the driver samples every ~200 ms; the agent works at 1 Hz)."""
    sums: dict[int, list[float]] = {}
    for t, v in samples:
        entry = sums.setdefault(int(t), [0.0, 0])
        entry[0] += v
        entry[1] += 1
    return {second: total / count for second, (total, count) in sums.items()}
