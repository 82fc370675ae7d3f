"""Any DRM GPU (amdgpu, i915, xe, msm, panfrost…) from /proc/PID/fdinfo: discovery and the sampler.

Which processes hold DRM nodes (:class:`FdTableSweeper`, through
``gpuguard.sources.proc.gpu_fds``), which cards sysfs knows, and the sampler that
turns both into GPU snapshots.  Parsing an fdinfo and the utilisation
maths are in ``drm_usage``.

Utilisation is the change between two samples, so a client's first sighting
has none.  One client (``drm_file``) may sit behind several fds, or several
processes after fork / fd passing: within a process it counts once, and a
device's totals count each client once.  A DRM-named fd without these keys
(an old kernel, a driver that prints nothing, a node that is not really DRM)
is listed as a process with no data, not an error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.sources.gpu.drm_usage import (
    DrmClient,
    UsageBaseline,
    engine_utilization,
    node_index,
    parse_fdinfo,
)
from gpuguard.sources.gpu.sampler import OnceErrors, SourceUnavailable
from gpuguard.sources.proc.gpu_fds import DRM_CLASSES, gpu_fds_of_links, list_gpu_fds, read_fdinfo
from gpuguard.sources.proc.pidns import namespace_pid

SOURCE = "drm-fdinfo"
# A full sweep of every process's fd table every 5 samples (5 s at 1 Hz); see FdTableSweeper.
SWEEP_EVERY = 5


@dataclass(slots=True)
class _Held:
    """One process's DRM fds on one device node."""

    pid: int
    device: int
    clients: dict[tuple[str, str], DrmClient] = field(default_factory=dict)


@dataclass(slots=True)
class ScanResult:
    held: list[_Held]
    denied: int = 0
    drm_fds: int = 0


def _drm_fds(pid: int, proc_root: str) -> list[tuple[str, str]]:
    """(fd, target) of the DRM nodes among a process's fds; PermissionError if not ours to read."""
    return [(str(f.fd), f.target) for f in list_gpu_fds(pid, proc_root, DRM_CLASSES)]


class FdTableSweeper:
    """Which fds of which processes are DRM nodes, without reading every fd table every sample.

    Reading every fd link of every process is most of the cost on a busy host
    (tens of thousands of readlinks).  A process is swept when first seen and
    then once every ``sweep_every`` samples (pids are spread over the slices);
    in between, only its known DRM fds are checked (one readlink each).  A
    process that opens a GPU node after it started is found within
    ``sweep_every`` samples.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        sweep_every: int = 1,
        fd_links: dict[int, list[tuple[int, str]]] | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.sweep_every = max(1, sweep_every)
        self._tick = 0
        self._known: dict[int, list[tuple[str, str]]] = {}
        # the first sweep takes the fd tables a caller has just read ({pid: [(fd, target)]} of
        # its /dev/ and /sys/ links, gpuguard.sources.proc.fd_table) instead of reading them again
        self._fresh = (
            {
                pid: [(str(f.fd), f.target) for f in gpu_fds_of_links(links, DRM_CLASSES)]
                for pid, links in fd_links.items()
            }
            if fd_links is not None
            else {}
        )

    def drm_fds(self, result: ScanResult) -> dict[int, list[tuple[str, str]]]:
        self._tick += 1
        try:
            pids = [int(n) for n in os.listdir(self.proc_root) if n.isdigit()]
        except OSError:
            return {}
        known, self._known = self._known, {}
        fresh, self._fresh = self._fresh, {}
        for pid in pids:
            fd_dir = f"{self.proc_root}/{pid}/fd"
            previous = known.get(pid)
            if pid in fresh:
                self._known[pid] = fresh[pid]
                continue
            try:
                if previous is None or (pid + self._tick) % self.sweep_every == 0:
                    found = _drm_fds(pid, self.proc_root)
                else:
                    found = [
                        (fd, target) for fd, target in previous if _still_links(fd_dir, fd, target)
                    ]
            except PermissionError:
                result.denied += 1
                continue
            except OSError:  # exited
                continue
            self._known[pid] = found
        return {pid: fds for pid, fds in self._known.items() if fds}


def _still_links(fd_dir: str, fd: str, target: str) -> bool:
    try:
        return os.readlink(f"{fd_dir}/{fd}") == target
    except FileNotFoundError:
        return False


def scan_drm_fds(proc_root: str = "/proc", sweeper: FdTableSweeper | None = None) -> ScanResult:
    """Every process's open DRM fds and what their fdinfo says."""
    result = ScanResult([])
    sweeper = sweeper or FdTableSweeper(proc_root)
    parsed: dict[str, DrmClient | None] = {}  # one client behind several fds prints the same text
    for pid, drm_fds in sweeper.drm_fds(result).items():
        by_device: dict[int, _Held] = {}
        for fd, target in drm_fds:
            result.drm_fds += 1
            device = node_index(target)
            held = by_device.get(device)
            if held is None:
                held = by_device[device] = _Held(pid, device)
            text = read_fdinfo(pid, int(fd), proc_root)
            if text is None:
                continue
            if text not in parsed:
                parsed[text] = parse_fdinfo(text)
            client = parsed[text]
            if client is not None:
                # Several fds of one client (dup, a card and a render fd) count once.
                key = (client.pdev or client.driver, client.client_id or f"{pid}/fd{fd}")
                held.clients.setdefault(key, client)
        result.held.extend(by_device.values())
    return result


@dataclass(slots=True)
class _SysDevice:
    index: int
    pdev: str | None
    driver: str | None
    busy_percent: float | None = None
    vram_used: int | None = None
    vram_total: int | None = None


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def sysfs_devices(sys_root: str = "/sys") -> dict[int, _SysDevice]:
    """DRM cards the kernel knows, with amdgpu's device-wide busy % and VRAM where it has them."""
    base = f"{sys_root}/class/drm"
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    out = {}
    for name in names:
        if not name.startswith("card") or not name[4:].isdigit():
            continue  # card0-DP-1 connectors and render nodes
        device = f"{base}/{name}/device"
        real = os.path.realpath(device)
        pdev = os.path.basename(real) if os.path.isdir(real) else None
        try:
            driver = os.path.basename(os.readlink(f"{device}/driver"))
        except OSError:
            driver = None
        busy = _read_int(f"{device}/gpu_busy_percent")
        out[int(name[4:])] = _SysDevice(
            int(name[4:]),
            pdev,
            driver,
            float(busy) if busy is not None else None,
            _read_int(f"{device}/mem_info_vram_used"),
            _read_int(f"{device}/mem_info_vram_total"),
        )
    return out


def open_sampler(
    proc_root: str = "/proc",
    sys_root: str = "/sys",
    sweep_every: int = SWEEP_EVERY,
    fd_links: dict[int, list[tuple[int, str]]] | None = None,
) -> DrmFdinfoSampler:
    if not os.path.isdir(f"{proc_root}/self/fdinfo"):
        raise SourceUnavailable(
            f"{proc_root}/self/fdinfo is missing", "mount procfs (Linux 2.6.22+)"
        )
    sampler = DrmFdinfoSampler(
        proc_root=proc_root, sys_root=sys_root, sweep_every=sweep_every, fd_links=fd_links
    )
    first = sampler.sample()
    if not first.devices:
        raise SourceUnavailable(
            f"no DRM device ({sys_root}/class/drm has no card, no process holds /dev/dri open)",
            "nothing to fix on a host without GPUs; else load the GPU's kernel driver",
        )
    sampler.pending = first.errors
    return sampler


class DrmFdinfoSampler:
    """Samples DRM clients of every process from /proc."""

    source = SOURCE

    def __init__(
        self,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sweep_every: int = 1,
        fd_links: dict[int, list[tuple[int, str]]] | None = None,
    ) -> None:
        self._proc_root = proc_root
        self._sweeper = FdTableSweeper(proc_root, sweep_every, fd_links)
        self._sys_root = sys_root
        self._clock = clock
        self._monotonic = monotonic
        self._once = OnceErrors()
        self._baselines: dict[tuple[str, str], UsageBaseline] = {}
        self.pending: list[str] = []

    def sample(self) -> GpuSnapshot:
        now, mono = self._clock(), self._monotonic()
        errors, self.pending = self.pending, []
        scan = scan_drm_fds(self._proc_root, self._sweeper)
        if scan.denied:
            self._once.report(
                errors,
                "system",
                "denied",
                "drm-fdinfo: some processes' fds are not readable, "
                "their GPU use is not shown (run as root)",
            )
        sysdevs = sysfs_devices(self._sys_root)
        # Each client once: its utilisation is computed once and shared by every holder.
        utils: dict[tuple[str, str], dict[str, float]] = {}
        baselines: dict[tuple[str, str], UsageBaseline] = {}
        device_clients: dict[int, dict[tuple[str, str], DrmClient]] = {i: {} for i in sysdevs}
        processes = []
        for held in scan.held:
            device_clients.setdefault(held.device, {})
            engines: dict[str, float] = {}
            regions: dict[str, int] = {}
            for key, client in held.clients.items():
                if key not in utils:
                    utils[key], baselines[key] = engine_utilization(
                        client, self._baselines.get(key), mono
                    )
                device_clients[held.device][key] = client
                for engine, pct in utils[key].items():
                    engines[engine] = min(engines.get(engine, 0.0) + pct, 100.0)
                for region, size in client.held_memory().items():
                    regions[region] = regions.get(region, 0) + size
            has_data = any(c.has_data for c in held.clients.values())
            processes.append(
                ProcessGpuUsage(
                    pid=held.pid,
                    vendor="drm",
                    device_index=held.device,
                    device_uuid=self._pdev(held, sysdevs),
                    ns_pid=namespace_pid(held.pid, self._proc_root),
                    sm_util=max(engines.values()) if engines else None,
                    used_memory=sum(regions.values()) if has_data and regions else None,
                    engines=engines,
                    memory_regions=regions,
                )
            )
        self._baselines = baselines  # clients that went away are forgotten
        devices = [
            self._device(i, sysdevs.get(i), device_clients[i], utils)
            for i in sorted(device_clients)
        ]
        processes.sort(key=lambda p: (p.device_index, p.pid))
        return GpuSnapshot(
            time=now, source=SOURCE, devices=devices, processes=processes, errors=errors
        )

    def close(self) -> None:
        self._baselines.clear()

    @staticmethod
    def _pdev(held: _Held, sysdevs: dict[int, _SysDevice]) -> str | None:
        for client in held.clients.values():
            if client.pdev:
                return client.pdev
        sysdev = sysdevs.get(held.device)
        return sysdev.pdev if sysdev else None

    @staticmethod
    def _device(
        index: int,
        sysdev: _SysDevice | None,
        clients: dict[tuple[str, str], DrmClient],
        utils: dict[tuple[str, str], dict[str, float]],
    ) -> DeviceSample:
        engines: dict[str, float] = {}
        memory = 0
        for key, client in clients.items():
            for engine, pct in utils.get(key, {}).items():
                engines[engine] = min(engines.get(engine, 0.0) + pct, 100.0)
            memory += sum(client.held_memory().values())
        driver = (
            sysdev.driver
            if sysdev and sysdev.driver
            else next((c.driver for c in clients.values()), None)
        )
        pdev = (
            sysdev.pdev
            if sysdev and sysdev.pdev
            else next((c.pdev for c in clients.values() if c.pdev), None)
        )
        with_data = sum(1 for c in clients.values() if c.has_data)
        gpu_util = (
            sysdev.busy_percent
            if sysdev and sysdev.busy_percent is not None
            else (max(engines.values()) if engines else None)
        )
        return DeviceSample(
            vendor="drm",
            index=index,
            name=" ".join(x for x in (driver, pdev) if x) or f"card{index}",
            uuid=pdev,
            pci_bus_id=pdev,
            driver=driver,
            gpu_util=gpu_util,
            memory_used=sysdev.vram_used
            if sysdev and sysdev.vram_used is not None
            else (memory if with_data else None),
            memory_total=sysdev.vram_total if sysdev else None,
            extra={"engines": engines, "clients": len(clients), "clients_with_data": with_data},
        )
