"""Who holds a GPU file open right now: GPU device holders read from /proc/PID/fd.

Data flow: a list of pids -> one readlink per open fd -> the path classified by
:func:`gpuguard.events.devices.classify_device_path` (the probes' own test) ->
:class:`DeviceHolder` rows -> :class:`~gpuguard.events.model.GpuOpen` events,
so a one-shot scan feeds the correlator the same events the eBPF sensor would
have produced when the process opened the file.

A process in a private mount namespace shows its fds as paths in *its*
namespace (``/dev/nvidia0`` on a tmpfs /dev), which is the same view the
path-classifying probes have.  DRM fds also get their ``drm-*`` fdinfo keys
(kernel drm-usage-stats), the vendor-neutral per-client GPU accounting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.events.abi import device_class_name
from gpuguard.events.model import GpuOpen
from gpuguard.sources.proc.fd_table import FdTables
from gpuguard.sources.proc.gpu_fds import (
    DRM_CLASSES,
    FdInfo,
    GpuFd,
    gpu_fds_of_links,
    list_gpu_fds,
    parse_fdinfo_fields,
    read_fdinfo,
)


@dataclass(slots=True)
class DeviceHolder:
    """One open fd of one process on a GPU (or raw-memory) file."""

    pid: int
    fd: int
    path: str
    device_class: str  # the JSON/rules name, e.g. "nvidia-uvm"
    flags: int = 0  # open(2) flags from fdinfo (octal "flags:" line)
    drm: dict[str, str] = field(default_factory=dict)  # drm-* fdinfo keys of DRM fds


@dataclass(slots=True)
class HolderScan:
    """Every holder found, and the pids whose fd table could not be read."""

    holders: list[DeviceHolder] = field(default_factory=list)
    unreadable_pids: list[int] = field(default_factory=list)

    def by_pid(self) -> dict[int, list[DeviceHolder]]:
        out: dict[int, list[DeviceHolder]] = {}
        for holder in self.holders:
            out.setdefault(holder.pid, []).append(holder)
        return out


def holders_of_pid(pid: int, proc_root: str = "/proc") -> list[DeviceHolder] | None:
    """GPU files ``pid`` holds open; ``None`` when its fd table is unreadable (or it is gone)."""
    try:
        fds = list_gpu_fds(pid, proc_root)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    return _holders(pid, fds, proc_root)


def _holders(pid: int, fds: list[GpuFd], proc_root: str) -> list[DeviceHolder]:
    out: list[DeviceHolder] = []
    for gpu_fd in fds:
        text = read_fdinfo(pid, gpu_fd.fd, proc_root)
        info = parse_fdinfo_fields(text) if text is not None else FdInfo()
        out.append(
            DeviceHolder(
                pid,
                gpu_fd.fd,
                gpu_fd.target,
                device_class_name(gpu_fd.device_class),
                info.flags,
                info.drm if gpu_fd.device_class in DRM_CLASSES else {},
            )
        )
    return out


def scan_device_holders(
    pids: list[int], proc_root: str = "/proc", tables: FdTables | None = None
) -> HolderScan:
    """Scan the fd table of every pid once (``tables``: the walk already made, covering ``pids``)."""
    scan = HolderScan()
    unreadable = set(tables.unreadable) if tables is not None else set()
    for pid in pids:
        if tables is None:
            found = holders_of_pid(pid, proc_root)
        elif pid in unreadable:
            found = None
        else:
            links = tables.device_links.get(pid, [])
            found = _holders(pid, gpu_fds_of_links(links), proc_root) if links else []
        if found is None:
            scan.unreadable_pids.append(pid)
        else:
            scan.holders.extend(found)
    return scan


def holder_event(holder: DeviceHolder, time: float, uid: int = 0, comm: str = "") -> GpuOpen:
    """The :class:`GpuOpen` the sensor would have reported for this fd."""
    return GpuOpen(
        time=time,
        pid=holder.pid,
        tid=holder.pid,
        uid=uid,
        comm=comm,
        path=holder.path,
        device_class=holder.device_class,
        fd=holder.fd,
        flags=holder.flags,
    )
