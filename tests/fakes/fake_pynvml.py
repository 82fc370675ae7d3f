"""A fake ``pynvml`` module: same names, return types and error classes as nvidia-ml-py 13.

Built as a real module object (``FakeNvml().module``) so the NVML adapter cannot
tell it from the real one: errors are ``NVMLError`` instances whose ``__new__``
maps the code to the per-code subclass (``NVMLError(6)`` is an
``NVMLError_NotFound``), process lists are objects with ``pid`` /
``usedGpuMemory`` / ``gpuInstanceId`` / ``computeInstanceId`` attributes like
pynvml's ``nvmlFriendlyObject``, and utilisation samples are
``c_nvmlProcessUtilizationSample_t`` ctypes structures.

Default values are an H100 SXM5 80GB as NVML reports it: 81559 MiB total
memory (nvidia-smi shows "81559MiB"), 700 W enforced power limit, 1980 MHz
maximum SM clock, 2619 MHz memory clock (HBM3), PCI bus id
"00000000:18:00.0", driver 550.54.15 (public H100 spec sheet and nvidia-smi
output of that driver).
"""

from __future__ import annotations

import ctypes
import string
import types
from dataclasses import dataclass, field

MIB = 1024 * 1024

# The codes pynvml defines (nvml.h's nvmlReturn_t).
ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_GPU_NOT_FOUND": 28,
    "NVML_ERROR_UNKNOWN": 999,
}
_STRINGS = {
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    1: "Uninitialized",
    28: "GPU not found",
}


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}

    def __new__(typ, value):
        if typ is NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


class NVMLLibraryMismatchError(Exception):
    pass


def _error_classes() -> dict[str, type]:
    classes = {}
    for name, value in ERROR_CODES.items():
        # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, as pynvml names them
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace(
            "_", ""
        )

        def new(typ, *args, _value=value):
            return NVMLError.__new__(typ, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        NVMLError._valClassMapping[value] = cls
        classes[class_name] = cls
    return classes


ERROR_CLASSES = _error_classes()


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlSample_t(ctypes.Structure):
    _fields_ = [("timeStamp", ctypes.c_ulonglong), ("sampleValue", c_nvmlValue_t)]


class c_nvmlAccountingStats_t(ctypes.Structure):
    _fields_ = [
        ("gpuUtilization", ctypes.c_uint),
        ("memoryUtilization", ctypes.c_uint),
        ("maxMemoryUsage", ctypes.c_ulonglong),
        ("time", ctypes.c_ulonglong),
        ("startTime", ctypes.c_ulonglong),
        ("isRunning", ctypes.c_uint),
        ("reserved", ctypes.c_uint * 5),
    ]


class c_nvmlDevice_t(ctypes.Structure):
    """pynvml's handle type is a pointer-wrapping struct; ours carries the fake's index."""

    _fields_ = [("index", ctypes.c_uint)]


class nvmlFriendlyObject:
    def __init__(self, dictionary):
        for key, value in dictionary.items():
            setattr(self, key, value)


@dataclass
class FakeProcess:
    pid: int
    used_memory: int | None  # bytes; None = NVML_VALUE_NOT_AVAILABLE (WDDM, some MIG set-ups)
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


@dataclass
class FakeAccounting:
    """nvmlDeviceGetAccountingStats of one pid: lifetime averages, peak memory, start and duration."""

    gpu_util: int
    mem_util: int
    max_memory: int  # bytes
    start_time_us: int
    time_ms: int
    running: bool = True


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c01"
    bus_id: str = "00000000:18:00.0"
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    util_gpu: int = 0
    util_memory: int = 0
    power_mw: int = 71_000  # an idle H100 SXM draws ~70 W
    power_limit_mw: int = 700_000
    sm_clock: int = 345  # idle clock
    sm_clock_max: int = 1980
    mem_clock: int = 2619
    temperature: int = 32
    pcie_tx_kbs: int = 0
    pcie_rx_kbs: int = 0
    mig_mode: int = 0
    compute: list[FakeProcess] = field(default_factory=list)
    graphics: list[FakeProcess] = field(default_factory=list)
    # (pid, timeStamp µs, sm, mem, enc, dec); the driver's ring buffer of samples
    util_samples: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    # PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES) and the driver timestamp of their reading;
    # pcie_counters False: the fields answer NOT_SUPPORTED in their nvmlReturn, as on GPUs without them.
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    counters_time_us: int = 0
    pcie_counters: bool = True
    # nvmlDeviceGetSamples ring buffers: sampling type -> [(timeStamp µs, value)]; the H100 keeps ~14 s
    # of GPU and memory utilisation, one sample per ~200 ms (values are unsigned ints, power in mW).
    history: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # Accounting mode (nvidia-smi -am 1) and its per-pid records, also for exited pids (4,000-pid buffer).
    accounting_mode: int = 0
    accounting: dict[int, FakeAccounting] = field(default_factory=dict)
    failing: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False  # every call on this GPU raises GPU_IS_LOST


class FakeNvml:
    """The fake library state plus the module built from it (``.module``)."""

    def __init__(
        self, gpus: list[FakeGpu] | None = None, driver_version: str = "550.54.15"
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.driver_version = driver_version
        self.init_error: int | None = None  # code nvmlInit raises (12 = library not found)
        self.initialized = False
        self.init_calls = 0
        self.calls = 0
        self.call_counts: dict[str, int] = {}  # per-GPU function name -> calls
        self.module = self._build_module()

    # -- helpers for tests ---------------------------------------------------

    def remove(self, *names: str) -> None:
        """Make functions absent from the module (an older nvidia-ml-py)."""
        for name in names:
            delattr(self.module, name)

    def driver_unloaded(self) -> None:
        """The kernel driver went away: NVML is no longer initialised."""
        self.initialized = False
        self.init_error = ERROR_CODES["NVML_ERROR_DRIVER_NOT_LOADED"]

    def driver_loaded(self) -> None:
        self.init_error = None

    # -- the module ----------------------------------------------------------

    def _raise(self, code: int):
        raise NVMLError(code)

    def _gpu(self, handle, fn_name: str) -> FakeGpu:
        self.calls += 1
        self.call_counts[fn_name] = self.call_counts.get(fn_name, 0) + 1
        if not self.initialized:
            self._raise(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
        gpu = self.gpus[handle.index]
        if gpu.lost:
            self._raise(ERROR_CODES["NVML_ERROR_GPU_IS_LOST"])
        if fn_name in gpu.failing:
            self._raise(gpu.failing[fn_name])
        return gpu

    def _build_module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        fake = self
        for name, value in ERROR_CODES.items():
            setattr(m, name, value)
        m.NVML_SUCCESS = 0
        for name, cls in ERROR_CLASSES.items():
            setattr(m, name, cls)
        m.NVMLError = NVMLError
        m.NVMLLibraryMismatchError = NVMLLibraryMismatchError
        m.NVML_CLOCK_GRAPHICS, m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_CLOCK_VIDEO = 0, 1, 2, 3
        m.NVML_TEMPERATURE_GPU = 0
        m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
        m.NVML_DEVICE_MIG_DISABLE, m.NVML_DEVICE_MIG_ENABLE = 0, 1
        m.NVML_FEATURE_DISABLED, m.NVML_FEATURE_ENABLED = 0, 1
        m.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, m.NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198
        (
            m.NVML_TOTAL_POWER_SAMPLES,
            m.NVML_GPU_UTILIZATION_SAMPLES,
            m.NVML_MEMORY_UTILIZATION_SAMPLES,
        ) = 0, 1, 2
        (
            m.NVML_VALUE_TYPE_DOUBLE,
            m.NVML_VALUE_TYPE_UNSIGNED_INT,
            m.NVML_VALUE_TYPE_UNSIGNED_LONG,
            m.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            m.NVML_VALUE_TYPE_SIGNED_LONG_LONG,
            m.NVML_VALUE_TYPE_SIGNED_INT,
            m.NVML_VALUE_TYPE_UNSIGNED_SHORT,
        ) = range(7)
        m.c_nvmlFieldValue_t = c_nvmlFieldValue_t
        m.c_nvmlSample_t = c_nvmlSample_t
        m.c_nvmlAccountingStats_t = c_nvmlAccountingStats_t
        m.c_nvmlProcessUtilizationSample_t = c_nvmlProcessUtilizationSample_t
        m.c_nvmlUtilization_t = c_nvmlUtilization_t
        m.c_nvmlMemory_t = c_nvmlMemory_t

        def nvmlInit():
            fake.init_calls += 1
            if fake.init_error is not None:
                raise NVMLError(fake.init_error)
            fake.initialized = True

        def nvmlShutdown():
            if not fake.initialized:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            fake.initialized = False

        def nvmlSystemGetDriverVersion():
            if not fake.initialized:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            return fake.driver_version  # pynvml's @convertStrBytes decodes to str

        def nvmlDeviceGetCount():
            fake.calls += 1
            if not fake.initialized:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            return len(fake.gpus)

        def nvmlDeviceGetHandleByIndex(index):
            fake.calls += 1
            if not fake.initialized:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            if index >= len(fake.gpus):
                raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])
            if fake.gpus[index].lost:
                raise NVMLError(ERROR_CODES["NVML_ERROR_GPU_IS_LOST"])
            return c_nvmlDevice_t(index)

        def nvmlDeviceGetHandleByUUID(uuid):
            fake.calls += 1
            if not fake.initialized:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            for index, gpu in enumerate(fake.gpus):
                if gpu.uuid == uuid:
                    if gpu.lost:
                        raise NVMLError(ERROR_CODES["NVML_ERROR_GPU_IS_LOST"])
                    return c_nvmlDevice_t(index)
            raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_FOUND"])

        def simple(fn_name, getter):
            def fn(handle, *args):
                return getter(fake._gpu(handle, fn_name), *args)

            fn.__name__ = fn_name
            setattr(m, fn_name, fn)

        simple("nvmlDeviceGetName", lambda g: g.name)
        simple("nvmlDeviceGetUUID", lambda g: g.uuid)
        simple(
            "nvmlDeviceGetPciInfo",
            lambda g: nvmlPciInfo_t(busId=g.bus_id.encode(), busIdLegacy=g.bus_id.encode()),
        )
        simple(
            "nvmlDeviceGetUtilizationRates",
            lambda g: c_nvmlUtilization_t(g.util_gpu, g.util_memory),
        )
        simple(
            "nvmlDeviceGetMemoryInfo",
            lambda g: c_nvmlMemory_t(g.memory_total, g.memory_total - g.memory_used, g.memory_used),
        )
        simple("nvmlDeviceGetPowerUsage", lambda g: g.power_mw)
        simple("nvmlDeviceGetEnforcedPowerLimit", lambda g: g.power_limit_mw)
        simple(
            "nvmlDeviceGetClockInfo", lambda g, t: {1: g.sm_clock, 0: g.sm_clock, 2: g.mem_clock}[t]
        )
        simple(
            "nvmlDeviceGetMaxClockInfo",
            lambda g, t: {1: g.sm_clock_max, 0: g.sm_clock_max, 2: g.mem_clock}[t],
        )
        simple("nvmlDeviceGetTemperature", lambda g, sensor: g.temperature)
        simple(
            "nvmlDeviceGetPcieThroughput", lambda g, c: g.pcie_tx_kbs if c == 0 else g.pcie_rx_kbs
        )
        simple("nvmlDeviceGetMigMode", lambda g: [g.mig_mode, g.mig_mode])

        def friendly(procs):
            return [
                nvmlFriendlyObject(
                    {
                        "pid": p.pid,
                        "usedGpuMemory": p.used_memory,
                        "gpuInstanceId": p.gpu_instance_id,
                        "computeInstanceId": p.compute_instance_id,
                    }
                )
                for p in procs
            ]

        for kind in ("Compute", "Graphics"):
            attr = kind.lower()
            for suffix in ("_v3", "_v2", ""):
                name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"

                def lister(handle, _name=name, _attr=attr, _plain=(suffix == "")):
                    try:
                        gpu = fake._gpu(handle, _name)
                    except ERROR_CLASSES["NVMLError_FunctionNotFound"]:
                        if _plain:  # pynvml's @throwOnVersionMismatch
                            raise NVMLLibraryMismatchError(
                                "Unversioned function called and the pyNVML "
                                "version does not match the NVML lib version."
                            ) from None
                        raise
                    return friendly(getattr(gpu, _attr))

                lister.__name__ = name
                setattr(m, name, lister)

        def nvmlDeviceGetProcessUtilization(handle, timeStamp):
            gpu = fake._gpu(handle, "nvmlDeviceGetProcessUtilization")
            newer = [s for s in gpu.util_samples if s[1] > timeStamp]
            if not newer:
                # The real call's size query returns NOT_FOUND when no sample is newer.
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_FOUND"])
            array = (c_nvmlProcessUtilizationSample_t * len(newer))(
                *[c_nvmlProcessUtilizationSample_t(*s) for s in newer]
            )
            return array[0 : len(newer)]

        def nvmlDeviceGetFieldValues(handle, fieldIds):
            gpu = fake._gpu(handle, "nvmlDeviceGetFieldValues")
            values = (c_nvmlFieldValue_t * len(fieldIds))()
            for i, field_id in enumerate(fieldIds):
                values[i].fieldId = field_id
                values[i].timestamp = gpu.counters_time_us
                values[i].valueType = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                counter = {197: gpu.pcie_tx_bytes, 198: gpu.pcie_rx_bytes}.get(field_id)
                if counter is None or not gpu.pcie_counters:
                    values[i].nvmlReturn = ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"]
                else:
                    values[i].nvmlReturn = 0
                    values[i].value.ullVal = counter
            return values

        def nvmlDeviceGetSamples(device, sampling_type, timeStamp):
            gpu = fake._gpu(device, "nvmlDeviceGetSamples")
            if sampling_type not in gpu.history:
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
            newer = [(t, v) for t, v in gpu.history[sampling_type] if t > timeStamp]
            if not newer:
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_FOUND"])
            samples = (c_nvmlSample_t * len(newer))()
            for i, (t, v) in enumerate(newer):
                samples[i].timeStamp = t
                samples[i].sampleValue.uiVal = v
            return (1, samples[0 : len(newer)])  # NVML_VALUE_TYPE_UNSIGNED_INT, as the H100 answers

        def nvmlDeviceGetAccountingMode(handle):
            return fake._gpu(handle, "nvmlDeviceGetAccountingMode").accounting_mode

        def nvmlDeviceSetAccountingMode(handle, mode):
            fake._gpu(handle, "nvmlDeviceSetAccountingMode").accounting_mode = int(mode)

        def nvmlDeviceGetAccountingPids(handle):
            gpu = fake._gpu(handle, "nvmlDeviceGetAccountingPids")
            if not gpu.accounting_mode:
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
            return list(gpu.accounting)

        def nvmlDeviceGetAccountingStats(handle, pid):
            gpu = fake._gpu(handle, "nvmlDeviceGetAccountingStats")
            if not gpu.accounting_mode:
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
            record = gpu.accounting.get(pid)
            if record is None:
                raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_FOUND"])
            return c_nvmlAccountingStats_t(
                record.gpu_util,
                record.mem_util,
                record.max_memory,
                record.time_ms,
                record.start_time_us,
                int(record.running),
            )

        for fn in (
            nvmlDeviceGetFieldValues,
            nvmlDeviceGetSamples,
            nvmlDeviceGetAccountingMode,
            nvmlDeviceSetAccountingMode,
            nvmlDeviceGetAccountingPids,
            nvmlDeviceGetAccountingStats,
        ):
            setattr(m, fn.__name__, fn)
        for fn in (
            nvmlInit,
            nvmlShutdown,
            nvmlSystemGetDriverVersion,
            nvmlDeviceGetCount,
            nvmlDeviceGetHandleByIndex,
            nvmlDeviceGetHandleByUUID,
            nvmlDeviceGetProcessUtilization,
        ):
            setattr(m, fn.__name__, fn)
        return m
