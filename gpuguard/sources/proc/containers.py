"""Container and Kubernetes pod identity from a process's cgroup path.

Only the path is used (no runtime sockets are contacted), so it works for
docker, containerd, CRI-O and podman alike, with cgroup v1 or v2 and with the
systemd or cgroupfs drivers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache

_ID = r"([0-9a-f]{64})"
_RUNTIMES = (
    ("docker", re.compile(r"docker[-/]" + _ID)),
    ("containerd", re.compile(r"cri-containerd[-:]" + _ID)),
    ("crio", re.compile(r"crio[-:]" + _ID)),
    ("podman", re.compile(r"libpod[-:]" + _ID)),
    ("containerd", re.compile(r"/kubepods[^ ]*/" + _ID)),
)
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    runtime: str | None
    container_id: str | None
    pod_uid: str | None


NO_CONTAINER = ContainerRef(None, None, None)


@lru_cache(maxsize=4096)  # a pure function of the path; a host has few distinct cgroups
def container_from_cgroup(cgroup_path: str) -> ContainerRef:
    """``/kubepods.slice/...pod<uid>.slice/cri-containerd-<id>.scope`` -> ids."""
    runtime = container_id = None
    for name, pattern in _RUNTIMES:
        match = pattern.search(cgroup_path)
        if match:
            runtime, container_id = name, match.group(1)
            break
    pod = _POD.search(cgroup_path)
    pod_uid = pod.group(1).replace("_", "-") if pod else None
    if runtime is None and pod_uid is None:
        return NO_CONTAINER
    return ContainerRef(runtime, container_id, pod_uid)


def read_cgroup_path(pid: int, proc_root: str = "/proc") -> str:
    """The v2 (unified) cgroup path, else the first v1 path that names a container."""
    try:
        fd = os.open(f"{proc_root}/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        raw = b""
        while chunk := os.read(fd, 65536):  # a bare read: a text file object costs more
            raw += chunk
    except OSError:
        return ""
    finally:
        os.close(fd)
    return _cgroup_path(raw)


@lru_cache(maxsize=1024)
def _cgroup_path(raw: bytes) -> str:
    """The path :func:`read_cgroup_path` takes from the text of a cgroup file (the processes of
    one cgroup share it: parsed once)."""
    lines = raw.decode("utf-8", "surrogateescape").splitlines()
    unified = ""
    fallback = ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        elif not fallback or container_from_cgroup(parts[2]) is not NO_CONTAINER:
            if container_from_cgroup(fallback) is NO_CONTAINER:
                fallback = parts[2]
    if unified and (container_from_cgroup(unified) is not NO_CONTAINER or not fallback):
        return unified
    return fallback or unified
