"""Which files are GPU devices (and msr / huge-page files): the user-space twin of the probes' test.

The probes classify an open by its path (they cannot see the device major
without kernel-internal structs); /proc scans, relative-path checks and tests
use this module so both sides agree on the same classes.
"""

from __future__ import annotations

import re
from functools import lru_cache

from gpuguard.events.abi import DeviceClass, device_class_name

# A GPU's own device nodes, the driver interfaces a GPU job opens; the other classes are raw
# memory (PCI BARs, /dev/mem) and the host-tuning files CPU miners write.
GPU_NODE_CLASSES = frozenset(
    {
        DeviceClass.NVIDIA,
        DeviceClass.NVIDIA_CTL,
        DeviceClass.NVIDIA_UVM,
        DeviceClass.NVIDIA_UVM_TOOLS,
        DeviceClass.NVIDIA_MODESET,
        DeviceClass.NVIDIA_CAPS,
        DeviceClass.KFD,
        DeviceClass.DRM_CARD,
        DeviceClass.DRM_RENDER,
    }
)
GPU_NODE_CLASS_NAMES = frozenset(device_class_name(c) for c in GPU_NODE_CLASSES)

# Ordered: the first match wins (nvidiactl before nvidia<N>).
_ABSOLUTE = (
    (re.compile(r"^/dev/nvidiactl$"), DeviceClass.NVIDIA_CTL),
    (re.compile(r"^/dev/nvidia-uvm-tools$"), DeviceClass.NVIDIA_UVM_TOOLS),
    (re.compile(r"^/dev/nvidia-uvm$"), DeviceClass.NVIDIA_UVM),
    (re.compile(r"^/dev/nvidia-modeset$"), DeviceClass.NVIDIA_MODESET),
    (re.compile(r"^/dev/nvidia-caps/"), DeviceClass.NVIDIA_CAPS),
    (re.compile(r"^/dev/nvidia\d+$"), DeviceClass.NVIDIA),
    (re.compile(r"^/dev/kfd$"), DeviceClass.KFD),
    (re.compile(r"^/dev/dri/card\d+$"), DeviceClass.DRM_CARD),
    (re.compile(r"^/dev/dri/renderD\d+$"), DeviceClass.DRM_RENDER),
    (
        re.compile(
            r"^/sys/(bus/pci/devices|devices/pci[0-9a-f:.]+(/[0-9a-f:.]+)*)/[^/]+/resource\d+(_wc)?$"
        ),
        DeviceClass.PCI_BAR,
    ),
    (re.compile(r"^/dev/mem$"), DeviceClass.MEM),
    (re.compile(r"^/dev/cpu/\d{1,5}/msr$"), DeviceClass.MSR),
    (re.compile(r"^/sys/module/msr/parameters/allow_writes$"), DeviceClass.MSR_CONFIG),
    (re.compile(r"^/proc/sys/vm/nr_hugepages$"), DeviceClass.HUGEPAGES_CONFIG),
    (re.compile(r"^/sys/kernel/mm/hugepages/[^/]+/nr_hugepages$"), DeviceClass.HUGEPAGES_CONFIG),
)


@lru_cache(maxsize=4096)  # a pure function of the path; most fds are /dev/null or a tty
def classify_device_path(path: str) -> DeviceClass:
    """Return the GPU device class of an absolute, resolved path (NONE if not a GPU file)."""
    for pattern, device_class in _ABSOLUTE:
        if pattern.match(path):
            return device_class
    return DeviceClass.NONE
