"""The constants shared with the probes, read from ``probes/gpuguard.h``.

The header is the single source of truth.  This module parses its enums (and
nothing else) so that decoding and replay work on machines without a kernel,
BPF or bcc; the structs themselves are only ever read through bcc.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

PROBES_DIR = Path(__file__).resolve().parent.parent.parent / "probes"

_ENUM_BLOCK = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)
_ENUM_ITEM = re.compile(r"^\s*(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*,", re.M)
_DEFINE = re.compile(r"^#define\s+(GG_\w+)\s+(0x[0-9a-fA-F]+|\d+)(?:ULL|U)?\s*$", re.M)


def probe_dir() -> Path:
    # Installed copies ship the probes inside the package (see pyproject);
    # a source checkout keeps them at the top level.
    packaged = Path(__file__).resolve().parent.parent / "probes"
    return packaged if (packaged / "gpuguard.h").exists() else PROBES_DIR


def header_text() -> str:
    return (probe_dir() / "gpuguard.h").read_text()


def _parse(text: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    enums = {}
    for name, body in _ENUM_BLOCK.findall(text):
        enums[name] = {k: int(v, 0) for k, v in _ENUM_ITEM.findall(body)}
    defines = {k: int(v, 0) for k, v in _DEFINE.findall(text)}
    return enums, defines


_ENUMS, DEFINES = _parse(header_text())


def _make_enum(c_name: str, prefix: str, py_name: str) -> type[enum.IntEnum]:
    members = {k[len(prefix) :]: v for k, v in _ENUMS[c_name].items() if k.startswith(prefix)}
    return enum.IntEnum(py_name, members)


EventKind = _make_enum("gg_event_kind", "GG_KIND_", "EventKind")
DeviceClass = _make_enum("gg_device_class", "GG_DEV_", "DeviceClass")
LostSlot = _make_enum("gg_lost_slot", "GG_LOST_", "LostSlot")
TouchReason = _make_enum("gg_touch_reason", "GG_TOUCH_", "TouchReason")  # gpuguard.respond.touch
HugeSource = _make_enum("gg_huge_source", "GG_HUGE_", "HugeSource")
ExecInterest = _make_enum("gg_exec_interest", "GG_INTEREST_", "ExecInterest")  # exec filter
ExecFilterCount = _make_enum("gg_exec_filter_count", "GG_EXECF_", "ExecFilterCount")
MapWrite = _make_enum("gg_map_write", "GG_WRITE_", "MapWrite")  # sources.ebpf.kernel_maps
FpuMode = _make_enum("gg_fpu_mode", "GG_FPU_", "FpuMode")  # SSE rounding modes (MXCSR.RC)

ABI_VERSION = DEFINES["GG_ABI_VERSION"]
NV_XFER_FLAG = DEFINES["GG_NV_XFER_FLAG"]
OPEN_RELATIVE = _ENUMS["gg_open_flag"]["GG_OPEN_RELATIVE"]


def device_class_name(value: int) -> str:
    """``DeviceClass.NVIDIA_UVM`` -> ``"nvidia-uvm"`` (the name used in JSON and rules)."""
    try:
        return DeviceClass(value).name.lower().replace("_", "-")
    except ValueError:
        return f"unknown-{value}"


DEVICE_CLASS_NAMES = tuple(device_class_name(c) for c in DeviceClass if c != DeviceClass.NONE)
