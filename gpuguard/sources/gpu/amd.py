"""AMD GPUs through amdsmi (ROCm's Python binding): devices and per-process use.

The library module is injectable (``open_sampler(library=...)``) so tests run
this adapter against a faithful fake of ``amdsmi``.

Units as amdsmi 6.x/7.x documents them: activity in percent (0xFFFF -> "N/A"),
VRAM usage in MB, socket power in W, power cap in µW, clocks in MHz,
temperatures in °C, process ``mem`` and ``memory_usage`` in bytes and
``engine_usage`` as cumulative busy nanoseconds, which this module turns into
percent between two samples (``None`` on the first sighting of a process).

A device whose calls fail with NOT_INIT, DRIVER_NOT_LOADED or NOT_FOUND is
treated as gone: it stays listed with ``extra["state"] = "lost"``, and each
later sample re-enumerates the handles (matching by PCI address), re-initialising
amdsmi at most every ``REINIT_INTERVAL_S`` if the library lost its state.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.sources.gpu.sampler import OnceErrors, SourceUnavailable
from gpuguard.sources.proc.pidns import namespace_pid

SOURCE = "amdsmi"
REINIT_INTERVAL_S = 5.0
MB = 1024 * 1024  # amdsmi's "MB" for VRAM is mebibytes (sysfs bytes >> 20)

# amdsmi_status_t values from amdsmi.h (same in amdsmi.amdsmi_wrapper).
STATUS_NOT_SUPPORTED = 2
STATUS_NO_PERM = 10
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
_LOST = {STATUS_NOT_FOUND, STATUS_NOT_INIT, STATUS_DRIVER_NOT_LOADED}
_REINIT = {STATUS_NOT_INIT, STATUS_DRIVER_NOT_LOADED}


_NO_LIBRARY = (
    "libamd_smi.so not found",
    "install ROCm's amd-smi-lib (it ships libamd_smi.so) or set ROCM_PATH",
)


def _library_absent() -> bool:
    """True when no place the binding looks for libamd_smi.so holds it (amdsmi_wrapper's
    find_smi_library: $ROCM_HOME or $ROCM_PATH/lib, the linker's search, the package's own
    directory, /opt/rocm/lib): importing it (~25 ms) would only fail the same way."""
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        return False  # not installed: the import says so
    rocm = os.getenv("ROCM_HOME", os.getenv("ROCM_PATH"))
    places = [os.path.join(rocm, "lib/libamd_smi.so")] if rocm else []
    places += [
        "libamd_smi.so",
        os.path.join(os.path.realpath(spec.submodule_search_locations[0]), "libamd_smi.so"),
        os.path.join(os.getenv("ROCM_PATH", "/opt/rocm"), "lib", "libamd_smi.so"),
    ]
    for place in places:
        try:
            ctypes.CDLL(place)
        except OSError:
            continue
        return False
    return True


def load_library() -> ModuleType:
    if "amdsmi" not in sys.modules and _library_absent():
        raise SourceUnavailable(*_NO_LIBRARY)
    # Without ROCm the binding prints to stdout and raises KeyError('libamd_smi.so')
    # at import; stdout may be a JSON stream, so the message is swallowed here.
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            import amdsmi
        except ImportError:
            raise SourceUnavailable(
                "the amdsmi Python package is not installed", "pip install amdsmi"
            ) from None
        except (KeyError, OSError):
            raise SourceUnavailable(*_NO_LIBRARY) from None
    return amdsmi


def open_sampler(
    proc_root: str = "/proc",
    library: ModuleType | None = None,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> AmdSmiSampler:
    smi = library if library is not None else load_library()
    try:
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except smi.AmdSmiLibraryException as exc:
        code = exc.get_error_code()
        if code == STATUS_DRIVER_NOT_LOADED:
            raise SourceUnavailable(
                "amdgpu driver not loaded", "load it: modprobe amdgpu"
            ) from None
        if code == STATUS_NO_PERM:
            raise SourceUnavailable(
                "no permission to open the AMD GPUs",
                "run as root or add the user to the render group",
            ) from None
        raise SourceUnavailable(
            f"amdsmi_init failed: {_reason(exc)}", "check the ROCm installation (amd-smi list)"
        ) from None
    try:
        handles = smi.amdsmi_get_processor_handles()
    except smi.AmdSmiLibraryException as exc:
        _shut_down(smi)
        raise SourceUnavailable(
            f"cannot list AMD GPUs: {_reason(exc)}", "check `amd-smi list` and dmesg"
        ) from None
    if not handles:
        _shut_down(smi)
        raise SourceUnavailable(
            "no AMD GPU found", "check `amd-smi list` and that the amdgpu driver bound the GPUs"
        )
    return AmdSmiSampler(smi, handles, proc_root=proc_root, clock=clock, monotonic=monotonic)


def _shut_down(smi: ModuleType) -> None:
    try:
        smi.amdsmi_shut_down()
    except smi.AmdSmiException:
        pass


def _reason(exc: Exception) -> str:
    get = getattr(exc, "get_error_info", None)
    return get() if get else str(exc)


def _number(value: Any) -> float | None:
    """amdsmi writes "N/A" where a value is not available."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Lost(Exception):
    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    lost: bool = False
    bdf: str | None = None
    uuid: str | None = None
    name: str | None = None
    driver: str | None = None
    driver_version: str | None = None
    # pid -> (monotonic seconds, gfx ns, enc ns) at the previous sample
    engine_ns: dict[int, tuple[float, int, int]] = field(default_factory=dict)

    def sample(self, **measured: Any) -> DeviceSample:
        """A sample of this device: its identity, and what was ``measured`` (or its state)."""
        return DeviceSample(
            vendor="amd",
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            pci_bus_id=self.bdf,
            driver=self.driver,
            driver_version=self.driver_version,
            **measured,
        )


class AmdSmiSampler:
    """Samples every AMD GPU amdsmi can see."""

    source = SOURCE

    def __init__(
        self,
        smi: ModuleType,
        handles: list[Any],
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._smi = smi
        self._proc_root = proc_root
        self._clock = clock
        self._monotonic = monotonic
        self._once = OnceErrors()
        self._need_reinit = False
        self._last_reinit = float("-inf")
        self._closed = False
        self._devices = [_Device(i, h) for i, h in enumerate(handles)]
        self._pending_errors: list[str] = []  # from opening, shown with the first sample
        for dev in self._devices:
            try:
                self._identify(dev, self._pending_errors)
            except _Lost as lost:
                dev.lost = True
                self._once.report(
                    self._pending_errors, dev.index, "state", self._lost_line(dev, str(lost))
                )

    def sample(self) -> GpuSnapshot:
        now, mono = self._clock(), self._monotonic()
        errors, self._pending_errors = self._pending_errors, []
        if any(d.lost for d in self._devices):
            self._recover(mono, errors)
        devices: list[DeviceSample] = []
        processes: list[ProcessGpuUsage] = []
        for dev in self._devices:
            if dev.lost:
                devices.append(self._lost_sample(dev))
                continue
            try:
                metrics = self._device_metrics(dev, errors)
                procs = self._processes(dev, mono, errors)
            except _Lost as lost:
                dev.lost = True
                if lost.code in _REINIT:
                    self._need_reinit = True
                self._once.report(errors, dev.index, "state", self._lost_line(dev, str(lost)))
                devices.append(self._lost_sample(dev))
                continue
            self._once.clear(dev.index, "state")
            devices.append(metrics)
            processes.extend(procs)
        return GpuSnapshot(
            time=now, source=SOURCE, devices=devices, processes=processes, errors=errors
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _shut_down(self._smi)

    # -- calls --------------------------------------------------------------

    def _call(
        self, dev: _Device, name: str, errors: list[str], fn: Callable[..., Any], *args: Any
    ) -> Any:
        try:
            value = fn(dev.handle, *args)
        except self._smi.AmdSmiLibraryException as exc:
            code = exc.get_error_code()
            if code in _LOST:
                raise _Lost(_reason(exc), code) from None
            self._once.report(
                errors, dev.index, name, f"amdsmi gpu{dev.index} {name}: {_reason(exc)}"
            )
            return None
        except self._smi.AmdSmiException as exc:  # parameter/key errors from the binding itself
            self._once.report(errors, dev.index, name, f"amdsmi gpu{dev.index} {name}: {exc}")
            return None
        self._once.clear(dev.index, name)
        return value

    def _identify(self, dev: _Device, errors: list[str]) -> None:
        smi = self._smi
        dev.bdf = dev.bdf or self._call(dev, "bdf", errors, smi.amdsmi_get_gpu_device_bdf)
        dev.uuid = dev.uuid or self._call(dev, "uuid", errors, smi.amdsmi_get_gpu_device_uuid)
        asic = self._call(dev, "asic_info", errors, smi.amdsmi_get_gpu_asic_info)
        if asic and asic.get("market_name") not in (None, "N/A"):
            dev.name = asic["market_name"]
        driver = self._call(dev, "driver_info", errors, smi.amdsmi_get_gpu_driver_info)
        if driver:
            dev.driver = (
                driver.get("driver_name") if driver.get("driver_name") != "N/A" else "amdgpu"
            )
            dev.driver_version = (
                driver.get("driver_version") if driver.get("driver_version") != "N/A" else None
            )

    def _recover(self, mono: float, errors: list[str]) -> None:
        smi = self._smi
        if self._need_reinit:
            if mono - self._last_reinit < REINIT_INTERVAL_S:
                return
            self._last_reinit = mono
            _shut_down(smi)
            try:
                smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            except smi.AmdSmiLibraryException as exc:
                self._once.report(
                    errors,
                    "system",
                    "init",
                    f"amdsmi: re-initialising failed: {_reason(exc)}; "
                    f"retrying every {REINIT_INTERVAL_S:g} s",
                )
                return
            self._once.clear("system", "init")
            self._need_reinit = False
            for dev in self._devices:
                dev.lost = True  # every handle from before the re-init is stale
        try:
            handles = smi.amdsmi_get_processor_handles()
        except smi.AmdSmiLibraryException as exc:
            if exc.get_error_code() in _REINIT:
                self._need_reinit = True
            return
        by_bdf = {}
        for handle in handles:
            try:
                by_bdf[smi.amdsmi_get_gpu_device_bdf(handle)] = handle
            except smi.AmdSmiLibraryException:
                continue
        for dev in self._devices:
            if dev.lost and dev.bdf in by_bdf:
                dev.handle, dev.lost = by_bdf[dev.bdf], False
                dev.engine_ns.clear()

    def _lost_line(self, dev: _Device, reason: str) -> str:
        who = f"gpu{dev.index}" + (f" ({dev.bdf})" if dev.bdf else "")
        return f"amdsmi {who} unavailable: {reason}; retrying each sample"

    def _lost_sample(self, dev: _Device) -> DeviceSample:
        return dev.sample(extra={"state": "lost"})

    # -- metrics ------------------------------------------------------------

    def _device_metrics(self, dev: _Device, errors: list[str]) -> DeviceSample:
        smi = self._smi
        call = self._call
        activity = call(dev, "activity", errors, smi.amdsmi_get_gpu_activity) or {}
        vram = call(dev, "vram_usage", errors, smi.amdsmi_get_gpu_vram_usage) or {}
        power = call(dev, "power", errors, smi.amdsmi_get_power_info) or {}
        cap = call(dev, "power_cap", errors, smi.amdsmi_get_power_cap_info) or {}
        gfx_clock = (
            call(dev, "gfx_clock", errors, smi.amdsmi_get_clock_info, smi.AmdSmiClkType.GFX) or {}
        )
        mem_clock = (
            call(dev, "mem_clock", errors, smi.amdsmi_get_clock_info, smi.AmdSmiClkType.MEM) or {}
        )
        # Hotspot (junction) is what amd-smi shows first; MI300 has no edge sensor.
        temperature = call(
            dev,
            "temperature",
            errors,
            smi.amdsmi_get_temp_metric,
            smi.AmdSmiTemperatureType.HOTSPOT,
            smi.AmdSmiTemperatureMetric.CURRENT,
        )
        # MI300 reports current_socket_power only; older parts socket/average power.
        power_w = next(
            (
                p
                for p in (
                    _number(power.get(k))
                    for k in ("socket_power", "current_socket_power", "average_socket_power")
                )
                if p
            ),
            None,
        )
        vram_total, vram_used = _number(vram.get("vram_total")), _number(vram.get("vram_used"))
        power_cap = _number(cap.get("power_cap"))
        extra: dict[str, Any] = {"state": "ok"}
        mm = _number(activity.get("mm_activity"))
        if mm is not None:
            extra["mm_util"] = mm
        return dev.sample(
            gpu_util=_number(activity.get("gfx_activity")),
            mem_util=_number(activity.get("umc_activity")),
            memory_used=int(vram_used) * MB if vram_used is not None else None,
            memory_total=int(vram_total) * MB if vram_total is not None else None,
            power_w=power_w,
            power_limit_w=power_cap / 1_000_000 if power_cap is not None else None,
            sm_clock_mhz=_int(gfx_clock.get("clk")),
            mem_clock_mhz=_int(mem_clock.get("clk")),
            temperature_c=_number(temperature),
            extra=extra,
        )

    def _process_entries(self, dev: _Device, errors: list[str]) -> list[dict[str, Any]]:
        smi = self._smi
        entries = self._call(dev, "processes", errors, smi.amdsmi_get_gpu_process_list)
        if not entries:
            return []
        if isinstance(entries[0], dict):
            return entries
        # amdsmi before 6.4 listed process handles; details came from a second call.
        info = getattr(smi, "amdsmi_get_gpu_process_info", None)
        if info is None:
            return []
        details = []
        for entry in entries:
            try:
                detail = info(dev.handle, entry)
            except smi.AmdSmiLibraryException as exc:
                if exc.get_error_code() != STATUS_NOT_FOUND:  # NOT_FOUND: it exited meanwhile
                    self._once.report(
                        errors,
                        dev.index,
                        "process_info",
                        f"amdsmi gpu{dev.index} process_info: {_reason(exc)}",
                    )
                continue
            if isinstance(detail, dict):
                details.append(detail)
        return details

    def _processes(self, dev: _Device, mono: float, errors: list[str]) -> list[ProcessGpuUsage]:
        out = []
        seen = set()
        for entry in self._process_entries(dev, errors):
            pid = entry.get("pid")
            if not isinstance(pid, int):
                continue
            seen.add(pid)
            engine = entry.get("engine_usage") or {}
            memory = entry.get("memory_usage") or {}
            gfx_ns, enc_ns = _int(engine.get("gfx")), _int(engine.get("enc"))
            engines: dict[str, float] = {}
            previous = dev.engine_ns.get(pid)
            if gfx_ns is not None and enc_ns is not None:
                if (
                    previous is not None
                    and mono > previous[0]
                    and gfx_ns >= previous[1]
                    and enc_ns >= previous[2]
                ):
                    elapsed_ns = (mono - previous[0]) * 1e9
                    engines["gfx"] = round((gfx_ns - previous[1]) / elapsed_ns * 100, 2)
                    engines["enc"] = round((enc_ns - previous[2]) / elapsed_ns * 100, 2)
                dev.engine_ns[pid] = (mono, gfx_ns, enc_ns)
            regions = {
                name: value
                for name, value in (
                    ("vram", memory.get("vram_mem")),
                    ("gtt", memory.get("gtt_mem")),
                    ("cpu", memory.get("cpu_mem")),
                )
                if isinstance(value, int)
            }
            out.append(
                ProcessGpuUsage(
                    pid=pid,
                    vendor="amd",
                    device_index=dev.index,
                    device_uuid=dev.uuid,
                    ns_pid=namespace_pid(pid, self._proc_root),
                    sm_util=min(engines["gfx"], 100.0) if "gfx" in engines else None,
                    enc_util=min(engines["enc"], 100.0) if "enc" in engines else None,
                    used_memory=_int(entry.get("mem")),
                    engines=engines,
                    memory_regions=regions,
                )
            )
        for pid in [p for p in dev.engine_ns if p not in seen]:
            del dev.engine_ns[pid]
        return sorted(out, key=lambda p: p.pid)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
