"""One timestamped snapshot type for GPU telemetry, the same for every vendor.

A metric a device or driver cannot report is ``None`` ("not available"),
never an exception: callers test ``is None``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class DeviceSample:
    """One GPU at one moment."""

    vendor: str  # "nvidia" | "amd" | "drm"
    index: int
    name: str | None = None
    uuid: str | None = None  # stable id (NVML UUID, PCI bus id for DRM)
    pci_bus_id: str | None = None
    driver: str | None = None  # e.g. "nvidia", "amdgpu", "i915"
    driver_version: str | None = None
    gpu_util: float | None = None  # percent 0-100
    mem_util: float | None = None  # percent 0-100
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: float | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    mig_mode: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessGpuUsage:
    """One process's use of one GPU at one moment."""

    pid: int  # host pid, as the driver reports it
    vendor: str
    device_index: int
    device_uuid: str | None = None
    ns_pid: int | None = None  # pid inside the process's own pid namespace
    sm_util: float | None = None  # percent of the GPU's SMs / engines busy
    mem_util: float | None = None  # percent memory-controller busy
    enc_util: float | None = None
    dec_util: float | None = None
    used_memory: int | None = None  # bytes
    engines: dict[str, float] = field(default_factory=dict)  # engine -> percent busy
    memory_regions: dict[str, int] = field(default_factory=dict)  # region -> bytes
    kind: str | None = None  # "compute" | "graphics" | None


@dataclass(slots=True)
class GpuSnapshot:
    """Everything one sampler saw at ``time`` (seconds since the epoch)."""

    time: float
    source: str  # "nvml" | "amdsmi" | "drm-fdinfo" | "replay"
    devices: list[DeviceSample] = field(default_factory=list)
    processes: list[ProcessGpuUsage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per unavailable part

    def to_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> GpuSnapshot:
        try:
            return cls(
                time=record["time"],
                source=record["source"],
                devices=[DeviceSample(**d) for d in record.get("devices", [])],
                processes=[ProcessGpuUsage(**p) for p in record.get("processes", [])],
                errors=list(record.get("errors", [])),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad gpu snapshot record: {exc}") from None
