"""Every live GPU telemetry source, listed once: config, `scan`, `gpus` and the agent read it.

A new source is one module with ``open_sampler(proc_root=...)`` plus one entry in
:data:`GPU_SOURCES`.  Modules are imported when a source is opened, not when this
list is read, so a config check never loads a vendor's module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

_PACKAGE = "gpuguard.sources.gpu"


@dataclass(frozen=True, slots=True)
class GpuSource:
    """One GPU source: its name in config and on the command line, and how to open it."""

    name: str  # agent.yaml ``sampling.sources``, ``gpus --source``, GpuSnapshot.source
    label: str  # how status lines name it: "NVML not available: ..."
    module: str  # under gpuguard.sources.gpu; has open_sampler(proc_root=...)
    counters: bool  # engine busy time is a counter: a rate needs two reads
    doc: str
    sweeps_fd_tables: bool = False  # its open_sampler takes ``fd_links`` (fd tables already read)

    def open(self, proc_root: str = "/proc", fd_links: dict | None = None):
        """Open a sampler; raises ``SourceUnavailable`` (or ImportError) when it cannot work here.

        ``fd_links``: {pid: [(fd, target)]} of every process's /dev/ and /sys/ links, just read
        (:mod:`gpuguard.sources.proc.fd_table`), for a source that would otherwise read them again."""
        module = importlib.import_module(f"{_PACKAGE}.{self.module}")
        if fd_links is not None and self.sweeps_fd_tables:
            return module.open_sampler(proc_root=proc_root, fd_links=fd_links)
        return module.open_sampler(proc_root=proc_root)


GPU_SOURCES: tuple[GpuSource, ...] = (
    GpuSource("nvml", "NVML", "nvml", counters=False, doc="NVIDIA GPUs through NVML (pynvml)"),
    GpuSource("amdsmi", "amdsmi", "amd", counters=True, doc="AMD GPUs through ROCm's amdsmi"),
    GpuSource(
        "drm-fdinfo",
        "DRM fdinfo",
        "drm_fdinfo",
        counters=True,
        doc="any DRM driver, from /proc/PID/fdinfo (no vendor library)",
        sweeps_fd_tables=True,
    ),
)
SOURCE_NAMES: tuple[str, ...] = tuple(s.name for s in GPU_SOURCES)
BY_NAME: dict[str, GpuSource] = {s.name: s for s in GPU_SOURCES}
