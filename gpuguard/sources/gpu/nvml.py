"""NVIDIA GPUs through NVML (``pynvml`` from nvidia-ml-py): devices and per-process use.

The library module is injectable (``open_sampler(library=...)``), so tests run
this adapter against a faithful fake of ``pynvml``.

A field NVML cannot give is ``None`` (one error line the first time), a lost GPU stays
listed and is retried, per-process utilisation is never counted twice and goes ``None`` when
stale, and PCIe comes from byte counters.  The reasons: docs/gpus.md, "NVML: choices worth
knowing".  Loading the library and classifying its errors live in ``nvml_library``, what NVML
keeps of the past in ``nvml_history``, PCIe in ``nvml_pcie``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.sources.gpu import nvml_history
from gpuguard.sources.gpu.nvml_library import (
    LOST_CODES,
    PROCESS_LISTS,
    REINIT_CODES,
    SOURCE,
    DeviceLost,
    init_failure,
    load_library,
    shutdown,
)
from gpuguard.sources.gpu.nvml_pcie import PcieReader
from gpuguard.sources.gpu.sampler import OnceErrors, SourceUnavailable
from gpuguard.sources.proc.pidns import namespace_pid

REINIT_INTERVAL_S = 5.0
UTIL_STALE_AFTER_S = 5.0


def open_sampler(
    proc_root: str = "/proc",
    library: ModuleType | None = None,
    clock: Callable[[], float] = time.time,
) -> NvmlSampler:
    """Initialise NVML and return a sampler, or raise :class:`SourceUnavailable`."""
    nvml = library if library is not None else load_library()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        cause, fix = init_failure(nvml, exc)
        raise SourceUnavailable(cause, fix) from None
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        shutdown(nvml)
        raise SourceUnavailable(
            f"cannot count GPUs: {exc}", "check `nvidia-smi` and the driver logs (dmesg)"
        ) from None
    if count == 0:
        shutdown(nvml)
        raise SourceUnavailable(
            "no NVIDIA GPU found", "check `nvidia-smi -L` and that the GPUs are passed to this host"
        )
    return NvmlSampler(nvml, count, proc_root=proc_root, clock=clock)


@dataclass(slots=True)
class _ProcessUtil:
    time_us: int
    sm: float
    mem: float
    enc: float
    dec: float


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any = None
    lost: bool = False
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    sm_clock_max_mhz: int | None = None
    last_seen_us: int = 0
    utils: dict[int, _ProcessUtil] = field(default_factory=dict)
    pcie: PcieReader | None = None


class NvmlSampler:
    """Samples every NVIDIA GPU NVML can see."""

    source = SOURCE

    def __init__(
        self,
        nvml: ModuleType,
        count: int,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._proc_root = proc_root
        self._clock = clock
        self._once = OnceErrors()
        self._lost_codes = {getattr(nvml, n) for n in LOST_CODES if hasattr(nvml, n)}
        self._reinit_codes = {getattr(nvml, n) for n in REINIT_CODES if hasattr(nvml, n)}
        self._mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        self._list_fn: dict[str, str] = {}
        self._need_reinit = False
        self._last_reinit = 0.0
        self._closed = False
        self._driver_version = self._system_driver_version([])
        self._devices = [_Device(i) for i in range(count)]

    # -- public -------------------------------------------------------------

    def sample(self) -> GpuSnapshot:
        now = self._clock()
        errors: list[str] = []
        if self._need_reinit:
            self._reinit(now, errors)
        if not self._need_reinit:
            self._discover_new_devices(errors)
        devices: list[DeviceSample] = []
        processes: list[ProcessGpuUsage] = []
        for dev in self._devices:
            sample, procs = self._sample_device(dev, now, errors)
            devices.append(sample)
            processes.extend(procs)
        return GpuSnapshot(
            time=now, source=SOURCE, devices=devices, processes=processes, errors=errors
        )

    def accounting(self) -> tuple[list[GpuAccounting], list[str]]:
        """NVML accounting records of every GPU where accounting mode is on, and one line per GPU that failed."""
        return nvml_history.accounting(self._nvml, self._live_devices())

    def accounting_status(self) -> dict[int, bool | None]:
        """Whether accounting mode is on, per GPU index (None: NVML could not say)."""
        return nvml_history.accounting_status(self._nvml, self._live_devices())

    def set_accounting(self, on: bool) -> list[tuple[str, str]]:
        """Turn accounting mode on/off on every GPU (opt-in: it changes host state); one
        ``(outcome, line)`` per GPU (:func:`nvml_history.set_accounting`)."""
        return nvml_history.set_accounting(self._nvml, self._live_devices(), on)

    def history(self) -> list[GpuSnapshot]:
        """The driver's ~14 s of device samples, one snapshot per second, oldest first
        (:func:`nvml_history.history_snapshots`)."""
        return nvml_history.history_snapshots(
            self._nvml, self._live_devices(), self._device_sample, self._users
        )

    def _users(self, dev: _Device, errors: list[str]) -> set[int]:
        """The pids on a device's compute and graphics lists."""
        return {
            info.pid
            for kind in ("compute", "graphics")
            for info in self._process_list(dev, kind, errors) or ()
        }

    def _live_devices(self) -> list[_Device]:
        return [d for d in self._devices if d.handle is not None and not d.lost]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutdown(self._nvml)

    # -- NVML state ---------------------------------------------------------

    def _system_driver_version(self, errors: list[str]) -> str | None:
        try:
            version = self._nvml.nvmlSystemGetDriverVersion()
        except self._nvml.NVMLError as exc:
            self._once.report(errors, "system", "driver_version", f"nvml driver version: {exc}")
            return None
        return version.decode() if isinstance(version, bytes) else version

    def _reinit(self, now: float, errors: list[str]) -> None:
        if now - self._last_reinit < REINIT_INTERVAL_S:
            return
        self._last_reinit = now
        shutdown(self._nvml)
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            self._once.report(
                errors,
                "system",
                "init",
                f"nvml: re-initialising failed: {exc}; retrying every {REINIT_INTERVAL_S:g} s",
            )
            return
        self._once.clear("system", "init")
        self._need_reinit = False
        self._driver_version = self._system_driver_version(errors) or self._driver_version
        for dev in self._devices:
            dev.handle, dev.lost = None, True  # handles from before the re-init are invalid

    def _discover_new_devices(self, errors: list[str]) -> None:
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            if exc.value in self._reinit_codes:
                self._need_reinit = True
            self._once.report(errors, "system", "count", f"nvml device count: {exc}")
            return
        self._once.clear("system", "count")
        for index in range(len(self._devices), count):
            self._devices.append(_Device(index))

    def _acquire(self, dev: _Device, errors: list[str]) -> bool:
        nvml = self._nvml
        try:
            if dev.uuid:
                dev.handle = nvml.nvmlDeviceGetHandleByUUID(dev.uuid)
            else:
                dev.handle = nvml.nvmlDeviceGetHandleByIndex(dev.index)
        except nvml.NVMLError as exc:
            if exc.value in self._reinit_codes:
                self._need_reinit = True
            dev.handle = None
            self._once.report(errors, dev.index, "state", self._lost_line(dev, str(exc)))
            return False
        dev.utils.clear()
        dev.pcie = None  # counters from before the loss are not comparable
        if dev.uuid is None:
            dev.uuid = self._static(dev, "uuid", nvml.nvmlDeviceGetUUID, errors)
        if dev.name is None:
            dev.name = self._static(dev, "name", nvml.nvmlDeviceGetName, errors)
        if dev.pci_bus_id is None:
            pci = self._static(dev, "pci_bus_id", nvml.nvmlDeviceGetPciInfo, errors)
            if pci is not None:
                bus_id = pci.busId
                dev.pci_bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        if dev.sm_clock_max_mhz is None:
            dev.sm_clock_max_mhz = self._static(
                dev, "sm_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, errors, nvml.NVML_CLOCK_SM
            )
        return True

    def _static(
        self, dev: _Device, name: str, fn: Callable[..., Any], errors: list[str], *args: Any
    ) -> Any:
        value = self._read(dev, name, fn, errors, *args)
        return value.decode() if isinstance(value, bytes) else value

    def _lost_line(self, dev: _Device, reason: str) -> str:
        who = f"gpu{dev.index}" + (f" ({dev.uuid})" if dev.uuid else "")
        return f"nvml {who} unavailable: {reason}; retrying each sample"

    # -- reading ------------------------------------------------------------

    def _read(
        self, dev: _Device, name: str, fn: Callable[..., Any], errors: list[str], *args: Any
    ) -> Any:
        """One NVML call: the value, or None plus a once-only error line."""
        try:
            value = fn(dev.handle, *args)
        except self._nvml.NVMLError as exc:
            if exc.value in self._lost_codes or exc.value in self._reinit_codes:
                raise DeviceLost(str(exc), exc.value in self._reinit_codes) from None
            self._once.report(errors, dev.index, name, f"nvml gpu{dev.index} {name}: {exc}")
            return None
        self._once.clear(dev.index, name)
        return value

    def _sample_device(
        self, dev: _Device, now: float, errors: list[str]
    ) -> tuple[DeviceSample, list[ProcessGpuUsage]]:
        try:
            if dev.handle is None or dev.lost:
                if self._need_reinit or not self._acquire(dev, errors):
                    return self._lost_sample(dev), []
            sample = self._device_metrics(dev, now, errors)
            processes = self._processes(dev, now, errors)
        except DeviceLost as lost:
            dev.lost, dev.handle = True, None
            if lost.reinit:
                self._need_reinit = True
            self._once.report(errors, dev.index, "state", self._lost_line(dev, str(lost)))
            return self._lost_sample(dev), []
        # Back (or never gone): a later loss is reported again.  Field errors
        # stay reported once: a field NVML never supports is not news.
        dev.lost = False
        self._once.clear(dev.index, "state")
        return sample, processes

    def _device_sample(self, dev: _Device, **fields: Any) -> DeviceSample:
        """A sample of ``dev``: its identity and the driver's version, then ``fields``."""
        return DeviceSample(
            vendor="nvidia",
            index=dev.index,
            name=dev.name,
            uuid=dev.uuid,
            pci_bus_id=dev.pci_bus_id,
            driver="nvidia",
            driver_version=self._driver_version,
            **fields,
        )

    def _lost_sample(self, dev: _Device) -> DeviceSample:
        return self._device_sample(dev, extra={"state": "lost"})

    def _device_metrics(self, dev: _Device, now: float, errors: list[str]) -> DeviceSample:
        nvml = self._nvml
        read = self._read
        if dev.pcie is None:
            dev.pcie = PcieReader(nvml)
        pcie_tx, pcie_rx = read(dev, "pcie", dev.pcie.read, errors, now) or (None, None)
        util = read(dev, "utilization", nvml.nvmlDeviceGetUtilizationRates, errors)
        memory = read(dev, "memory", nvml.nvmlDeviceGetMemoryInfo, errors)
        power_mw = read(dev, "power", nvml.nvmlDeviceGetPowerUsage, errors)
        limit_mw = read(dev, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, errors)
        mig = read(dev, "mig_mode", nvml.nvmlDeviceGetMigMode, errors)
        extra: dict[str, Any] = {"state": "ok"}
        if dev.sm_clock_max_mhz is not None:
            extra["sm_clock_max_mhz"] = dev.sm_clock_max_mhz
        return self._device_sample(
            dev,
            gpu_util=float(util.gpu) if util is not None else None,
            mem_util=float(util.memory) if util is not None else None,
            memory_used=memory.used if memory is not None else None,
            memory_total=memory.total if memory is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            sm_clock_mhz=read(
                dev, "sm_clock", nvml.nvmlDeviceGetClockInfo, errors, nvml.NVML_CLOCK_SM
            ),
            mem_clock_mhz=read(
                dev, "mem_clock", nvml.nvmlDeviceGetClockInfo, errors, nvml.NVML_CLOCK_MEM
            ),
            temperature_c=_float(
                read(
                    dev,
                    "temperature",
                    nvml.nvmlDeviceGetTemperature,
                    errors,
                    nvml.NVML_TEMPERATURE_GPU,
                )
            ),
            pcie_tx_kbs=pcie_tx,
            pcie_rx_kbs=pcie_rx,
            mig_mode=(mig[0] == nvml.NVML_DEVICE_MIG_ENABLE) if mig is not None else None,
            extra=extra,
        )

    def _process_list(self, dev: _Device, kind: str, errors: list[str]) -> list[Any] | None:
        """Newest list function the library and driver both have; cached once found."""
        nvml = self._nvml
        names = PROCESS_LISTS[kind]
        if kind in self._list_fn:
            names = (self._list_fn[kind],)
        for name in names:
            fn = getattr(nvml, name, None)
            if fn is None:
                continue
            try:
                procs = fn(dev.handle)
            except self._mismatch:
                continue
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue
                if exc.value in self._lost_codes or exc.value in self._reinit_codes:
                    raise DeviceLost(str(exc), exc.value in self._reinit_codes) from None
                self._once.report(
                    errors,
                    dev.index,
                    f"{kind}_processes",
                    f"nvml gpu{dev.index} {kind} processes: {exc}",
                )
                return None
            self._list_fn[kind] = name
            self._once.clear(dev.index, f"{kind}_processes")
            return procs
        self._once.report(
            errors,
            dev.index,
            f"{kind}_processes",
            f"nvml gpu{dev.index} {kind} processes: no list function in this library/driver",
        )
        return None

    def _process_utilization(
        self, dev: _Device, now: float, errors: list[str]
    ) -> dict[int, _ProcessUtil]:
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(dev.handle, dev.last_seen_us)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_FOUND:
                samples = []  # nothing newer than last_seen_us
            elif exc.value in self._lost_codes or exc.value in self._reinit_codes:
                raise DeviceLost(str(exc), exc.value in self._reinit_codes) from None
            else:
                self._once.report(
                    errors,
                    dev.index,
                    "process_utilization",
                    f"nvml gpu{dev.index} process utilization: {exc}",
                )
                dev.utils.clear()
                return dev.utils
        else:
            self._once.clear(dev.index, "process_utilization")
        for s in samples:
            known = dev.utils.get(s.pid)
            if known is None or s.timeStamp >= known.time_us:
                dev.utils[s.pid] = _ProcessUtil(
                    s.timeStamp,
                    float(s.smUtil),
                    float(s.memUtil),
                    float(s.encUtil),
                    float(s.decUtil),
                )
            if s.timeStamp > dev.last_seen_us:
                dev.last_seen_us = s.timeStamp
        oldest = int((now - UTIL_STALE_AFTER_S) * 1_000_000)
        for pid in [p for p, u in dev.utils.items() if u.time_us < oldest]:
            del dev.utils[pid]
        return dev.utils

    def _processes(self, dev: _Device, now: float, errors: list[str]) -> list[ProcessGpuUsage]:
        by_pid: dict[int, ProcessGpuUsage] = {}
        for kind in ("compute", "graphics"):
            for info in self._process_list(dev, kind, errors) or ():
                usage = by_pid.get(info.pid)
                if usage is None:
                    usage = by_pid[info.pid] = ProcessGpuUsage(
                        pid=info.pid,
                        vendor="nvidia",
                        device_index=dev.index,
                        device_uuid=dev.uuid,
                        kind=kind,
                    )
                elif usage.kind != kind:
                    usage.kind = "compute+graphics"  # nvidia-smi's "C+G"
                if info.usedGpuMemory is not None:
                    # Both lists carry the same per-process total for a C+G process.
                    usage.used_memory = max(usage.used_memory or 0, info.usedGpuMemory)
        utils = self._process_utilization(dev, now, errors)
        for pid, u in utils.items():
            usage = by_pid.get(pid)
            if usage is None:  # sampled on the GPU but already off both lists
                usage = by_pid[pid] = ProcessGpuUsage(
                    pid=pid, vendor="nvidia", device_index=dev.index, device_uuid=dev.uuid
                )
            usage.sm_util, usage.mem_util, usage.enc_util, usage.dec_util = (
                u.sm,
                u.mem,
                u.enc,
                u.dec,
            )
        for usage in by_pid.values():
            usage.ns_pid = namespace_pid(usage.pid, self._proc_root)
        return sorted(by_pid.values(), key=lambda p: p.pid)


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None
