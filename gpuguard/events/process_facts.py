"""What /proc says about a process, as a record: who it is and where it came from.

:class:`ProcessFacts` is what the correlator and the rules know about a
process beyond its kernel events.  ``gpuguard.sources.proc.process`` fills it from
/proc; it is recorded into captures (``kind: "process"`` in the wire format) so
replay and golden cases need no live /proc.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

MAX_ANCESTORS = 8


@dataclass(slots=True)
class Ancestor:
    pid: int
    comm: str
    exe: str


@dataclass(slots=True)
class ProcessFacts:
    pid: int
    start_time: float  # seconds since the epoch (psutil create_time)
    ppid: int = 0
    comm: str = ""  # kernel comm (15 chars, settable by the process)
    exe: str = ""  # resolved executable path, " (deleted)" removed
    exe_deleted: bool = False
    exe_memfd: bool = False
    cmdline: list[str] = field(default_factory=list)
    cwd: str = ""
    uid: int = -1
    username: str = ""
    cgroup: str = ""
    container_runtime: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    # Kubernetes names and the image, from the node (sources.proc.pod_names.PodNames.fill):
    # None when unknown (or not in a pod / container)
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_name: str | None = None
    container_image: str | None = None
    kernel_thread: bool = False
    ld_preload: str | None = None  # LD_PRELOAD from the environment, if readable and set
    environ_readable: bool = False
    exe_identity: tuple[int, int, int, int] | None = None  # (st_dev, st_ino, st_size, st_mtime_ns)
    ancestors: list[Ancestor] = field(default_factory=list)  # parent first
    cpu_percent: float | None = None  # over the sampling window, when measured
    rss_bytes: int | None = None
    num_threads: int | None = None
    # hugetlb memory it maps (HugetlbPages of /proc/PID/status) and the largest page size of those
    # mappings (KernelPageSize in /proc/PID/smaps, read only when there are any); None: unreadable.
    # Transparent huge pages (AnonHugePages) are left out: ordinary programs get them.
    hugetlb_bytes: int | None = None
    hugetlb_page_size: int | None = None
    # [mapping size, page size] in bytes of each mapping holding hugetlb pages (smaps, at most 16)
    hugetlb_mappings: list[list[int]] = field(default_factory=list)
    # Likely miner config files ({path as named: text}, bounded), filled live by
    # gpuguard.sources.proc.config_files.read_config_files; recorded so replay sees them.
    config_files: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, float]:
        return (self.pid, self.start_time)

    def to_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ProcessFacts:
        values = dict(record)
        values.pop("kind", None)
        values["ancestors"] = [Ancestor(**a) for a in values.get("ancestors", [])]
        if values.get("exe_identity") is not None:
            values["exe_identity"] = tuple(values["exe_identity"])
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in values.items() if k in names})
        except TypeError as exc:
            raise ValueError(f"bad process record: {exc}") from None
