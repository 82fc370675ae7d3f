"""Terminal tables and JSON for ``gpuguard gpus``: devices and per-process GPU use, every vendor.

Every string a process controls (its name, path, user name from a container's
passwd) goes through :func:`escape_text`, and cells are ``rich.text.Text`` so
``[bold]`` in a process name is shown, not interpreted as markup.  A metric
that is ``None`` is shown as ``N/A`` ("not available"), never as 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuguard.escape import escape_text
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage

NA = "N/A"


@dataclass(slots=True)
class ProcessLabel:
    """Who a GPU-using pid is, from /proc (or a recording's process facts)."""

    name: str = "?"
    exe: str = ""
    user: str = "?"
    container: str = ""  # "docker:3f2a1b4c5d6e", "containerd:…", pod uid, or ""


@dataclass(slots=True)
class GpuView:
    """What one refresh shows: snapshots from each working source, and why others are missing."""

    time: float
    snapshots: list[GpuSnapshot]
    labels: dict[int, ProcessLabel] = field(default_factory=dict)
    unavailable: list[str] = field(default_factory=list)


def view_to_json(view: GpuView) -> dict[str, Any]:
    """One JSON object; strings are left exact (JSON escaping makes them safe to print)."""
    devices, processes, errors = [], [], []
    for snap in view.snapshots:
        for dev in snap.devices:
            devices.append({"source": snap.source, **dataclasses.asdict(dev)})
        for proc in snap.processes:
            label = view.labels.get(proc.pid, ProcessLabel())
            processes.append(
                {"source": snap.source, **dataclasses.asdict(proc), **dataclasses.asdict(label)}
            )
        errors.extend(snap.errors)
    return {
        "time": view.time,
        "sources": [s.source for s in view.snapshots],
        "unavailable": view.unavailable,
        "devices": devices,
        "processes": processes,
        "errors": errors,
    }


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def _mib(value: int | None) -> str:
    return NA if value is None else f"{value / (1024 * 1024):,.0f} MiB"


def _watts(value: float | None) -> str:
    return NA if value is None else f"{value:.0f} W"


def _shown(value: object) -> str:
    return NA if value is None else f"{value}"


def _pair(a: object, b: object, show: Callable[[Any], str] = _pct, unit: str = "") -> str:
    """``a / b``, each as ``show`` writes it (n/a when unknown), then ``unit``; n/a alone when
    both are unknown."""
    if a is None and b is None:
        return NA
    return f"{show(a)} / {show(b)}" + (f" {unit}" if unit else "")


def _memory(dev: DeviceSample) -> str:
    return _pair(dev.memory_used, dev.memory_total, _mib)


def _power(dev: DeviceSample) -> str:
    return _pair(dev.power_w, dev.power_limit_w, _watts)


def _clocks(dev: DeviceSample) -> str:
    return _pair(dev.sm_clock_mhz, dev.mem_clock_mhz, _shown, "MHz")


def _pcie(dev: DeviceSample) -> str:
    return _pair(dev.pcie_tx_kbs, dev.pcie_rx_kbs, _shown, "KB/s")


def _cell(value: object) -> Text:
    return Text(escape_text(value))


def device_table(view: GpuView) -> Table:
    table = Table(title="GPUs", title_justify="left")
    for name in (
        "GPU",
        "Name",
        "Bus id",
        "Util / mem",
        "Memory used / total",
        "Power / limit",
        "Temp",
        "Clock SM / mem",
        "PCIe TX / RX",
        "MIG",
        "State",
    ):
        table.add_column(name, overflow="fold")
    for snap in view.snapshots:
        for dev in snap.devices:
            table.add_row(
                *map(
                    _cell,
                    (
                        f"{snap.source}:{dev.index}",
                        dev.name or NA,
                        dev.pci_bus_id or NA,
                        _pair(dev.gpu_util, dev.mem_util),
                        _memory(dev),
                        _power(dev),
                        NA if dev.temperature_c is None else f"{dev.temperature_c:.0f} C",
                        _clocks(dev),
                        _pcie(dev),
                        NA if dev.mig_mode is None else ("on" if dev.mig_mode else "off"),
                        dev.extra.get("state", ""),
                    ),
                )
            )
    return table


def _engines(proc: ProcessGpuUsage) -> str:
    busy = sorted(proc.engines.items(), key=lambda kv: -kv[1])
    return " ".join(f"{name} {pct:.0f}%" for name, pct in busy[:4])


def process_table(view: GpuView) -> Table:
    table = Table(title="Processes", title_justify="left")
    for name in (
        "GPU",
        "PID",
        "NS PID",
        "User",
        "Container",
        "Process",
        "Path",
        "Type",
        "SM / mem",
        "Enc / dec",
        "GPU memory",
        "Engines",
    ):
        table.add_column(name, overflow="fold")
    for snap in view.snapshots:
        for proc in snap.processes:
            label = view.labels.get(proc.pid, ProcessLabel())
            table.add_row(
                *map(
                    _cell,
                    (
                        f"{snap.source}:{proc.device_index}",
                        proc.pid,
                        "" if proc.ns_pid is None else proc.ns_pid,
                        label.user,
                        label.container,
                        label.name,
                        label.exe,
                        proc.kind or "",
                        _pair(proc.sm_util, proc.mem_util),
                        _pair(proc.enc_util, proc.dec_util),
                        _mib(proc.used_memory),
                        _engines(proc),
                    ),
                )
            )
    return table


def render_view(view: GpuView) -> RenderableType:
    """Notes on missing sources and errors, then the device and process tables."""
    parts: list[RenderableType] = []
    if not any(s.devices for s in view.snapshots):
        parts.append(Text("No GPU found." + (" Sources tried:" if view.unavailable else "")))
    for line in view.unavailable:
        parts.append(Text("  " + escape_text(line), style="yellow"))
    for snap in view.snapshots:
        for line in snap.errors:
            parts.append(Text("  " + escape_text(line), style="dim"))
    parts.append(device_table(view))
    parts.append(process_table(view))
    return Group(*parts)
