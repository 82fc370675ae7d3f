"""NVML's library boundary: loading pynvml, why nvmlInit failed, which error codes mean a lost GPU.

The tables here name pynvml's constants and functions; tests/test_gpu_library_contract.py
checks each against the installed binding and the fake.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from types import ModuleType

from gpuguard.sources.gpu.sampler import SourceUnavailable

SOURCE = "nvml"  # what NVML's snapshots say they come from

# NVML error code name -> (cause, fix) when nvmlInit fails.
INIT_FAILURES = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "library not found",
        "install the NVIDIA driver (it ships libnvidia-ml.so.1)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "driver not loaded",
        "load the NVIDIA kernel module: modprobe nvidia",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "no permission to open the NVIDIA devices",
        "run as root or fix /dev/nvidia* permissions",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NVML library and kernel driver versions differ",
        "reboot or reload the nvidia module after a driver upgrade",
    ),
}
# Codes that mean the device (or the driver under it) is gone, not one field.
LOST_CODES = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND", "NVML_ERROR_RESET_REQUIRED")
# Codes that mean NVML itself must be initialised again.
REINIT_CODES = ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED")
# Versions newest first; a missing function or FUNCTION_NOT_FOUND moves to the next.
PROCESS_LISTS = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
}


def load_library() -> ModuleType:
    if "pynvml" not in sys.modules:
        if importlib.util.find_spec("pynvml") is None:
            raise SourceUnavailable("pynvml is not installed", "pip install nvidia-ml-py")
        # nvmlInit's own first step on Linux (pynvml's _LoadNvmlLibrary): without the library,
        # importing the binding (~30 ms, a scan's whole budget on a host without GPUs) would
        # only end in the same NVML_ERROR_LIBRARY_NOT_FOUND
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            raise SourceUnavailable(*INIT_FAILURES["NVML_ERROR_LIBRARY_NOT_FOUND"]) from None
    try:
        import pynvml
    except ImportError:
        raise SourceUnavailable("pynvml is not installed", "pip install nvidia-ml-py") from None
    return pynvml


def init_failure(nvml: ModuleType, exc: Exception) -> tuple[str, str]:
    code = getattr(exc, "value", None)
    for name, cause_fix in INIT_FAILURES.items():
        if code is not None and code == getattr(nvml, name, object()):
            return cause_fix
    return f"nvmlInit failed: {exc}", "check the NVIDIA driver installation (nvidia-smi)"


def shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass


class DeviceLost(Exception):
    """The device (or the driver under it) is gone; ``reinit``: NVML must be initialised again."""

    def __init__(self, reason: str, reinit: bool) -> None:
        super().__init__(reason)
        self.reinit = reinit
