"""A fake ``amdsmi`` module: the names, dict shapes and exceptions of amdsmi 7.0.

``FakeAmdSmi().module`` is a module object with ``amdsmi_init``,
``amdsmi_get_processor_handles``, ``amdsmi_get_gpu_activity``,
``amdsmi_get_gpu_process_list`` … returning the same dicts (with "N/A" where
the real binding writes it), raising ``AmdSmiLibraryException(status)`` whose
``get_error_code()`` / ``get_error_info()`` behave like the real one, and
handles of the real handle type (``ctypes.c_void_p``).

Default values are an AMD Instinct MI300X (OAM) from AMD's data sheet: 192 GB
HBM3 (196,608 MiB as amdsmi counts VRAM in MB), 750 W board power, 2100 MHz
peak engine clock, 1300 MHz memory clock (5.2 Gbps HBM3); PCI device id
0x74a1.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field
from enum import IntEnum

STATUS = {  # amdsmi_status_t (amdsmi.h / amdsmi_wrapper)
    "AMDSMI_STATUS_SUCCESS": 0,
    "AMDSMI_STATUS_INVAL": 1,
    "AMDSMI_STATUS_NOT_SUPPORTED": 2,
    "AMDSMI_STATUS_FILE_ERROR": 14,
    "AMDSMI_STATUS_NO_PERM": 10,
    "AMDSMI_STATUS_IO": 12,
    "AMDSMI_STATUS_INIT_ERROR": 18,
    "AMDSMI_STATUS_BUSY": 30,
    "AMDSMI_STATUS_NOT_FOUND": 31,
    "AMDSMI_STATUS_NOT_INIT": 32,
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": 34,
    "AMDSMI_STATUS_NO_DATA": 40,
    "AMDSMI_STATUS_RETRY": 9,
    "AMDSMI_STATUS_TIMEOUT": 8,
}
_INFO = {
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    34: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    14: "AMDSMI_STATUS_FILE_ERROR - Error opening file",
}


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _INFO.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        )

    def __str__(self):
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed=True):
        return self.err_info if detailed else self.err_info.split(" - ")[0]

    def get_error_code(self):
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(STATUS["AMDSMI_STATUS_RETRY"])


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(STATUS["AMDSMI_STATUS_TIMEOUT"])


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received, expected, msg=None):
        super().__init__(msg)
        self.err_msg = (
            msg or f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"
        )

    def __str__(self):
        return self.err_msg


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


@dataclass
class FakeAmdProcess:
    pid: int
    name: str
    mem: int  # bytes
    gfx_ns: int = 0  # cumulative busy time on the GFX engine
    enc_ns: int = 0
    vram: int = 0
    gtt: int = 0
    cpu: int = 0


@dataclass
class FakeAmdGpu:
    market_name: str = "AMD Instinct MI300X"
    bdf: str = "0000:0c:00.0"
    uuid: str = "3cff74a1-0000-1000-80ea-5d2c1a4b8e11"
    driver_version: str = "6.10.5"
    gfx_activity: int | str = 0
    umc_activity: int | str = 0
    mm_activity: int | str = "N/A"  # MI300X has no multimedia activity counter
    vram_total_mb: int = 196_608
    vram_used_mb: int = 283
    socket_power: int | str = "N/A"  # MI300 reports current_socket_power only
    current_socket_power: int | str = 138
    power_cap_uw: int = 750_000_000
    gfx_clock: int = 132
    mem_clock: int = 900
    hotspot_c: int = 41
    processes: list[FakeAmdProcess] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)  # function name -> status
    gone: bool = False  # fell off the bus: every call NOT_FOUND, not enumerated


class FakeAmdSmi:
    def __init__(self, gpus: list[FakeAmdGpu] | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeAmdGpu()]
        self.init_status: int | None = None
        self.initialized = False
        self.init_calls = 0
        self.legacy_process_api = (
            False  # amdsmi < 6.4: list of handles + amdsmi_get_gpu_process_info
        )
        self.module = self._build()

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("amdsmi")
        fake = self
        wrapper = types.ModuleType("amdsmi.amdsmi_wrapper")
        for name, value in STATUS.items():
            setattr(wrapper, name, value)
        wrapper.amdsmi_processor_handle = ctypes.c_void_p
        m.amdsmi_wrapper = wrapper
        for cls in (
            AmdSmiException,
            AmdSmiLibraryException,
            AmdSmiRetryException,
            AmdSmiTimeoutException,
            AmdSmiParameterException,
            AmdSmiInitFlags,
            AmdSmiClkType,
            AmdSmiTemperatureType,
            AmdSmiTemperatureMetric,
        ):
            setattr(m, cls.__name__, cls)

        def check(status):
            if status:
                raise AmdSmiLibraryException(status)

        def gpu_of(handle, fn_name):
            if not fake.initialized:
                check(STATUS["AMDSMI_STATUS_NOT_INIT"])
            if not isinstance(handle, ctypes.c_void_p):
                raise AmdSmiParameterException(handle, ctypes.c_void_p)
            gpu = fake.gpus[handle.value - 1]
            if gpu.gone:
                check(STATUS["AMDSMI_STATUS_NOT_FOUND"])
            check(gpu.failing.get(fn_name, 0))
            return gpu

        def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
            if not isinstance(flag, AmdSmiInitFlags):
                raise AmdSmiParameterException(flag, AmdSmiInitFlags)
            fake.init_calls += 1
            check(fake.init_status or 0)
            fake.initialized = True

        def amdsmi_shut_down():
            fake.initialized = False

        def amdsmi_get_processor_handles():
            if not fake.initialized:
                check(STATUS["AMDSMI_STATUS_NOT_INIT"])
            return [ctypes.c_void_p(i + 1) for i, g in enumerate(fake.gpus) if not g.gone]

        def define(name, body):
            def fn(handle, *args):
                return body(gpu_of(handle, name), *args)

            fn.__name__ = name
            setattr(m, name, fn)

        define("amdsmi_get_gpu_device_bdf", lambda g: g.bdf)
        define("amdsmi_get_gpu_device_uuid", lambda g: g.uuid)
        define(
            "amdsmi_get_gpu_asic_info",
            lambda g: {
                "market_name": g.market_name,
                "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "subvendor_id": "0x1002",
                "device_id": "0x74a1",
                "rev_id": "0x00",
                "asic_serial": "0x5D1A2B3C4D5E6F70",
                "oam_id": 0,
                "num_compute_units": 304,
                "target_graphics_version": "gfx942",
                "subsystem_id": "0x74a1",
            },
        )
        define(
            "amdsmi_get_gpu_driver_info",
            lambda g: {
                "driver_name": "amdgpu",
                "driver_version": g.driver_version,
                "driver_date": "2015/01/01 00:00",
            },
        )
        define(
            "amdsmi_get_gpu_activity",
            lambda g: {
                "gfx_activity": g.gfx_activity,
                "umc_activity": g.umc_activity,
                "mm_activity": g.mm_activity,
            },
        )
        define(
            "amdsmi_get_gpu_vram_usage",
            lambda g: {"vram_total": g.vram_total_mb, "vram_used": g.vram_used_mb},
        )
        define(
            "amdsmi_get_power_info",
            lambda g: {
                "socket_power": g.socket_power,
                "current_socket_power": g.current_socket_power,
                "average_socket_power": "N/A",
                "gfx_voltage": "N/A",
                "soc_voltage": "N/A",
                "mem_voltage": "N/A",
                "power_limit": g.power_cap_uw // 1_000_000,
            },
        )
        define(
            "amdsmi_get_power_cap_info",
            lambda g: {
                "power_cap": g.power_cap_uw,
                "default_power_cap": g.power_cap_uw,
                "dpm_cap": 0,
                "min_power_cap": 0,
                "max_power_cap": g.power_cap_uw,
            },
        )

        def clock(g, clk_type):
            if not isinstance(clk_type, AmdSmiClkType):
                raise AmdSmiParameterException(clk_type, AmdSmiClkType)
            clk = g.mem_clock if clk_type == AmdSmiClkType.MEM else g.gfx_clock
            return {
                "clk": clk,
                "min_clk": 100,
                "max_clk": 2100 if clk_type != AmdSmiClkType.MEM else 1300,
                "clk_locked": False,
                "clk_deep_sleep": "N/A",
            }

        define("amdsmi_get_clock_info", clock)
        define("amdsmi_get_temp_metric", lambda g, sensor, metric: g.hotspot_c)

        def process_dict(p):
            return {
                "name": p.name,
                "pid": p.pid,
                "mem": p.mem,
                "engine_usage": {"gfx": p.gfx_ns, "enc": p.enc_ns},
                "memory_usage": {"gtt_mem": p.gtt, "cpu_mem": p.cpu, "vram_mem": p.vram},
                "cu_occupancy": "N/A",
            }

        def process_list(g):
            if fake.legacy_process_api:
                return [p.pid for p in g.processes]  # amdsmi_process_handle_t values
            return [process_dict(p) for p in g.processes]

        def process_info(g, process_handle):
            for p in g.processes:
                if p.pid == process_handle:
                    return process_dict(p)
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_FOUND"])

        define("amdsmi_get_gpu_process_list", process_list)
        define("amdsmi_get_gpu_process_info", process_info)
        for fn in (amdsmi_init, amdsmi_shut_down, amdsmi_get_processor_handles):
            setattr(m, fn.__name__, fn)
        return m
