"""The machine the check ran on: kernel, OS, driver and NVML versions, GPUs, MIG, the packages
gpuguard imported against the lock, and whether the eBPF probes can load here (each blocker
in gpuguard's own words)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from gpuguard.errors import GpuguardError
from gpuguard.sources.ebpf import preflight

REPO = Path(__file__).resolve().parent.parent.parent
RUNTIME = ("psutil", "pyyaml", "msgpack", "nvidia-ml-py", "rich", "prometheus-client")
OPTIONAL = ("yara-python", "google-re2", "amdsmi")  # gpuguard runs without them, with less
SMI_QUERY = "name,driver_version,pstate,mig.mode.current,persistence_mode,accounting.mode"


def _try(fn, *args):
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - an NVML call that fails is a fact to record
        return {"error": f"{type(exc).__name__}: {exc}"}
    return value.decode() if isinstance(value, bytes) else value


def _call(nvml: ModuleType, name: str, *args):
    fn = getattr(nvml, name, None)
    return _try(fn, *args) if fn is not None else {"error": "not in this pynvml"}


def host() -> dict:
    pretty = ""
    if Path("/etc/os-release").exists():
        found = re.search(r'^PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text(), re.M)
        pretty = found.group(1) if found else ""
    memory = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "os": pretty,
        "python": sys.version.split()[0],
        "python_path": sys.executable,
        "cpus": os.cpu_count(),
        "memory_gib": round(int(memory.group(1)) / 2**20, 1) if memory else None,
    }


def nvml_facts(nvml: ModuleType) -> dict:
    """What NVML says about the driver and each GPU (every failing call as its error)."""
    init = _try(nvml.nvmlInit)
    if isinstance(init, dict):
        return {"init": init}
    try:
        count = _call(nvml, "nvmlDeviceGetCount")
        out = {
            "driver_version": _call(nvml, "nvmlSystemGetDriverVersion"),
            "nvml_version": _call(nvml, "nvmlSystemGetNVMLVersion"),
            "cuda_driver_version": _call(nvml, "nvmlSystemGetCudaDriverVersion_v2"),
            "gpu_count": count,
            "gpus": [],
        }
        for index in range(count if isinstance(count, int) else 0):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mig = _call(nvml, "nvmlDeviceGetMigMode", handle)
            pci = _call(nvml, "nvmlDeviceGetPciInfo", handle)
            out["gpus"].append(
                {
                    "index": index,
                    "name": _call(nvml, "nvmlDeviceGetName", handle),
                    "uuid": _call(nvml, "nvmlDeviceGetUUID", handle),
                    "pci_bus_id": _try(lambda p: p.busId, pci)
                    if not isinstance(pci, dict)
                    else pci,
                    "memory_total": _try(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total, handle),
                    "mig_mode": {"current": mig[0], "pending": mig[1]}
                    if isinstance(mig, list | tuple)
                    else mig,
                    "persistence_mode": _call(nvml, "nvmlDeviceGetPersistenceMode", handle),
                    "accounting_mode": _call(nvml, "nvmlDeviceGetAccountingMode", handle),
                    "compute_mode": _call(nvml, "nvmlDeviceGetComputeMode", handle),
                    "pcie_link": [
                        _call(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
                        _call(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
                    ],
                }
            )
        return out
    finally:
        _try(nvml.nvmlShutdown)


def nvidia_smi() -> dict:
    path = shutil.which("nvidia-smi")
    if path is None:
        return {"path": None}
    run = subprocess.run(
        [path, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return {"path": path, "query": SMI_QUERY, "output": (run.stdout or run.stderr).strip()[:2000]}


def packages() -> dict:
    """Each dependency: the version the lock pins, and the one this Python imports."""
    locked = dict(
        re.findall(
            r"^([A-Za-z0-9_.-]+)==([^\s\\;]+)", (REPO / "requirements.lock").read_text(), re.M
        )
    )
    out = {}
    for name in (*RUNTIME, *OPTIONAL):
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = None
        out[name] = {"locked": locked.get(name), "found": found}
    return out


def probes() -> dict:
    """Whether the eBPF sensor could load here: every blocker, as gpuguard states it."""
    blockers = []
    for check in (
        preflight.require_bpf_capabilities,
        preflight.import_bcc,
        preflight.require_kernel_headers,
        preflight.require_tracefs,
    ):
        try:
            check()
        except GpuguardError as exc:
            blockers.append(exc.one_line())
    return {"can_load": not blockers, "blockers": blockers}


def tests_package() -> dict:
    """Where ``tests`` imports from: a package of that name installed in site-packages would
    hide the checkout's tests/ (a folder without __init__.py) from the GPU tests."""
    spec = importlib.util.find_spec("tests")
    places = list(dict.fromkeys(spec.submodule_search_locations or [])) if spec else []
    return {"from": places[:3], "ours": str(REPO / "tests") in places and not spec.origin}


def gpu_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"))
