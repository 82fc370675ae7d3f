"""What NVML keeps of the past: per-process accounting and ~14 s of device samples.

Details: docs/internals.md, "nvml_history".
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.sources.gpu.nvml_library import SOURCE

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


# -- over every live GPU (the sampler passes its devices) ---------------------------


def accounting(nvml: ModuleType, devices: list) -> tuple[list[GpuAccounting], list[str]]:
    """NVML accounting records of every GPU where accounting mode is on, and one line per GPU that failed."""
    records: list[GpuAccounting] = []
    errors: list[str] = []
    for dev in devices:
        try:
            records += read_accounting(nvml, dev.handle, dev.index, dev.uuid)
        except nvml.NVMLError as exc:
            errors.append(f"nvml gpu{dev.index} accounting: {exc}")
    return records, errors


def accounting_status(nvml: ModuleType, devices: list) -> dict[int, bool | None]:
    """Whether accounting mode is on, per GPU index (None: NVML could not say)."""
    status: dict[int, bool | None] = {}
    for dev in devices:
        try:
            status[dev.index] = accounting_enabled(nvml, dev.handle)
        except nvml.NVMLError:
            status[dev.index] = None
    return status


def set_accounting(nvml: ModuleType, devices: list, on: bool) -> list[tuple[str, str]]:
    """Turn accounting mode on/off on every GPU (opt-in: it changes host state).

    One ``(outcome, line)`` per GPU: outcome ``changed``, ``unchanged`` or ``failed``, the line
    saying what happened."""
    results = []
    for dev in devices:
        try:
            before = accounting_enabled(nvml, dev.handle)
            if before != on:
                set_accounting_mode(nvml, dev.handle, on)
            results.append(
                (
                    "unchanged" if before == on else "changed",
                    f"nvml gpu{dev.index}: accounting mode {'on' if on else 'off'}"
                    + (" (was already)" if before == on else f" (was {'on' if before else 'off'})"),
                )
            )
        except nvml.NVMLError as exc:
            results.append(
                (
                    "failed",
                    f"nvml gpu{dev.index}: cannot turn accounting mode {'on' if on else 'off'}: {exc}",
                )
            )
    return results


def history_snapshots(
    nvml: ModuleType,
    devices: list,
    device_sample: Callable[..., DeviceSample],
    users_of: Callable[[Any, list[str]], set[int]],
) -> list[GpuSnapshot]:
    """The driver's ~14 s of device samples, one snapshot per second, oldest first.

    A device's only user (by the current process lists) is credited with the device's
    GPU and memory utilisation; a shared device's samples carry no process.  Memory and
    PCIe are not in the driver's history: they stay None.  ``device_sample(dev, **fields)``
    gives a device's sample with its identity, ``users_of(dev, errors)`` the pids using it.
    """
    kinds = (
        ("gpu_util", "NVML_GPU_UTILIZATION_SAMPLES"),
        ("mem_util", "NVML_MEMORY_UTILIZATION_SAMPLES"),
        ("power_mw", "NVML_TOTAL_POWER_SAMPLES"),
    )
    by_second: dict[int, GpuSnapshot] = {}
    errors: list[str] = []
    for dev in devices:
        series: dict[str, dict[int, float]] = {}
        for name, constant in kinds:
            try:
                series[name] = per_second(
                    read_device_samples(nvml, dev.handle, getattr(nvml, constant))
                )
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                    errors.append(f"nvml gpu{dev.index} sample history ({name}): {exc}")
                series[name] = {}
        users = users_of(dev, errors)
        sole = next(iter(users)) if len(users) == 1 else None
        for second in sorted(set().union(*series.values())):
            gpu, mem, power = (series[n].get(second) for n, _ in kinds)
            snap = by_second.setdefault(second, GpuSnapshot(time=float(second), source=SOURCE))
            snap.devices.append(
                device_sample(
                    dev,
                    gpu_util=gpu,
                    mem_util=mem,
                    power_w=power / 1000.0 if power is not None else None,
                    extra={"state": "ok", "history": True},
                )
            )
            if sole is not None and gpu is not None:
                snap.processes.append(
                    ProcessGpuUsage(
                        pid=sole,
                        vendor="nvidia",
                        device_index=dev.index,
                        device_uuid=dev.uuid,
                        sm_util=gpu,
                        mem_util=mem,
                    )
                )
    snapshots = [by_second[s] for s in sorted(by_second)]
    if snapshots and errors:
        snapshots[-1].errors.extend(errors)
    return snapshots
