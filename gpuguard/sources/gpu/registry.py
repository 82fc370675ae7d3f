"""Every live GPU telemetry source, listed once, and the one way to open them.

A new source is one module with ``open_sampler(proc_root=...)`` plus one entry in
:data:`GPU_SOURCES`.  Modules are imported when a source is opened, not when this
list is read, so a config check never loads a vendor's module.  :func:`open_source` opens
one for the agent, :func:`open_samplers` every one that works here for ``scan``, ``gpus``
and ``record``; both go through :meth:`GpuSource.open`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuguard.errors import GpuguardError
from gpuguard.sources.gpu.sampler import GpuSampler, SourceUnavailable

_PACKAGE = "gpuguard.sources.gpu"
# PCI base classes of GPUs: display controller, processing accelerator (AMD Instinct, some
# data-centre NVIDIA parts); a vendor's other functions (NVSwitch bridges, HDMI audio) are not.
GPU_PCI_CLASSES = ("0x03", "0x12")


@dataclass(frozen=True, slots=True)
class GpuSource:
    """One GPU source: its name in config and on the command line, and how to open it."""

    name: str  # agent.yaml ``sampling.sources``, ``gpus --source``, GpuSnapshot.source
    label: str  # how status lines name it: "NVML not available: ..."
    module: str  # under gpuguard.sources.gpu; has open_sampler(proc_root=...)
    counters: bool  # engine busy time is a counter: a rate needs two reads
    doc: str
    sweeps_fd_tables: bool = False  # its open_sampler takes ``fd_links`` (fd tables already read)
    # The PCI vendor id of its GPUs ("0x10de"); None: any DRM device (/sys/class/drm/card*)
    pci_vendor: str | None = None

    def open(self, proc_root: str = "/proc", fd_links: dict | None = None) -> GpuSampler:
        """Open a sampler; raises ``SourceUnavailable`` when it cannot work here (a module or
        library that will not import too), with ``absent`` set when the host has no GPU this
        source reads (information, not a fault).

        ``fd_links``: {pid: [(fd, target)]} of every process's /dev/ and /sys/ links, just read
        (:mod:`gpuguard.sources.proc.fd_table`), for a source that would otherwise read them again."""
        try:
            try:
                module = importlib.import_module(f"{_PACKAGE}.{self.module}")
                if fd_links is not None and self.sweeps_fd_tables:
                    return module.open_sampler(proc_root=proc_root, fd_links=fd_links)
                return module.open_sampler(proc_root=proc_root)
            except ImportError as exc:
                if (exc.name or "").startswith("gpuguard"):
                    raise  # our own module broken: a bug to see, not a host without this GPU
                raise SourceUnavailable(
                    f"its Python library does not import ({exc})",
                    f"install the vendor's Python library ({self.name} source: docs/gpus.md) "
                    "or leave this source out of sampling.sources",
                ) from exc
        except SourceUnavailable as exc:
            sys_root = str(Path(proc_root).parent / "sys")
            listed = self.hardware(sys_root)
            none_here = not self.has_gpus(sys_root, listed)
            exc.absent = exc.absent or none_here
            if none_here:  # only a new device can change that: look for one, cheaply
                exc.hardware_same = lambda: self.hardware(sys_root) == listed
            raise

    def hardware(self, sys_root: str = "/sys") -> tuple[str, ...]:
        """The sysfs listing :meth:`has_gpus` reads (PCI devices, or DRM cards): one directory
        read, where a device that is hot-plugged or whose driver loads appears."""
        where = "class/drm" if self.pci_vendor is None else "bus/pci/devices"
        try:
            return tuple(sorted(os.listdir(f"{sys_root}/{where}")))
        except OSError:
            return ()

    def has_gpus(self, sys_root: str = "/sys", listed: tuple[str, ...] | None = None) -> bool:
        """Whether the host has a GPU this source reads: a PCI display controller or processing
        accelerator of its vendor, or for DRM fdinfo any DRM card (read from sysfs, which a
        container sees as the host's).  ``listed``: :meth:`hardware`, when just read."""
        names = self.hardware(sys_root) if listed is None else listed
        if self.pci_vendor is None:
            return any(name.startswith("card") and name[4:5].isdigit() for name in names)
        for name in names:
            device = Path(sys_root, "bus", "pci", "devices", name)
            try:
                vendor = Path(device, "vendor").read_text().strip()
                klass = Path(device, "class").read_text().strip()
            except OSError:
                continue
            if vendor == self.pci_vendor and klass[:4] in GPU_PCI_CLASSES:
                return True
        return False


GPU_SOURCES: tuple[GpuSource, ...] = (
    GpuSource(
        "nvml",
        "NVML",
        "nvml",
        counters=False,
        doc="NVIDIA GPUs through NVML (pynvml)",
        pci_vendor="0x10de",
    ),
    GpuSource(
        "amdsmi",
        "amdsmi",
        "amd",
        counters=True,
        doc="AMD GPUs through ROCm's amdsmi",
        pci_vendor="0x1002",
    ),
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


def open_source(name: str, proc_root: str = "/proc", fd_links: dict | None = None) -> GpuSampler:
    """Open the source called ``name``; raises ``SourceUnavailable`` whose cause is its status
    line (``NVML not available: library not found (fix: install the NVIDIA driver)``), with
    ``absent`` as :meth:`GpuSource.open` set it."""
    source = BY_NAME.get(name)
    if source is None:
        raise GpuguardError(f"unknown GPU source {name!r}", f"use one of {', '.join(SOURCE_NAMES)}")
    try:
        return source.open(proc_root, fd_links)
    except SourceUnavailable as exc:
        line = f"{source.label} not available: {exc.one_line()}"
        raise SourceUnavailable(line, absent=exc.absent, hardware_same=exc.hardware_same) from None


def open_samplers(
    sources: Iterable[str] = SOURCE_NAMES,
    proc_root: str = "/proc",
    on_status: Callable[[str], None] | None = None,
    fd_links: dict | None = None,
) -> list[GpuSampler]:
    """Open every source named that works here; each one that does not is reported once, its
    status line through ``on_status``.  ``fd_links``: see :meth:`GpuSource.open`."""
    samplers: list[GpuSampler] = []
    for name in sources:
        try:
            samplers.append(open_source(name, proc_root, fd_links))
        except SourceUnavailable as exc:
            if on_status is not None:
                on_status(exc.cause)
    return samplers
