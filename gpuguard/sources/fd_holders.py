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

import os
from dataclasses import dataclass, field

from gpuguard.events.abi import DeviceClass, device_class_name
from gpuguard.events.devices import classify_device_path
from gpuguard.events.model import GpuOpen

# Only these prefixes can classify as GPU files; everything else (sockets,
# pipes, regular files) is skipped before the regex test.
_CANDIDATE_PREFIXES = ("/dev/", "/sys/")
_DRM_CLASSES = (DeviceClass.DRM_CARD, DeviceClass.DRM_RENDER)
MAX_FDINFO_BYTES = 16384


@dataclass(slots=True)
class DeviceHolder:
    """One open fd of one process on a GPU (or raw-memory) file."""

    pid: int
    fd: int
    path: str
    device_class: str            # the JSON/rules name, e.g. "nvidia-uvm"
    flags: int = 0               # open(2) flags from fdinfo (octal "flags:" line)
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


def _read_fdinfo(pid: int, fd: int, proc_root: str) -> tuple[int, dict[str, str]]:
    try:
        with open(f"{proc_root}/{pid}/fdinfo/{fd}", "rb") as f:
            raw = f.read(MAX_FDINFO_BYTES)
    except OSError:
        return 0, {}
    flags = 0
    drm: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key == "flags":
            try:
                flags = int(value, 8)
            except ValueError:
                pass
        elif key.startswith("drm-"):
            drm[key] = value
    return flags, drm


def holders_of_pid(pid: int, proc_root: str = "/proc") -> list[DeviceHolder] | None:
    """GPU files ``pid`` holds open; ``None`` when its fd table is unreadable (or it is gone)."""
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    out: list[DeviceHolder] = []
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if not target.startswith(_CANDIDATE_PREFIXES):
            continue
        device_class = classify_device_path(target)
        if device_class == DeviceClass.NONE:
            continue
        fd = int(name)
        flags, drm = _read_fdinfo(pid, fd, proc_root)
        out.append(DeviceHolder(pid, fd, target, device_class_name(device_class), flags,
                                drm if device_class in _DRM_CLASSES else {}))
    return out


def scan_device_holders(pids: list[int], proc_root: str = "/proc") -> HolderScan:
    """Scan the fd table of every pid once."""
    scan = HolderScan()
    for pid in pids:
        found = holders_of_pid(pid, proc_root)
        if found is None:
            scan.unreadable_pids.append(pid)
        else:
            scan.holders.extend(found)
    return scan


def holder_event(holder: DeviceHolder, time: float, uid: int = 0, comm: str = "") -> GpuOpen:
    """The :class:`GpuOpen` the sensor would have reported for this fd."""
    return GpuOpen(time=time, pid=holder.pid, tid=holder.pid, uid=uid, comm=comm,
                   path=holder.path, device_class=holder.device_class, fd=holder.fd,
                   flags=holder.flags)
