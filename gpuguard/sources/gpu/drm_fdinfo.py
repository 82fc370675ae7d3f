"""Any DRM GPU (amdgpu, i915, xe, msm, panfrost, …) from /proc/PID/fdinfo, no vendor library.

The kernel's "DRM client usage stats" (Documentation/gpu/drm-usage-stats.rst)
prints, for each open DRM file: ``drm-driver``, ``drm-client-id``, ``drm-pdev``,
busy time per engine (``drm-engine-<e>: <n> ns``, with
``drm-engine-capacity-<e>`` engines of that class), or busy cycles
(``drm-cycles-<e>`` with ``drm-total-cycles-<e>`` as on xe, or with
``drm-maxfreq-<e>``), and memory per region (``drm-total-``, ``drm-shared-``,
``drm-resident-``, ``drm-purgeable-``, ``drm-active-<region>``, and amdgpu's
older ``drm-memory-<region>``) in bytes, KiB or MiB.

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
from dataclasses import dataclass, field
from typing import Callable

from gpuguard.events.abi import DeviceClass
from gpuguard.events.devices import classify_device_path
from gpuguard.sources.gpu.sampler import OnceErrors, SourceUnavailable
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.sources.pidns import namespace_pid

SOURCE = "drm-fdinfo"
_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
_FREQ_UNITS = {"": 1, "Hz": 1, "KHz": 1000, "kHz": 1000, "MHz": 1_000_000}
_MEMORY_KINDS = ("total", "shared", "resident", "purgeable", "active", "memory")
_DRM_CLASSES = (DeviceClass.DRM_CARD, DeviceClass.DRM_RENDER)
# A full sweep of every process's fd table every 5 samples (5 s at 1 Hz); see FdTableSweeper.
SWEEP_EVERY = 5
# Which memory figure stands for "what this client holds" in a region, best first.
_HELD = ("resident", "memory", "total")


@dataclass(slots=True)
class DrmClient:
    """One ``struct drm_file`` as one fdinfo file describes it."""

    driver: str
    client_id: str | None = None
    pdev: str | None = None
    name: str | None = None
    engine_ns: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, int] = field(default_factory=dict)
    total_cycles: dict[str, int] = field(default_factory=dict)
    maxfreq_hz: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> region -> bytes

    def held_memory(self) -> dict[str, int]:
        """Bytes per region: resident where given, else amdgpu's drm-memory, else total."""
        regions: dict[str, int] = {}
        for kind in reversed(_HELD):
            regions.update(self.memory.get(kind, {}))
        return regions

    @property
    def has_data(self) -> bool:
        return bool(self.engine_ns or self.cycles or self.memory)


def _number(value: str, units: dict[str, int]) -> int | None:
    if value.isdigit():  # the common case: plain bytes or a counter
        return int(value)
    parts = value.split()
    if not parts or not parts[0].isdigit():
        return None
    unit = parts[1] if len(parts) > 1 else ""
    scale = units.get(unit)
    return int(parts[0]) * scale if scale is not None else None


def parse_fdinfo(text: str) -> DrmClient | None:
    """The DRM usage stats in one fdinfo file, or None if it has none (no ``drm-driver``)."""
    client: DrmClient | None = None
    pending: list[tuple[str, str, str]] = []
    for line in text.split("\n"):
        if not line.startswith("drm-"):
            continue  # pos/flags/mnt_id/ino and driver-private keys (amd-*, panfrost-*)
        key, sep, value = line.partition(":")
        if not sep:
            continue
        kind, _, rest = key[4:].partition("-")
        if kind == "driver":
            client = DrmClient(driver=value.strip())
        else:
            pending.append((kind, rest, value.strip()))
    if client is None:
        return None
    for kind, rest, value in pending:
        _apply(client, kind, rest, value)
    return client


def _apply(client: DrmClient, kind: str, rest: str, value: str) -> None:
    """One ``drm-<kind>-<rest>: value`` line (``drm-client-id`` is kind "client", rest "id")."""
    if kind == "engine":
        if rest.startswith("capacity-"):
            n = _number(value, _SIZE_UNITS)
            if n:  # zero capacity is not allowed; absent means one
                client.capacity[rest[9:]] = n
        else:
            n = _number(value[:-2] if value.endswith("ns") else value, _SIZE_UNITS)
            if n is not None:
                client.engine_ns[rest] = n
    elif kind == "cycles":
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.cycles[rest] = n
    elif kind == "total" and rest.startswith("cycles-"):  # drm-total-cycles-<engine>, not a region
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.total_cycles[rest[7:]] = n
    elif kind in _MEMORY_KINDS and rest:
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.memory.setdefault(kind, {})[rest] = n
    elif kind == "client":
        if rest == "id":
            client.client_id = value
        elif rest == "name":
            client.name = value
    elif kind == "pdev" and not rest:
        client.pdev = value
    elif kind == "maxfreq":
        n = _number(value, _FREQ_UNITS)
        if n:
            client.maxfreq_hz[rest] = n


@dataclass(slots=True)
class _Baseline:
    """A client's counters at the previous sample (the larger value wins, per the spec)."""

    mono: float
    engine_ns: dict[str, int]
    cycles: dict[str, int]
    total_cycles: dict[str, int]


def _advance(old: dict[str, int], new: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Deltas, and the new baseline: a counter seen going backwards keeps its larger old value."""
    deltas, baseline = {}, {}
    for name, value in new.items():
        before = old.get(name)
        if before is None:
            baseline[name] = value
        elif value >= before:
            deltas[name], baseline[name] = value - before, value
        else:
            deltas[name], baseline[name] = 0, before
    return deltas, baseline


def engine_utilization(client: DrmClient, previous: _Baseline | None, mono: float) -> tuple[dict[str, float], _Baseline]:
    """Percent busy per engine since ``previous``, and the baseline for next time."""
    old = previous or _Baseline(mono, {}, {}, {})
    ns_delta, ns_base = _advance(old.engine_ns, client.engine_ns)
    cyc_delta, cyc_base = _advance(old.cycles, client.cycles)
    tot_delta, tot_base = _advance(old.total_cycles, client.total_cycles)
    baseline = _Baseline(mono, ns_base, cyc_base, tot_base)
    util: dict[str, float] = {}
    if previous is None:
        return util, baseline
    elapsed = mono - previous.mono
    for engine in set(ns_delta) | set(cyc_delta):
        capacity = client.capacity.get(engine, 1)
        if engine in ns_delta and elapsed > 0:
            pct = ns_delta[engine] / (elapsed * 1e9 * capacity) * 100
        elif engine in cyc_delta and tot_delta.get(engine):
            pct = cyc_delta[engine] / (tot_delta[engine] * capacity) * 100
        elif engine in cyc_delta and engine in client.maxfreq_hz and elapsed > 0:
            pct = cyc_delta[engine] / (client.maxfreq_hz[engine] * elapsed * capacity) * 100
        else:
            continue
        util[engine] = round(min(max(pct, 0.0), 100.0), 2)
    return util, baseline


def node_index(path: str) -> int:
    """DRM minor numbering: card<N> and renderD<128+N> belong to device N."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("renderD"):
        return int(name[7:]) - 128
    return int(name[4:])


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


def _read_text(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 8192):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _drm_fds(fd_dir: str) -> list[tuple[str, str]]:
    """(fd, target) of the DRM nodes among a process's fds; PermissionError if not ours to read."""
    dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = []
        for fd in os.listdir(dir_fd):
            try:
                target = os.readlink(fd, dir_fd=dir_fd)  # relative to the open dir: no path walk per fd
            except OSError:
                continue
            if target.startswith("/dev/dri/") and classify_device_path(target) in _DRM_CLASSES:
                found.append((fd, target))
        return found
    finally:
        os.close(dir_fd)


class FdTableSweeper:
    """Which fds of which processes are DRM nodes, without reading every fd table every sample.

    Reading every fd link of every process is most of the cost on a busy host
    (tens of thousands of readlinks).  A process is swept when first seen and
    then once every ``sweep_every`` samples (pids are spread over the slices);
    in between, only its known DRM fds are checked (one readlink each).  A
    process that opens a GPU node after it started is found within
    ``sweep_every`` samples.
    """

    def __init__(self, proc_root: str = "/proc", sweep_every: int = 1) -> None:
        self.proc_root = proc_root
        self.sweep_every = max(1, sweep_every)
        self._tick = 0
        self._known: dict[int, list[tuple[str, str]]] = {}

    def drm_fds(self, result: ScanResult) -> dict[int, list[tuple[str, str]]]:
        self._tick += 1
        try:
            pids = [int(n) for n in os.listdir(self.proc_root) if n.isdigit()]
        except OSError:
            return {}
        known, self._known = self._known, {}
        for pid in pids:
            fd_dir = f"{self.proc_root}/{pid}/fd"
            previous = known.get(pid)
            try:
                if previous is None or (pid + self._tick) % self.sweep_every == 0:
                    found = _drm_fds(fd_dir)
                else:
                    found = [(fd, target) for fd, target in previous if _still_links(fd_dir, fd, target)]
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
            text = _read_text(f"{proc_root}/{pid}/fdinfo/{fd}")
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
        out[int(name[4:])] = _SysDevice(int(name[4:]), pdev, driver, float(busy) if busy is not None else None,
                                        _read_int(f"{device}/mem_info_vram_used"),
                                        _read_int(f"{device}/mem_info_vram_total"))
    return out


def open_sampler(proc_root: str = "/proc", sys_root: str = "/sys",
                 sweep_every: int = SWEEP_EVERY) -> "DrmFdinfoSampler":
    if not os.path.isdir(f"{proc_root}/self/fdinfo"):
        raise SourceUnavailable(f"{proc_root}/self/fdinfo is missing", "mount procfs (Linux 2.6.22+)")
    sampler = DrmFdinfoSampler(proc_root=proc_root, sys_root=sys_root, sweep_every=sweep_every)
    first = sampler.sample()
    if not first.devices:
        raise SourceUnavailable(f"no DRM device ({sys_root}/class/drm has no card, no process holds /dev/dri open)",
                                "nothing to fix on a host without GPUs; else load the GPU's kernel driver")
    sampler.pending = first.errors
    return sampler


class DrmFdinfoSampler:
    """Samples DRM clients of every process from /proc."""

    source = SOURCE

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys",
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sweep_every: int = 1) -> None:
        self._proc_root = proc_root
        self._sweeper = FdTableSweeper(proc_root, sweep_every)
        self._sys_root = sys_root
        self._clock = clock
        self._monotonic = monotonic
        self._once = OnceErrors()
        self._baselines: dict[tuple[str, str], _Baseline] = {}
        self.pending: list[str] = []

    def sample(self) -> GpuSnapshot:
        now, mono = self._clock(), self._monotonic()
        errors, self.pending = self.pending, []
        scan = scan_drm_fds(self._proc_root, self._sweeper)
        if scan.denied:
            self._once.report(errors, "system", "denied", "drm-fdinfo: some processes' fds are not readable, "
                                                          "their GPU use is not shown (run as root)")
        sysdevs = sysfs_devices(self._sys_root)
        # Each client once: its utilisation is computed once and shared by every holder.
        utils: dict[tuple[str, str], dict[str, float]] = {}
        baselines: dict[tuple[str, str], _Baseline] = {}
        device_clients: dict[int, dict[tuple[str, str], DrmClient]] = {i: {} for i in sysdevs}
        processes = []
        for held in scan.held:
            device_clients.setdefault(held.device, {})
            engines: dict[str, float] = {}
            regions: dict[str, int] = {}
            for key, client in held.clients.items():
                if key not in utils:
                    utils[key], baselines[key] = engine_utilization(client, self._baselines.get(key), mono)
                device_clients[held.device][key] = client
                for engine, pct in utils[key].items():
                    engines[engine] = min(engines.get(engine, 0.0) + pct, 100.0)
                for region, size in client.held_memory().items():
                    regions[region] = regions.get(region, 0) + size
            has_data = any(c.has_data for c in held.clients.values())
            processes.append(ProcessGpuUsage(
                pid=held.pid, vendor="drm", device_index=held.device,
                device_uuid=self._pdev(held, sysdevs),
                ns_pid=namespace_pid(held.pid, self._proc_root),
                sm_util=max(engines.values()) if engines else None,
                used_memory=sum(regions.values()) if has_data and regions else None,
                engines=engines, memory_regions=regions,
            ))
        self._baselines = baselines  # clients that went away are forgotten
        devices = [self._device(i, sysdevs.get(i), device_clients[i], utils) for i in sorted(device_clients)]
        processes.sort(key=lambda p: (p.device_index, p.pid))
        return GpuSnapshot(time=now, source=SOURCE, devices=devices, processes=processes, errors=errors)

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
    def _device(index: int, sysdev: _SysDevice | None, clients: dict[tuple[str, str], DrmClient],
                utils: dict[tuple[str, str], dict[str, float]]) -> DeviceSample:
        engines: dict[str, float] = {}
        memory = 0
        for key, client in clients.items():
            for engine, pct in utils.get(key, {}).items():
                engines[engine] = min(engines.get(engine, 0.0) + pct, 100.0)
            memory += sum(client.held_memory().values())
        driver = sysdev.driver if sysdev and sysdev.driver else next((c.driver for c in clients.values()), None)
        pdev = sysdev.pdev if sysdev and sysdev.pdev else next((c.pdev for c in clients.values() if c.pdev), None)
        with_data = sum(1 for c in clients.values() if c.has_data)
        gpu_util = sysdev.busy_percent if sysdev and sysdev.busy_percent is not None else (
            max(engines.values()) if engines else None)
        return DeviceSample(
            vendor="drm", index=index, name=" ".join(x for x in (driver, pdev) if x) or f"card{index}",
            uuid=pdev, pci_bus_id=pdev, driver=driver, gpu_util=gpu_util,
            memory_used=sysdev.vram_used if sysdev and sysdev.vram_used is not None else (memory if with_data else None),
            memory_total=sysdev.vram_total if sysdev else None,
            extra={"engines": engines, "clients": len(clients), "clients_with_data": with_data},
        )
