"""Facts about the host's GPU stack: drivers, kernel modules, taint, device-node permissions.

Data flow: /proc/driver/nvidia/version, /sys/module/*/version, /proc/modules,
/sys/module/*/taint, /proc/sys/kernel/tainted, NVML (when a driver is present)
and a stat of every GPU device node -> one :class:`GpuStackFacts`.
``gpuguard.detect.host.checks`` turns these facts into findings; nothing here
judges.  Every part that cannot be read becomes a line in ``unavailable``
("not available" is a value, not an exception).

Two roots: ``proc_root``/``sys_root`` are the live kernel's views; ``root`` is
the filesystem tree for device nodes (``--root`` points it at a test tree).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import stat
import sys
from dataclasses import dataclass, field

from gpuguard.events.abi import DeviceClass, device_class_name
from gpuguard.events.devices import classify_device_path

GPU_MODULES = (
    "nvidia",
    "nvidia_uvm",
    "nvidia_drm",
    "nvidia_modeset",
    "nvidia_peermem",
    "amdgpu",
    "amdkfd",
    "i915",
    "xe",
    "nouveau",
    "radeon",
)
MAX_SMALL_FILE = 65536
NVML_LIBRARY_NOT_FOUND = "NVML Shared Library Not Found"  # pynvml's text for its error 12

# Kernel taint bits (Documentation/admin-guide/tainted-kernels.rst).
TAINT_FLAGS: tuple[tuple[int, str, str], ...] = (
    (0, "P", "proprietary module loaded"),
    (1, "F", "module force-loaded"),
    (2, "S", "kernel running on an out-of-spec system"),
    (3, "R", "module force-unloaded"),
    (4, "M", "machine check exception"),
    (5, "B", "bad page referenced"),
    (6, "U", "taint requested by user space"),
    (7, "D", "kernel died recently (oops or BUG)"),
    (8, "A", "ACPI table overridden"),
    (9, "W", "kernel warning issued"),
    (10, "C", "staging driver loaded"),
    (11, "I", "platform firmware bug worked around"),
    (12, "O", "out-of-tree module loaded"),
    (13, "E", "unsigned module loaded"),
    (14, "L", "soft lockup occurred"),
    (15, "K", "kernel live-patched"),
    (16, "X", "auxiliary taint (distribution-defined)"),
    (17, "T", "built with struct randomization plugin"),
    (18, "N", "in-kernel test run"),
)

# Device nodes worth a permission check, relative to ``root``.
DEVICE_NODE_GLOBS = ("dev/nvidia*", "dev/nvidia-caps/*", "dev/kfd", "dev/dri/*", "dev/mem")


@dataclass(slots=True, frozen=True)
class TaintFlag:
    bit: int
    letter: str
    meaning: str


@dataclass(slots=True)
class KernelModule:
    name: str
    state: str = ""  # "Live", "Loading", "Unloading"
    taint: str = ""  # /sys/module/NAME/taint letters, e.g. "POE"
    version: str | None = None


@dataclass(slots=True)
class DeviceNode:
    path: str  # as the host sees it, i.e. without ``root``
    device_class: str
    mode: int  # permission bits
    uid: int
    gid: int
    is_char_device: bool

    @property
    def world_writable(self) -> bool:
        return bool(self.mode & stat.S_IWOTH)

    @property
    def world_readable(self) -> bool:
        return bool(self.mode & stat.S_IROTH)


@dataclass(slots=True)
class NvmlDevice:
    index: int
    name: str | None = None
    persistence_mode: bool | None = None
    accounting_mode: bool | None = None


@dataclass(slots=True)
class GpuStackFacts:
    driver_versions: dict[str, str] = field(default_factory=dict)  # source -> version
    modules: list[KernelModule] = field(default_factory=list)  # GPU modules and any tainting module
    taint: int | None = None
    taint_flags: list[TaintFlag] = field(default_factory=list)
    device_nodes: list[DeviceNode] = field(default_factory=list)
    nvml_devices: list[NvmlDevice] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)

    @property
    def gpu_modules(self) -> list[KernelModule]:
        return [m for m in self.modules if m.name in GPU_MODULES]


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SMALL_FILE).decode("utf-8", "replace")
    except OSError:
        return None


def decode_taint(value: int) -> list[TaintFlag]:
    """The set taint bits of ``/proc/sys/kernel/tainted`` with their letters and meanings."""
    return [
        TaintFlag(bit, letter, meaning)
        for bit, letter, meaning in TAINT_FLAGS
        if value & (1 << bit)
    ]


def read_kernel_taint(proc_root: str = "/proc") -> int | None:
    text = _read_small(f"{proc_root}/sys/kernel/tainted")
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def read_modules(proc_root: str = "/proc", sys_root: str = "/sys") -> list[KernelModule] | None:
    """GPU modules and every module that taints the kernel; ``None`` without /proc/modules."""
    text = _read_small(f"{proc_root}/modules")
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        name = parts[0]
        state = parts[4] if len(parts) > 4 else ""
        taint = (_read_small(f"{sys_root}/module/{name}/taint") or "").strip()
        if name in GPU_MODULES or taint:
            version = _read_small(f"{sys_root}/module/{name}/version")
            out.append(KernelModule(name, state, taint, version.strip() if version else None))
    return out


def read_driver_versions(proc_root: str = "/proc", sys_root: str = "/sys") -> dict[str, str]:
    """Driver versions as the kernel reports them, keyed by where they came from."""
    versions: dict[str, str] = {}
    nvidia = _read_small(f"{proc_root}/driver/nvidia/version")
    if nvidia:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ..."
        first = nvidia.splitlines()[0] if nvidia.splitlines() else ""
        words = first.split()
        numeric = [w for w in words if w[:1].isdigit() and "." in w]
        versions["nvidia-kernel"] = numeric[0] if numeric else first.strip()
    for module in ("nvidia", "amdgpu", "i915", "xe"):
        text = _read_small(f"{sys_root}/module/{module}/version")
        if text and text.strip():
            versions[f"{module}-module"] = text.strip()
    return versions


def read_device_nodes(root: str = "/") -> list[DeviceNode]:
    """Permissions of every GPU, raw-memory and PCI BAR node under ``root`` (bounded globs)."""
    nodes = []
    patterns = list(DEVICE_NODE_GLOBS) + ["sys/bus/pci/devices/*/resource[0-9]*"]
    for pattern in patterns:
        for real in sorted(glob.glob(os.path.join(root, pattern)))[:4096]:
            host_path = "/" + os.path.relpath(real, root)
            device_class = classify_device_path(host_path)
            if device_class == DeviceClass.NONE:
                continue
            try:
                st = os.lstat(real)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
                continue
            nodes.append(
                DeviceNode(
                    host_path,
                    device_class_name(device_class),
                    stat.S_IMODE(st.st_mode),
                    st.st_uid,
                    st.st_gid,
                    stat.S_ISCHR(st.st_mode),
                )
            )
    return nodes


def read_nvml() -> tuple[str | None, list[NvmlDevice], str | None]:
    """(driver version, devices, why unavailable) from NVML; never raises."""
    if "pynvml" not in sys.modules:
        if importlib.util.find_spec("pynvml") is None:
            return None, [], "NVML: nvidia-ml-py is not installed"
        # nvmlInit's own first step (as gpuguard.sources.gpu.nvml.load_library): without the
        # library, importing the binding (~5-30 ms of a scan) would end in this same line
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None, [], f"NVML: {NVML_LIBRARY_NOT_FOUND}"
    try:
        import pynvml
    except ImportError:
        return None, [], "NVML: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses built at run time
        return None, [], f"NVML: {exc}"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        version = version.decode() if isinstance(version, bytes) else version
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            device = NvmlDevice(index)
            for attr, getter in (
                ("name", pynvml.nvmlDeviceGetName),
                ("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode),
                ("accounting_mode", pynvml.nvmlDeviceGetAccountingMode),
            ):
                try:
                    value = getter(handle)
                except Exception:  # noqa: BLE001 - NVMLError subclasses are built at run time; an unreadable field is skipped
                    continue
                if isinstance(value, bytes):
                    value = value.decode()
                setattr(device, attr, bool(value) if attr != "name" else value)
            devices.append(device)
        return version, devices, None
    except Exception as exc:  # noqa: BLE001 - any NVML failure is reported as one line
        return None, [], f"NVML: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown after a failure must not mask it
            pass


def collect_gpu_stack(
    root: str = "/", proc_root: str = "/proc", sys_root: str = "/sys", use_nvml: bool = True
) -> GpuStackFacts:
    """Everything above, in one pass."""
    facts = GpuStackFacts()
    facts.driver_versions = read_driver_versions(proc_root, sys_root)
    modules = read_modules(proc_root, sys_root)
    if modules is None:
        facts.unavailable.append(
            "kernel modules: /proc/modules is not readable (modules built in?)"
        )
    else:
        facts.modules = modules
    facts.taint = read_kernel_taint(proc_root)
    if facts.taint is None:
        facts.unavailable.append("kernel taint: /proc/sys/kernel/tainted is not readable")
    else:
        facts.taint_flags = decode_taint(facts.taint)
    facts.device_nodes = read_device_nodes(root)
    if use_nvml:
        version, devices, why = read_nvml()
        if version:
            facts.driver_versions["nvml"] = version
        facts.nvml_devices = devices
        if why:
            facts.unavailable.append(why)
    return facts
