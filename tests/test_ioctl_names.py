"""GPU ioctl command names and categories (events.ioctl_names)."""

from __future__ import annotations

import random

import pytest

from gpuguard.events import ioctl_names
from gpuguard.events.abi import DEVICE_CLASS_NAMES, NV_XFER_FLAG
from gpuguard.events.ioctl_names import (
    CATEGORIES,
    NVKMS_IOCTL_IOWR,
    SUBMISSION_COMMANDS,
    ioc,
    ioctl_category,
    ioctl_name,
)

READ, WRITE = 2, 1


# Full command values as seen by strace/bpftrace on real systems (indicators.md
# and published ioctl tables), not recomputed from this module's tables.
@pytest.mark.parametrize(
    "device_class, command, name",
    [
        ("nvidia-ctl", 0xC020462A, "NV_ESC_RM_CONTROL"),
        ("nvidia-ctl", 0xC030462B, "NV_ESC_RM_ALLOC"),
        ("nvidia", 0xC020462B, "NV_ESC_RM_ALLOC"),
        ("nvidia", 0xC038464E, "NV_ESC_RM_MAP_MEMORY"),
        ("nvidia-ctl", 0xC0104629, "NV_ESC_RM_FREE"),
        ("kfd", 0x80084B01, "AMDKFD_IOC_GET_VERSION"),
        ("kfd", 0xC0584B02, "AMDKFD_IOC_CREATE_QUEUE"),
        ("kfd", 0xC0084B03, "AMDKFD_IOC_DESTROY_QUEUE"),
        ("kfd", 0x40084B15, "AMDKFD_IOC_ACQUIRE_VM"),
        ("kfd", 0xC0284B16, "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU"),
        ("kfd", 0xC0184B18, "AMDKFD_IOC_MAP_MEMORY_TO_GPU"),
        ("drm-render", 0xC0186444, "DRM_IOCTL_AMDGPU_CS"),
        ("drm-render", 0xC0106442, "DRM_IOCTL_AMDGPU_CTX"),
        ("drm-render", 0xC0206440, "DRM_IOCTL_AMDGPU_GEM_CREATE"),
        ("drm-render", 0x40286448, "DRM_IOCTL_AMDGPU_GEM_VA"),
        ("drm-card", 0x40406469, "DRM_IOCTL_I915_GEM_EXECBUFFER2"),
        ("drm-render", 0xC0406469, "DRM_IOCTL_I915_GEM_EXECBUFFER2_WR"),
        ("drm-render", 0xC010646D, "DRM_IOCTL_I915_GEM_CONTEXT_CREATE_EXT"),
        ("drm-render", 0xC018647C, "DRM_IOCTL_I915_GEM_CREATE_EXT"),
        ("drm-render", 0x40386449, "DRM_IOCTL_XE_EXEC"),
        ("drm-render", 0xC0306446, "DRM_IOCTL_XE_EXEC_QUEUE_CREATE"),
        ("drm-card", 0xC00864BF, "DRM_IOCTL_SYNCOBJ_CREATE"),
        ("drm-card", 0xC02864C3, "DRM_IOCTL_SYNCOBJ_WAIT"),
        ("drm-render", 0xC01864CF, "DRM_IOCTL_SYNCOBJ_EVENTFD"),
        ("nvidia-uvm", 0x30000001, "UVM_INITIALIZE"),
        ("nvidia-uvm", 25, "UVM_REGISTER_GPU_VASPACE"),
        ("nvidia-uvm", 27, "UVM_REGISTER_CHANNEL"),
        ("nvidia-uvm", 33, "UVM_MAP_EXTERNAL_ALLOCATION"),
        ("nvidia-uvm", 37, "UVM_REGISTER_GPU"),
        ("nvidia-uvm", 75, "UVM_MM_INITIALIZE"),
        ("nvidia-uvm-tools", 56, "UVM_TOOLS_INIT_EVENT_TRACKER"),
    ],
)
def test_known_commands(device_class, command, name):
    assert ioctl_name(device_class, command) == name


def test_nvidia_dispatches_on_nr_whatever_the_size_and_direction():
    for size in (0, 16, 32, 48, 0x3FFF):
        for direction in (0, WRITE, READ, READ | WRITE):
            assert ioctl_name("nvidia", ioc(direction, ord("F"), 0x2B, size)) == "NV_ESC_RM_ALLOC"
    assert ioctl_name("nvidia-ctl", ioc(READ | WRITE, ord("F"), 200, 0x48)) == "NV_ESC_CARD_INFO"
    assert (
        ioctl_name("nvidia-ctl", ioc(READ | WRITE, ord("F"), 212, 0x4))
        == "NV_ESC_ATTACH_GPUS_TO_FD"
    )


def test_nvidia_unknown_escape_and_foreign_type():
    assert ioctl_name("nvidia", ioc(READ | WRITE, ord("F"), 0x99, 8)) == "NV_ESC(nr=0x99)"
    assert ioctl_name("nvidia", 0x5401) == "IOCTL(0x5401)"  # TCGETS: the driver answers ENOTTY


@pytest.mark.parametrize(
    "inner, name",
    [
        (0x2A, "NV_ESC_RM_CONTROL(xfer)"),
        (0x2B, "NV_ESC_RM_ALLOC(xfer)"),
        (ioc(READ | WRITE, ord("F"), 0x4E, 56), "NV_ESC_RM_MAP_MEMORY(xfer)"),
        (0x99, "NV_ESC(nr=0x99)(xfer)"),
    ],
)
def test_nvidia_xfer_counts_are_named_by_the_inner_escape(inner, name):
    assert ioctl_name("nvidia-ctl", NV_XFER_FLAG | inner) == name


def test_xfer_names_keep_their_category_and_submission_meaning():
    rm_alloc = ioctl_name("nvidia", NV_XFER_FLAG | 0x2B)
    rm_control = ioctl_name("nvidia", NV_XFER_FLAG | 0x2A)
    assert ioctl_category(rm_alloc) == "submit" and rm_alloc in SUBMISSION_COMMANDS
    assert ioctl_category(rm_control) == "query" and rm_control not in SUBMISSION_COMMANDS


def test_nvidia_modeset_takes_nvkms_requests():
    assert NVKMS_IOCTL_IOWR == 0xC0106D00
    assert ioctl_name("nvidia-modeset", 0xC0106D00) == "NVKMS_IOCTL_IOWR"
    assert ioctl_name("nvidia-modeset", 0xC020462A) == "NV_ESC_RM_CONTROL"


def test_uvm_unknown_and_test_commands():
    assert ioctl_name("nvidia-uvm", 8) == "UVM_IOCTL(0x8)"
    assert ioctl_name("nvidia-uvm", 200 + 95) == "UVM_TEST_IOCTL(95)"
    assert ioctl_name("nvidia-uvm", 0x30000003) == "UVM_IOCTL(0x30000003)"


def test_kfd_falls_back_to_nr_when_the_argument_size_changed():
    # A newer/older kfd_ioctl.h may grow an argument struct; the driver indexes by nr.
    assert ioctl_name("kfd", ioc(READ | WRITE, ord("K"), 0x02, 0x60)) == "AMDKFD_IOC_CREATE_QUEUE"
    assert ioctl_name("kfd", ioc(READ | WRITE, ord("K"), 0x99, 8)) == "AMDKFD_IOC(nr=0x99)"
    assert ioctl_name("kfd", 0xC0186444) == "IOCTL(0xc0186444)"


def test_drm_core_ioctls_are_named_by_nr():
    assert ioctl_name("drm-card", ioc(READ | WRITE, ord("d"), 0x00, 64)) == "DRM_IOCTL_VERSION"
    assert ioctl_name("drm-render", ioc(WRITE, ord("d"), 0x09, 8)) == "DRM_IOCTL_GEM_CLOSE"
    assert ioctl_name("drm-render", 0xC00C642D) == "DRM_IOCTL_PRIME_HANDLE_TO_FD"
    assert ioctl_name("drm-render", 0xC00C642E) == "DRM_IOCTL_PRIME_FD_TO_HANDLE"
    assert ioctl_name("drm-render", 0xC010640C) == "DRM_IOCTL_GET_CAP"


def test_unknown_drm_commands_describe_themselves():
    assert (
        ioctl_name("drm-render", ioc(READ | WRITE, ord("d"), 0x44, 20))
        == "DRM_IOWR(nr=0x44,size=20)"
    )
    assert ioctl_name("drm-card", ioc(WRITE, ord("d"), 0x7F, 8)) == "DRM_IOW(nr=0x7f,size=8)"
    assert ioctl_name("drm-card", ioc(0, ord("d"), 0xFE, 0)) == "DRM_IO(nr=0xfe,size=0)"
    assert ioctl_name("drm-card", 0xC020462A) == "IOCTL(0xc020462a)"


@pytest.mark.parametrize("device_class", ["pci-bar", "mem", "nvidia-caps", "no-such-class"])
def test_other_classes_get_the_raw_number(device_class):
    assert ioctl_name(device_class, 0xC0186444) == "IOCTL(0xc0186444)"


def test_odd_command_values_do_not_raise():
    assert ioctl_name("nvidia", -(2**64) + 0xC020462A) == "NV_ESC_RM_CONTROL"  # a signed view
    assert ioctl_name("nvidia", "0x2a") == "IOCTL(?)"  # type: ignore[arg-type]
    assert ioctl_name("kfd", [1]) == "IOCTL(?)"  # type: ignore[arg-type]
    assert ioctl_name(None, 5) == "IOCTL(0x5)"  # type: ignore[arg-type]
    assert ioctl_name("nvidia", 1 << 70) == f"IOCTL(0x{1 << 70:x})"


def test_every_device_class_names_random_commands():
    rng = random.Random(5)
    for device_class in DEVICE_CLASS_NAMES:
        for _ in range(2000):
            command = rng.choice(
                [rng.getrandbits(32), rng.getrandbits(8), NV_XFER_FLAG | rng.getrandbits(32)]
            )
            name = ioctl_name(device_class, command)
            assert isinstance(name, str) and name
            assert ioctl_category(name) in CATEGORIES


def test_known_commands_are_a_single_lookup_after_the_first_call():
    command = ioc(READ | WRITE, ord("F"), 0x2A, 0x20)
    ioctl_name("nvidia-ctl", command)
    assert ioctl_names._cache["nvidia-ctl"][command] == "NV_ESC_RM_CONTROL"
    assert (
        ioctl_names._cache["drm-render"][0xC0186444] == "DRM_IOCTL_AMDGPU_CS"
    )  # there from the start


def test_the_name_cache_is_bounded_against_hostile_command_numbers():
    for command in range(0xC0004600, 0xC0004600 + 3 * ioctl_names._CACHE_LIMIT):
        ioctl_name("nvidia", command)
    assert len(ioctl_names._cache["nvidia"]) <= ioctl_names._cache_limit["nvidia"]
    assert ioctl_name("nvidia", 0xC0FF462B) == "NV_ESC_RM_ALLOC"  # still right past the bound


def test_categories():
    assert ioctl_category("NV_ESC_RM_CONTROL") == "query"
    assert ioctl_category("UVM_REGISTER_CHANNEL") == "submit"
    assert ioctl_category("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU") == "memory"
    assert ioctl_category("NV_ESC_REGISTER_FD") == "setup"
    assert ioctl_category("DRM_IOCTL_SYNCOBJ_WAIT") == "other"
    assert ioctl_category("DRM_IOWR(nr=0x44,size=20)") == "other"
    assert ioctl_category("no such name") == "other"
    assert ioctl_category(None) == "other"  # type: ignore[arg-type]


def test_submission_commands_are_the_work_queue_and_memory_ones():
    required = {
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_MAP_MEMORY",
        "UVM_REGISTER_CHANNEL",
        "AMDKFD_IOC_CREATE_QUEUE",
        "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU",
        "DRM_IOCTL_AMDGPU_CS",
        "DRM_IOCTL_I915_GEM_EXECBUFFER2",
        "DRM_IOCTL_XE_EXEC",
        "DRM_IOCTL_XE_EXEC_QUEUE_CREATE",
    }
    assert required <= SUBMISSION_COMMANDS
    for name in (
        "NV_ESC_RM_CONTROL",
        "NV_ESC_CARD_INFO",
        "AMDKFD_IOC_GET_VERSION",
        "DRM_IOCTL_VERSION",
        "UVM_INITIALIZE",
        "NVKMS_IOCTL_IOWR",
    ):
        assert name not in SUBMISSION_COMMANDS
    assert all(ioctl_category(name) in ("submit", "memory") for name in SUBMISSION_COMMANDS)


def test_names_are_unique_and_driver_values_do_not_collide():
    tables = [
        ioctl_names._NV_ESCAPES,
        ioctl_names._NVKMS,
        ioctl_names._UVM,
        ioctl_names._KFD,
        ioctl_names._DRM_CORE,
        ioctl_names._DRM_DRIVER,
    ]
    names = [entry[0] for table in tables for entry in table.values()]
    assert len(names) == len(set(names))
    assert not [n for n in names if "|" in n]
    assert len(ioctl_names._DRM_DRIVER) == len(ioctl_names._DRM_DRIVER_ENTRIES)


def test_collisions_are_reported_not_hidden():
    value = ioc(WRITE, ord("d"), 0x4B, 32)
    joined = ioctl_names._join_collisions(
        ((value, "A", "submit", True), (value, "B", "query", False))
    )
    assert joined == {value: ("A|B", "other", False)}
