"""A process's open GPU files, from /proc/PID/fd and /proc/PID/fdinfo: the one place that finds them.

The sensor (is this fd still a GPU file?), the scan's device holders and the
DRM fdinfo sampler all ask the same question; they all use this module, which
classifies link targets with :func:`gpuguard.events.devices.classify_device_path`
(the probes' own path test) and reads fdinfo files bounded.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from gpuguard.events.abi import DeviceClass
from gpuguard.events.devices import classify_device_path

DRM_CLASSES = frozenset({DeviceClass.DRM_CARD, DeviceClass.DRM_RENDER})
MAX_FDINFO_BYTES = 65536
# Only these prefixes can classify as GPU files: sockets, pipes and regular files
# are skipped before the regex test.
_GPU_PREFIXES = ("/dev/", "/sys/")
_DRM_PREFIXES = ("/dev/dri/",)


@dataclass(slots=True, frozen=True)
class GpuFd:
    fd: int
    target: str  # the link target, as the process's mount namespace names it
    device_class: DeviceClass


@dataclass(slots=True)
class FdInfo:
    """The fdinfo lines gpuguard uses: open(2) flags and the DRM usage-stats keys."""

    flags: int = 0
    drm: dict[str, str] = field(default_factory=dict)  # "drm-engine-gfx" -> "123 ns"


def list_gpu_fds(
    pid: int, proc_root: str = "/proc", classes: frozenset[DeviceClass] | None = None
) -> list[GpuFd]:
    """The fds of ``pid`` open on GPU files (of ``classes`` when given).

    Raises PermissionError when the fd table is not ours to read and
    FileNotFoundError (an OSError) when the process is gone.
    """
    prefixes = _prefixes(classes)
    dir_fd = os.open(f"{proc_root}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        links = []
        for name in os.listdir(dir_fd):
            try:
                target = os.readlink(
                    name, dir_fd=dir_fd
                )  # relative to the open dir: no path walk per fd
            except OSError:
                continue
            if target.startswith(prefixes):
                links.append((int(name), target))
        return gpu_fds_of_links(links, classes)
    finally:
        os.close(dir_fd)


def _prefixes(classes: frozenset[DeviceClass] | None) -> tuple[str, ...]:
    return _DRM_PREFIXES if classes is not None and classes <= DRM_CLASSES else _GPU_PREFIXES


def gpu_fds_of_links(
    links: list[tuple[int, str]], classes: frozenset[DeviceClass] | None = None
) -> list[GpuFd]:
    """The GPU files (of ``classes`` when given) among ``(fd, link target)`` pairs already read
    (:mod:`gpuguard.sources.proc.fd_table` keeps every ``/dev/`` and ``/sys/`` target)."""
    prefixes = _prefixes(classes)
    found = []
    for fd, target in links:
        if not target.startswith(prefixes):
            continue
        device_class = classify_device_path(target)
        if device_class != DeviceClass.NONE and (classes is None or device_class in classes):
            found.append(GpuFd(fd, target, device_class))
    return found


def fd_is_gpu(pid: int, fd: int, proc_root: str = "/proc") -> tuple[bool, str | None]:
    """Does fd ``fd`` of ``pid`` still refer to a GPU file?  Returns (yes, link target)."""
    link = f"{proc_root}/{pid}/fd/{fd}"
    try:
        target = os.readlink(link)
        st = os.stat(link)
    except OSError:
        return False, None
    if classify_device_path(target) != DeviceClass.NONE:
        return True, target
    # Device nodes seen through another mount namespace may not resolve to a
    # /dev path here; a character device is still a device.
    return stat.S_ISCHR(st.st_mode), target


def read_fdinfo(pid: int, fd: int, proc_root: str = "/proc") -> str | None:
    """The text of /proc/PID/fdinfo/FD (at most MAX_FDINFO_BYTES), None if it cannot be read."""
    try:
        fdinfo = os.open(f"{proc_root}/{pid}/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < MAX_FDINFO_BYTES and (chunk := os.read(fdinfo, MAX_FDINFO_BYTES - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fdinfo)
    return b"".join(chunks).decode("utf-8", "replace")


def parse_fdinfo_fields(text: str) -> FdInfo:
    """``flags`` (octal) and every ``drm-*`` key of one fdinfo text."""
    info = FdInfo()
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key.startswith("drm-"):
            info.drm[key] = value.strip()
        elif key == "flags":
            try:
                info.flags = int(value.strip(), 8)
            except ValueError:
                pass
    return info
