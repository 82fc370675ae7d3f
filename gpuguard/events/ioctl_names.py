"""Names and categories for the ioctl commands processes issue on GPU device files.

The probe counts ioctls per (process, device class, command); this module turns a
command number into the name the driver's header gives it (``NV_ESC_RM_ALLOC``,
``AMDKFD_IOC_CREATE_QUEUE``...) and sorts names into coarse categories.  A known command is
one dict lookup; computed names for unknown (caller-chosen) numbers are cached up to a bound.
Which headers, and why each driver's numbers are keyed as they are: docs/event-decoding.md,
"ioctl names".
"""

from __future__ import annotations

import re

from gpuguard.events.abi import NV_XFER_FLAG

SUBMIT = "submit"  # creates an execution context/queue/channel or submits work
MEMORY = "memory"  # allocates, maps, imports or frees GPU memory
QUERY = "query"  # reads device or driver state
SETUP = "setup"  # opens, registers, attaches or tears down a client/context
OTHER = "other"

CATEGORIES = (SUBMIT, MEMORY, QUERY, SETUP, OTHER)

_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2
_DIR_NAMES = {0: "IO", 1: "IOW", 2: "IOR", 3: "IOWR"}
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF

_NV_MAGIC = ord("F")
_NVKMS_MAGIC = ord("m")
_KFD_MAGIC = ord("K")
_DRM_MAGIC = ord("d")
_DRM_DRIVER_FIRST, _DRM_DRIVER_END = 0x40, 0xA0

XFER_SUFFIX = "(xfer)"
_CACHE_LIMIT = 4096  # computed names kept per device class; more are computed each time


def ioc(direction: int, magic: int, nr: int, size: int) -> int:
    """The Linux ``_IOC(dir, type, nr, size)`` encoding (x86/arm64 layout)."""
    return (direction << 30) | (size << 16) | (magic << 8) | nr


# (name, category, drives_gpu): drives_gpu marks commands that mean "this process
# submits GPU work, creates queues or allocates GPU memory" (SUBMISSION_COMMANDS).
_NV_ESCAPES: dict[int, tuple[str, str, bool]] = {
    0x27: ("NV_ESC_RM_ALLOC_MEMORY", MEMORY, True),
    0x28: ("NV_ESC_RM_ALLOC_OBJECT", SETUP, False),
    0x29: ("NV_ESC_RM_FREE", SETUP, False),
    0x2A: ("NV_ESC_RM_CONTROL", QUERY, False),
    # RM_ALLOC creates every RM object, channels and contexts included; monitors
    # such as nvidia-smi also allocate clients/devices with it, so it is weak alone.
    0x2B: ("NV_ESC_RM_ALLOC", SUBMIT, True),
    0x32: ("NV_ESC_RM_CONFIG_GET", QUERY, False),
    0x33: ("NV_ESC_RM_CONFIG_SET", SETUP, False),
    0x34: ("NV_ESC_RM_DUP_OBJECT", SETUP, False),
    0x35: ("NV_ESC_RM_SHARE", SETUP, False),
    0x37: ("NV_ESC_RM_CONFIG_GET_EX", QUERY, False),
    0x38: ("NV_ESC_RM_CONFIG_SET_EX", SETUP, False),
    0x39: ("NV_ESC_RM_I2C_ACCESS", OTHER, False),
    0x41: ("NV_ESC_RM_IDLE_CHANNELS", OTHER, False),
    0x4A: ("NV_ESC_RM_VID_HEAP_CONTROL", MEMORY, True),
    0x4D: ("NV_ESC_RM_ACCESS_REGISTRY", OTHER, False),
    0x4E: ("NV_ESC_RM_MAP_MEMORY", MEMORY, True),
    0x4F: ("NV_ESC_RM_UNMAP_MEMORY", MEMORY, False),
    0x52: ("NV_ESC_RM_GET_EVENT_DATA", QUERY, False),
    0x54: ("NV_ESC_RM_ALLOC_CONTEXT_DMA2", MEMORY, False),
    0x56: ("NV_ESC_RM_ADD_VBLANK_CALLBACK", OTHER, False),
    0x57: ("NV_ESC_RM_MAP_MEMORY_DMA", MEMORY, True),
    0x58: ("NV_ESC_RM_UNMAP_MEMORY_DMA", MEMORY, False),
    0x59: ("NV_ESC_RM_BIND_CONTEXT_DMA", MEMORY, False),
    0x5C: ("NV_ESC_RM_EXPORT_OBJECT_TO_FD", SETUP, False),
    0x5D: ("NV_ESC_RM_IMPORT_OBJECT_FROM_FD", SETUP, False),
    0x5E: ("NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO", MEMORY, False),
    200: ("NV_ESC_CARD_INFO", QUERY, False),
    201: ("NV_ESC_REGISTER_FD", SETUP, False),
    206: ("NV_ESC_ALLOC_OS_EVENT", SETUP, False),
    207: ("NV_ESC_FREE_OS_EVENT", SETUP, False),
    209: ("NV_ESC_STATUS_CODE", QUERY, False),
    210: ("NV_ESC_CHECK_VERSION_STR", SETUP, False),
    211: ("NV_ESC_IOCTL_XFER_CMD", OTHER, False),
    212: ("NV_ESC_ATTACH_GPUS_TO_FD", SETUP, False),
    213: ("NV_ESC_QUERY_DEVICE_INTR", QUERY, False),
    214: ("NV_ESC_SYS_PARAMS", SETUP, False),
    217: ("NV_ESC_EXPORT_TO_DMABUF_FD", MEMORY, False),
    218: ("NV_ESC_WAIT_OPEN_COMPLETE", SETUP, False),
}

# /dev/nvidia-modeset is served by nvidia-modeset.ko, which takes one command
# carrying the real NVKMS request in user memory.
NVKMS_IOCTL_IOWR = ioc(_IOC_READ | _IOC_WRITE, _NVKMS_MAGIC, 0, 16)
_NVKMS = {NVKMS_IOCTL_IOWR: ("NVKMS_IOCTL_IOWR", OTHER, False)}

_UVM: dict[int, tuple[str, str, bool]] = {
    0x30000001: ("UVM_INITIALIZE", SETUP, False),
    0x30000002: ("UVM_DEINITIALIZE", SETUP, False),
    1: ("UVM_RESERVE_VA", MEMORY, False),
    2: ("UVM_RELEASE_VA", MEMORY, False),
    3: ("UVM_REGION_COMMIT", MEMORY, False),
    4: ("UVM_REGION_DECOMMIT", MEMORY, False),
    5: ("UVM_REGION_SET_STREAM", OTHER, False),
    6: ("UVM_SET_STREAM_RUNNING", OTHER, False),
    7: ("UVM_SET_STREAM_STOPPED", OTHER, False),
    9: ("UVM_RUN_TEST", OTHER, False),
    10: ("UVM_ADD_SESSION", OTHER, False),
    11: ("UVM_REMOVE_SESSION", OTHER, False),
    12: ("UVM_ENABLE_COUNTERS", OTHER, False),
    13: ("UVM_MAP_COUNTER", OTHER, False),
    14: ("UVM_CREATE_EVENT_QUEUE", OTHER, False),
    15: ("UVM_REMOVE_EVENT_QUEUE", OTHER, False),
    16: ("UVM_MAP_EVENT_QUEUE", OTHER, False),
    17: ("UVM_EVENT_CTRL", OTHER, False),
    18: ("UVM_REGISTER_MPS_SERVER", SETUP, False),
    19: ("UVM_REGISTER_MPS_CLIENT", SETUP, False),
    20: ("UVM_GET_GPU_UUID_TABLE", QUERY, False),
    23: ("UVM_CREATE_RANGE_GROUP", MEMORY, False),
    24: ("UVM_DESTROY_RANGE_GROUP", MEMORY, False),
    25: ("UVM_REGISTER_GPU_VASPACE", SUBMIT, True),
    26: ("UVM_UNREGISTER_GPU_VASPACE", SETUP, False),
    27: ("UVM_REGISTER_CHANNEL", SUBMIT, True),
    28: ("UVM_UNREGISTER_CHANNEL", SETUP, False),
    29: ("UVM_ENABLE_PEER_ACCESS", SETUP, False),
    30: ("UVM_DISABLE_PEER_ACCESS", SETUP, False),
    31: ("UVM_SET_RANGE_GROUP", MEMORY, False),
    33: ("UVM_MAP_EXTERNAL_ALLOCATION", MEMORY, True),
    34: ("UVM_FREE", MEMORY, False),
    35: ("UVM_MEM_MAP", MEMORY, False),
    36: ("UVM_DEBUG_ACCESS_MEMORY", OTHER, False),
    37: ("UVM_REGISTER_GPU", SETUP, False),
    38: ("UVM_UNREGISTER_GPU", SETUP, False),
    39: ("UVM_PAGEABLE_MEM_ACCESS", QUERY, False),
    40: ("UVM_PREVENT_MIGRATION_RANGE_GROUPS", MEMORY, False),
    41: ("UVM_ALLOW_MIGRATION_RANGE_GROUPS", MEMORY, False),
    42: ("UVM_SET_PREFERRED_LOCATION", MEMORY, False),
    43: ("UVM_UNSET_PREFERRED_LOCATION", MEMORY, False),
    44: ("UVM_ENABLE_READ_DUPLICATION", MEMORY, False),
    45: ("UVM_DISABLE_READ_DUPLICATION", MEMORY, False),
    46: ("UVM_SET_ACCESSED_BY", MEMORY, False),
    47: ("UVM_UNSET_ACCESSED_BY", MEMORY, False),
    51: ("UVM_MIGRATE", MEMORY, False),
    53: ("UVM_MIGRATE_RANGE_GROUP", MEMORY, False),
    54: ("UVM_ENABLE_SYSTEM_WIDE_ATOMICS", SETUP, False),
    55: ("UVM_DISABLE_SYSTEM_WIDE_ATOMICS", SETUP, False),
    56: ("UVM_TOOLS_INIT_EVENT_TRACKER", OTHER, False),
    57: ("UVM_TOOLS_SET_NOTIFICATION_THRESHOLD", OTHER, False),
    58: ("UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS", OTHER, False),
    59: ("UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS", OTHER, False),
    60: ("UVM_TOOLS_ENABLE_COUNTERS", OTHER, False),
    61: ("UVM_TOOLS_DISABLE_COUNTERS", OTHER, False),
    62: ("UVM_TOOLS_READ_PROCESS_MEMORY", OTHER, False),
    63: ("UVM_TOOLS_WRITE_PROCESS_MEMORY", OTHER, False),
    64: ("UVM_TOOLS_GET_PROCESSOR_UUID_TABLE", QUERY, False),
    65: ("UVM_MAP_DYNAMIC_PARALLELISM_REGION", MEMORY, False),
    66: ("UVM_UNMAP_EXTERNAL", MEMORY, False),
    67: ("UVM_TOOLS_FLUSH_EVENTS", OTHER, False),
    68: ("UVM_ALLOC_SEMAPHORE_POOL", MEMORY, True),
    69: ("UVM_CLEAN_UP_ZOMBIE_RESOURCES", OTHER, False),
    70: ("UVM_PAGEABLE_MEM_ACCESS_ON_GPU", QUERY, False),
    71: ("UVM_POPULATE_PAGEABLE", MEMORY, False),
    72: ("UVM_VALIDATE_VA_RANGE", QUERY, False),
    73: ("UVM_CREATE_EXTERNAL_RANGE", MEMORY, False),
    74: ("UVM_MAP_EXTERNAL_SPARSE", MEMORY, False),
    75: ("UVM_MM_INITIALIZE", SETUP, False),
    76: ("UVM_TOOLS_INIT_EVENT_TRACKER_V2", OTHER, False),
    77: ("UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2", QUERY, False),
    78: ("UVM_ALLOC_DEVICE_P2P", MEMORY, False),
    2047: ("UVM_IS_8_SUPPORTED", QUERY, False),
}
_UVM_TEST_BASE = 200  # UVM_TEST_IOCTL_BASE(i) is 200 + i; test ioctls need a debug driver
_UVM_TEST_END = 2047

_KFD: dict[int, tuple[str, str, bool]] = {
    0x01: ("AMDKFD_IOC_GET_VERSION", QUERY, False),
    0x02: ("AMDKFD_IOC_CREATE_QUEUE", SUBMIT, True),
    0x03: ("AMDKFD_IOC_DESTROY_QUEUE", SETUP, False),
    0x04: ("AMDKFD_IOC_SET_MEMORY_POLICY", MEMORY, False),
    0x05: ("AMDKFD_IOC_GET_CLOCK_COUNTERS", QUERY, False),
    0x06: ("AMDKFD_IOC_GET_PROCESS_APERTURES", QUERY, False),
    0x07: ("AMDKFD_IOC_UPDATE_QUEUE", SUBMIT, False),
    0x08: ("AMDKFD_IOC_CREATE_EVENT", OTHER, False),
    0x09: ("AMDKFD_IOC_DESTROY_EVENT", OTHER, False),
    0x0A: ("AMDKFD_IOC_SET_EVENT", OTHER, False),
    0x0B: ("AMDKFD_IOC_RESET_EVENT", OTHER, False),
    0x0C: ("AMDKFD_IOC_WAIT_EVENTS", OTHER, False),
    0x0D: ("AMDKFD_IOC_DBG_REGISTER_DEPRECATED", OTHER, False),
    0x0E: ("AMDKFD_IOC_DBG_UNREGISTER_DEPRECATED", OTHER, False),
    0x0F: ("AMDKFD_IOC_DBG_ADDRESS_WATCH_DEPRECATED", OTHER, False),
    0x10: ("AMDKFD_IOC_DBG_WAVE_CONTROL_DEPRECATED", OTHER, False),
    0x11: ("AMDKFD_IOC_SET_SCRATCH_BACKING_VA", MEMORY, False),
    0x12: ("AMDKFD_IOC_GET_TILE_CONFIG", QUERY, False),
    0x13: ("AMDKFD_IOC_SET_TRAP_HANDLER", SETUP, False),
    0x14: ("AMDKFD_IOC_GET_PROCESS_APERTURES_NEW", QUERY, False),
    0x15: ("AMDKFD_IOC_ACQUIRE_VM", SETUP, False),
    0x16: ("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU", MEMORY, True),
    0x17: ("AMDKFD_IOC_FREE_MEMORY_OF_GPU", MEMORY, False),
    0x18: ("AMDKFD_IOC_MAP_MEMORY_TO_GPU", MEMORY, True),
    0x19: ("AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU", MEMORY, False),
    0x1A: ("AMDKFD_IOC_SET_CU_MASK", SETUP, False),
    0x1B: ("AMDKFD_IOC_GET_QUEUE_WAVE_STATE", QUERY, False),
    0x1C: ("AMDKFD_IOC_GET_DMABUF_INFO", QUERY, False),
    0x1D: ("AMDKFD_IOC_IMPORT_DMABUF", MEMORY, False),
    0x1E: ("AMDKFD_IOC_ALLOC_QUEUE_GWS", SETUP, False),
    0x1F: ("AMDKFD_IOC_SMI_EVENTS", QUERY, False),
    0x20: ("AMDKFD_IOC_SVM", MEMORY, False),
    0x21: ("AMDKFD_IOC_SET_XNACK_MODE", SETUP, False),
    0x22: ("AMDKFD_IOC_CRIU_OP", OTHER, False),
    0x23: ("AMDKFD_IOC_AVAILABLE_MEMORY", QUERY, False),
    0x24: ("AMDKFD_IOC_EXPORT_DMABUF", MEMORY, False),
    0x25: ("AMDKFD_IOC_RUNTIME_ENABLE", SETUP, False),
    0x26: ("AMDKFD_IOC_DBG_TRAP", OTHER, False),
    0x27: ("AMDKFD_IOC_CREATE_PROCESS", SETUP, False),
}

_DRM_CORE: dict[int, tuple[str, str, bool]] = {
    0x00: ("DRM_IOCTL_VERSION", QUERY, False),
    0x01: ("DRM_IOCTL_GET_UNIQUE", QUERY, False),
    0x02: ("DRM_IOCTL_GET_MAGIC", SETUP, False),
    0x03: ("DRM_IOCTL_IRQ_BUSID", QUERY, False),
    0x04: ("DRM_IOCTL_GET_MAP", QUERY, False),
    0x05: ("DRM_IOCTL_GET_CLIENT", QUERY, False),
    0x06: ("DRM_IOCTL_GET_STATS", QUERY, False),
    0x07: ("DRM_IOCTL_SET_VERSION", SETUP, False),
    0x08: ("DRM_IOCTL_MODESET_CTL", OTHER, False),
    0x09: ("DRM_IOCTL_GEM_CLOSE", MEMORY, False),
    0x0A: ("DRM_IOCTL_GEM_FLINK", MEMORY, False),
    0x0B: ("DRM_IOCTL_GEM_OPEN", MEMORY, False),
    0x0C: ("DRM_IOCTL_GET_CAP", QUERY, False),
    0x0D: ("DRM_IOCTL_SET_CLIENT_CAP", SETUP, False),
    0x10: ("DRM_IOCTL_SET_UNIQUE", SETUP, False),
    0x11: ("DRM_IOCTL_AUTH_MAGIC", SETUP, False),
    0x12: ("DRM_IOCTL_BLOCK", OTHER, False),
    0x13: ("DRM_IOCTL_UNBLOCK", OTHER, False),
    0x14: ("DRM_IOCTL_CONTROL", OTHER, False),
    0x15: ("DRM_IOCTL_ADD_MAP", OTHER, False),
    0x16: ("DRM_IOCTL_ADD_BUFS", OTHER, False),
    0x17: ("DRM_IOCTL_MARK_BUFS", OTHER, False),
    0x18: ("DRM_IOCTL_INFO_BUFS", OTHER, False),
    0x19: ("DRM_IOCTL_MAP_BUFS", OTHER, False),
    0x1A: ("DRM_IOCTL_FREE_BUFS", OTHER, False),
    0x1B: ("DRM_IOCTL_RM_MAP", OTHER, False),
    0x1C: ("DRM_IOCTL_SET_SAREA_CTX", OTHER, False),
    0x1D: ("DRM_IOCTL_GET_SAREA_CTX", OTHER, False),
    0x1E: ("DRM_IOCTL_SET_MASTER", SETUP, False),
    0x1F: ("DRM_IOCTL_DROP_MASTER", SETUP, False),
    0x20: ("DRM_IOCTL_ADD_CTX", OTHER, False),
    0x21: ("DRM_IOCTL_RM_CTX", OTHER, False),
    0x22: ("DRM_IOCTL_MOD_CTX", OTHER, False),
    0x23: ("DRM_IOCTL_GET_CTX", OTHER, False),
    0x24: ("DRM_IOCTL_SWITCH_CTX", OTHER, False),
    0x25: ("DRM_IOCTL_NEW_CTX", OTHER, False),
    0x26: ("DRM_IOCTL_RES_CTX", OTHER, False),
    0x27: ("DRM_IOCTL_ADD_DRAW", OTHER, False),
    0x28: ("DRM_IOCTL_RM_DRAW", OTHER, False),
    0x29: ("DRM_IOCTL_DMA", OTHER, False),
    0x2A: ("DRM_IOCTL_LOCK", OTHER, False),
    0x2B: ("DRM_IOCTL_UNLOCK", OTHER, False),
    0x2C: ("DRM_IOCTL_FINISH", OTHER, False),
    0x2D: ("DRM_IOCTL_PRIME_HANDLE_TO_FD", MEMORY, False),
    0x2E: ("DRM_IOCTL_PRIME_FD_TO_HANDLE", MEMORY, False),
    0x30: ("DRM_IOCTL_AGP_ACQUIRE", OTHER, False),
    0x31: ("DRM_IOCTL_AGP_RELEASE", OTHER, False),
    0x32: ("DRM_IOCTL_AGP_ENABLE", OTHER, False),
    0x33: ("DRM_IOCTL_AGP_INFO", OTHER, False),
    0x34: ("DRM_IOCTL_AGP_ALLOC", OTHER, False),
    0x35: ("DRM_IOCTL_AGP_FREE", OTHER, False),
    0x36: ("DRM_IOCTL_AGP_BIND", OTHER, False),
    0x37: ("DRM_IOCTL_AGP_UNBIND", OTHER, False),
    0x38: ("DRM_IOCTL_SG_ALLOC", OTHER, False),
    0x39: ("DRM_IOCTL_SG_FREE", OTHER, False),
    0x3A: ("DRM_IOCTL_WAIT_VBLANK", OTHER, False),
    0x3B: ("DRM_IOCTL_CRTC_GET_SEQUENCE", OTHER, False),
    0x3C: ("DRM_IOCTL_CRTC_QUEUE_SEQUENCE", OTHER, False),
    0x3F: ("DRM_IOCTL_UPDATE_DRAW", OTHER, False),
    0xA0: ("DRM_IOCTL_MODE_GETRESOURCES", QUERY, False),
    0xA1: ("DRM_IOCTL_MODE_GETCRTC", QUERY, False),
    0xA2: ("DRM_IOCTL_MODE_SETCRTC", OTHER, False),
    0xA3: ("DRM_IOCTL_MODE_CURSOR", OTHER, False),
    0xA4: ("DRM_IOCTL_MODE_GETGAMMA", QUERY, False),
    0xA5: ("DRM_IOCTL_MODE_SETGAMMA", OTHER, False),
    0xA6: ("DRM_IOCTL_MODE_GETENCODER", QUERY, False),
    0xA7: ("DRM_IOCTL_MODE_GETCONNECTOR", QUERY, False),
    0xA8: ("DRM_IOCTL_MODE_ATTACHMODE", OTHER, False),
    0xA9: ("DRM_IOCTL_MODE_DETACHMODE", OTHER, False),
    0xAA: ("DRM_IOCTL_MODE_GETPROPERTY", QUERY, False),
    0xAB: ("DRM_IOCTL_MODE_SETPROPERTY", OTHER, False),
    0xAC: ("DRM_IOCTL_MODE_GETPROPBLOB", QUERY, False),
    0xAD: ("DRM_IOCTL_MODE_GETFB", QUERY, False),
    0xAE: ("DRM_IOCTL_MODE_ADDFB", OTHER, False),
    0xAF: ("DRM_IOCTL_MODE_RMFB", OTHER, False),
    0xB0: ("DRM_IOCTL_MODE_PAGE_FLIP", OTHER, False),
    0xB1: ("DRM_IOCTL_MODE_DIRTYFB", OTHER, False),
    0xB2: ("DRM_IOCTL_MODE_CREATE_DUMB", MEMORY, False),
    0xB3: ("DRM_IOCTL_MODE_MAP_DUMB", MEMORY, False),
    0xB4: ("DRM_IOCTL_MODE_DESTROY_DUMB", MEMORY, False),
    0xB5: ("DRM_IOCTL_MODE_GETPLANERESOURCES", QUERY, False),
    0xB6: ("DRM_IOCTL_MODE_GETPLANE", QUERY, False),
    0xB7: ("DRM_IOCTL_MODE_SETPLANE", OTHER, False),
    0xB8: ("DRM_IOCTL_MODE_ADDFB2", OTHER, False),
    0xB9: ("DRM_IOCTL_MODE_OBJ_GETPROPERTIES", QUERY, False),
    0xBA: ("DRM_IOCTL_MODE_OBJ_SETPROPERTY", OTHER, False),
    0xBB: ("DRM_IOCTL_MODE_CURSOR2", OTHER, False),
    0xBC: ("DRM_IOCTL_MODE_ATOMIC", OTHER, False),
    0xBD: ("DRM_IOCTL_MODE_CREATEPROPBLOB", OTHER, False),
    0xBE: ("DRM_IOCTL_MODE_DESTROYPROPBLOB", OTHER, False),
    0xBF: ("DRM_IOCTL_SYNCOBJ_CREATE", OTHER, False),
    0xC0: ("DRM_IOCTL_SYNCOBJ_DESTROY", OTHER, False),
    0xC1: ("DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD", OTHER, False),
    0xC2: ("DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE", OTHER, False),
    0xC3: ("DRM_IOCTL_SYNCOBJ_WAIT", OTHER, False),
    0xC4: ("DRM_IOCTL_SYNCOBJ_RESET", OTHER, False),
    0xC5: ("DRM_IOCTL_SYNCOBJ_SIGNAL", OTHER, False),
    0xC6: ("DRM_IOCTL_MODE_CREATE_LEASE", OTHER, False),
    0xC7: ("DRM_IOCTL_MODE_LIST_LESSEES", QUERY, False),
    0xC8: ("DRM_IOCTL_MODE_GET_LEASE", QUERY, False),
    0xC9: ("DRM_IOCTL_MODE_REVOKE_LEASE", OTHER, False),
    0xCA: ("DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT", OTHER, False),
    0xCB: ("DRM_IOCTL_SYNCOBJ_QUERY", OTHER, False),
    0xCC: ("DRM_IOCTL_SYNCOBJ_TRANSFER", OTHER, False),
    0xCD: ("DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL", OTHER, False),
    0xCE: ("DRM_IOCTL_MODE_GETFB2", QUERY, False),
    0xCF: ("DRM_IOCTL_SYNCOBJ_EVENTFD", OTHER, False),
    0xD0: ("DRM_IOCTL_MODE_CLOSEFB", OTHER, False),
}

_RW, _W = _IOC_READ | _IOC_WRITE, _IOC_WRITE


def _drm(direction: int, nr: int, size: int) -> int:
    return ioc(direction, _DRM_MAGIC, nr, size)


# Driver ioctls by full value: (direction, nr, argument size on x86-64/arm64).
_DRM_DRIVER_ENTRIES: tuple[tuple[int, str, str, bool], ...] = (
    # amdgpu_drm.h
    (_drm(_RW, 0x40, 32), "DRM_IOCTL_AMDGPU_GEM_CREATE", MEMORY, True),
    (_drm(_RW, 0x41, 8), "DRM_IOCTL_AMDGPU_GEM_MMAP", MEMORY, False),
    (_drm(_RW, 0x42, 16), "DRM_IOCTL_AMDGPU_CTX", SUBMIT, True),
    (_drm(_RW, 0x43, 24), "DRM_IOCTL_AMDGPU_BO_LIST", SUBMIT, False),
    (_drm(_RW, 0x44, 24), "DRM_IOCTL_AMDGPU_CS", SUBMIT, True),
    (_drm(_W, 0x45, 32), "DRM_IOCTL_AMDGPU_INFO", QUERY, False),
    (_drm(_RW, 0x46, 288), "DRM_IOCTL_AMDGPU_GEM_METADATA", MEMORY, False),
    (_drm(_RW, 0x47, 16), "DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE", OTHER, False),
    (_drm(_W, 0x48, 40), "DRM_IOCTL_AMDGPU_GEM_VA", MEMORY, True),
    (_drm(_RW, 0x49, 32), "DRM_IOCTL_AMDGPU_WAIT_CS", OTHER, False),
    (_drm(_RW, 0x50, 16), "DRM_IOCTL_AMDGPU_GEM_OP", MEMORY, False),
    (_drm(_RW, 0x51, 24), "DRM_IOCTL_AMDGPU_GEM_USERPTR", MEMORY, True),
    (_drm(_RW, 0x52, 24), "DRM_IOCTL_AMDGPU_WAIT_FENCES", OTHER, False),
    (_drm(_RW, 0x53, 8), "DRM_IOCTL_AMDGPU_VM", SETUP, False),
    (_drm(_RW, 0x54, 32), "DRM_IOCTL_AMDGPU_FENCE_TO_HANDLE", OTHER, False),
    (_drm(_W, 0x55, 16), "DRM_IOCTL_AMDGPU_SCHED", SETUP, False),
    # i915_drm.h (GEM-era commands; the DRI1 ones are rejected by current kernels)
    (_drm(_RW, 0x46, 16), "DRM_IOCTL_I915_GETPARAM", QUERY, False),
    (_drm(_W, 0x47, 8), "DRM_IOCTL_I915_SETPARAM", SETUP, False),
    (_drm(_W, 0x54, 40), "DRM_IOCTL_I915_GEM_EXECBUFFER", SUBMIT, True),
    (_drm(_RW, 0x57, 8), "DRM_IOCTL_I915_GEM_BUSY", QUERY, False),
    (_drm(_RW, 0x5B, 16), "DRM_IOCTL_I915_GEM_CREATE", MEMORY, True),
    (_drm(_W, 0x5C, 32), "DRM_IOCTL_I915_GEM_PREAD", MEMORY, False),
    (_drm(_W, 0x5D, 32), "DRM_IOCTL_I915_GEM_PWRITE", MEMORY, False),
    (_drm(_RW, 0x5E, 40), "DRM_IOCTL_I915_GEM_MMAP", MEMORY, False),
    (_drm(_W, 0x5F, 12), "DRM_IOCTL_I915_GEM_SET_DOMAIN", MEMORY, False),
    (_drm(_W, 0x60, 4), "DRM_IOCTL_I915_GEM_SW_FINISH", MEMORY, False),
    (_drm(_RW, 0x61, 16), "DRM_IOCTL_I915_GEM_SET_TILING", MEMORY, False),
    (_drm(_RW, 0x62, 16), "DRM_IOCTL_I915_GEM_GET_TILING", MEMORY, False),
    (_drm(_IOC_READ, 0x63, 16), "DRM_IOCTL_I915_GEM_GET_APERTURE", QUERY, False),
    (_drm(_RW, 0x64, 16), "DRM_IOCTL_I915_GEM_MMAP_GTT", MEMORY, False),
    (_drm(_RW, 0x64, 32), "DRM_IOCTL_I915_GEM_MMAP_OFFSET", MEMORY, False),
    (_drm(_RW, 0x66, 12), "DRM_IOCTL_I915_GEM_MADVISE", MEMORY, False),
    (_drm(_W, 0x69, 64), "DRM_IOCTL_I915_GEM_EXECBUFFER2", SUBMIT, True),
    (_drm(_RW, 0x69, 64), "DRM_IOCTL_I915_GEM_EXECBUFFER2_WR", SUBMIT, True),
    (_drm(_RW, 0x6C, 16), "DRM_IOCTL_I915_GEM_WAIT", OTHER, False),
    (_drm(_RW, 0x6D, 8), "DRM_IOCTL_I915_GEM_CONTEXT_CREATE", SUBMIT, True),
    (_drm(_RW, 0x6D, 16), "DRM_IOCTL_I915_GEM_CONTEXT_CREATE_EXT", SUBMIT, True),
    (_drm(_W, 0x6E, 8), "DRM_IOCTL_I915_GEM_CONTEXT_DESTROY", SETUP, False),
    (_drm(_W, 0x6F, 8), "DRM_IOCTL_I915_GEM_SET_CACHING", MEMORY, False),
    (_drm(_RW, 0x70, 8), "DRM_IOCTL_I915_GEM_GET_CACHING", MEMORY, False),
    (_drm(_RW, 0x71, 16), "DRM_IOCTL_I915_REG_READ", QUERY, False),
    (_drm(_RW, 0x72, 24), "DRM_IOCTL_I915_GET_RESET_STATS", QUERY, False),
    (_drm(_RW, 0x73, 24), "DRM_IOCTL_I915_GEM_USERPTR", MEMORY, True),
    (_drm(_RW, 0x74, 24), "DRM_IOCTL_I915_GEM_CONTEXT_GETPARAM", QUERY, False),
    (_drm(_RW, 0x75, 24), "DRM_IOCTL_I915_GEM_CONTEXT_SETPARAM", SETUP, False),
    (_drm(_W, 0x76, 16), "DRM_IOCTL_I915_PERF_OPEN", OTHER, False),
    (_drm(_W, 0x77, 72), "DRM_IOCTL_I915_PERF_ADD_CONFIG", OTHER, False),
    (_drm(_W, 0x78, 8), "DRM_IOCTL_I915_PERF_REMOVE_CONFIG", OTHER, False),
    (_drm(_RW, 0x79, 16), "DRM_IOCTL_I915_QUERY", QUERY, False),
    (_drm(_RW, 0x7A, 16), "DRM_IOCTL_I915_GEM_VM_CREATE", SETUP, False),
    (_drm(_W, 0x7B, 16), "DRM_IOCTL_I915_GEM_VM_DESTROY", SETUP, False),
    (_drm(_RW, 0x7C, 24), "DRM_IOCTL_I915_GEM_CREATE_EXT", MEMORY, True),
    # xe_drm.h (as merged in Linux 6.8; nr = 0x40 + DRM_XE_*)
    (_drm(_RW, 0x40, 40), "DRM_IOCTL_XE_DEVICE_QUERY", QUERY, False),
    (_drm(_RW, 0x41, 56), "DRM_IOCTL_XE_GEM_CREATE", MEMORY, True),
    (_drm(_RW, 0x42, 40), "DRM_IOCTL_XE_GEM_MMAP_OFFSET", MEMORY, False),
    (_drm(_RW, 0x43, 32), "DRM_IOCTL_XE_VM_CREATE", SETUP, False),
    (_drm(_W, 0x44, 24), "DRM_IOCTL_XE_VM_DESTROY", SETUP, False),
    (_drm(_W, 0x45, 136), "DRM_IOCTL_XE_VM_BIND", MEMORY, True),
    (_drm(_RW, 0x46, 48), "DRM_IOCTL_XE_EXEC_QUEUE_CREATE", SUBMIT, True),
    (_drm(_W, 0x47, 24), "DRM_IOCTL_XE_EXEC_QUEUE_DESTROY", SETUP, False),
    (_drm(_RW, 0x48, 40), "DRM_IOCTL_XE_EXEC_QUEUE_GET_PROPERTY", QUERY, False),
    (_drm(_W, 0x49, 56), "DRM_IOCTL_XE_EXEC", SUBMIT, True),
    (_drm(_RW, 0x4A, 72), "DRM_IOCTL_XE_WAIT_USER_FENCE", OTHER, False),
    (_drm(_W, 0x4B, 32), "DRM_IOCTL_XE_OBSERVATION", OTHER, False),
)


def _join_collisions(
    entries: tuple[tuple[int, str, str, bool], ...],
) -> dict[int, tuple[str, str, bool]]:
    # Two drivers may give one full value different meanings; say so instead of
    # silently picking one.
    table: dict[int, tuple[str, str, bool]] = {}
    for value, name, category, drives in entries:
        if value in table:
            old_name, old_category, old_drives = table[value]
            name = f"{old_name}|{name}"
            category = category if category == old_category else OTHER
            drives = drives and old_drives
        table[value] = (name, category, drives)
    return table


_DRM_DRIVER = _join_collisions(_DRM_DRIVER_ENTRIES)


def _names(table: dict[int, tuple[str, str, bool]]) -> dict[int, str]:
    return {value: entry[0] for value, entry in table.items()}


def _build_categories() -> tuple[dict[str, str], frozenset[str]]:
    categories: dict[str, str] = {}
    submission: set[str] = set()
    for table in (_NV_ESCAPES, _NVKMS, _UVM, _KFD, _DRM_CORE, _DRM_DRIVER):
        for name, category, drives in table.values():
            categories[name] = category
            if drives:
                submission.add(name)
    for name, _, drives in _NV_ESCAPES.values():
        if drives:
            submission.add(name + XFER_SUFFIX)
    return categories, frozenset(submission)


_CATEGORY_BY_NAME, SUBMISSION_COMMANDS = _build_categories()
"""Names meaning "this process submits GPU work, creates queues or allocates GPU
memory" (with their ``(xfer)`` forms).  Training jobs and miners both issue
them: they say a process drives a GPU, not what for."""


def _generic(command: int) -> str:
    return f"IOCTL(0x{command:x})"


def _nvidia(command: int) -> str:
    if command & NV_XFER_FLAG and command <= _U64:
        # The wrapper passes a bare escape number; the driver switches on it as an nr.
        inner = command & _U32
        if inner <= 0xFF or (inner >> 8) & 0xFF == _NV_MAGIC:
            entry = _NV_ESCAPES.get(inner & 0xFF)
            base = entry[0] if entry else f"NV_ESC(nr=0x{inner & 0xFF:02x})"
            return base + XFER_SUFFIX
        return f"NV_ESC(xfer,cmd=0x{inner:x})"
    if command > _U32 or (command >> 8) & 0xFF != _NV_MAGIC:
        return _generic(command)  # the driver answers ENOTTY to any other type
    nr = command & 0xFF
    entry = _NV_ESCAPES.get(nr)
    return entry[0] if entry else f"NV_ESC(nr=0x{nr:02x})"


def _nvidia_modeset(command: int) -> str:
    if command == NVKMS_IOCTL_IOWR:
        return _NVKMS[command][0]
    return _nvidia(command)


def _uvm(command: int) -> str:
    if _UVM_TEST_BASE <= command < _UVM_TEST_END:
        return f"UVM_TEST_IOCTL({command - _UVM_TEST_BASE})"
    return f"UVM_IOCTL(0x{command:x})"


def _kfd(command: int) -> str:
    if command > _U32 or (command >> 8) & 0xFF != _KFD_MAGIC:
        return _generic(command)
    nr = command & 0xFF
    entry = _KFD.get(nr)
    return entry[0] if entry else f"AMDKFD_IOC(nr=0x{nr:02x})"


def _drm_generic(command: int) -> str:
    direction = (command >> 30) & 0x3
    size = (command >> 16) & 0x3FFF
    return f"DRM_{_DIR_NAMES[direction]}(nr=0x{command & 0xFF:02x},size={size})"


def _drm_any(command: int) -> str:
    if command > _U32 or (command >> 8) & 0xFF != _DRM_MAGIC:
        return _generic(command)
    nr = command & 0xFF
    if not _DRM_DRIVER_FIRST <= nr < _DRM_DRIVER_END:
        entry = _DRM_CORE.get(nr)
        if entry:
            return entry[0]
    return _drm_generic(command)


_SLOW_PATH = {
    "nvidia": _nvidia,
    "nvidia-ctl": _nvidia,
    "nvidia-modeset": _nvidia_modeset,
    "nvidia-uvm": _uvm,
    "nvidia-uvm-tools": _uvm,
    "kfd": _kfd,
    "drm-card": _drm_any,
    "drm-render": _drm_any,
}

_PREFILLED = {
    "nvidia-uvm": _names(_UVM),
    "nvidia-uvm-tools": _names(_UVM),
    "drm-card": _names(_DRM_DRIVER),
    "drm-render": _names(_DRM_DRIVER),
    "nvidia-modeset": _names(_NVKMS),
}

# device class -> {command -> name}; known commands are there from the start and
# computed names are added until the class holds _CACHE_LIMIT more.
_cache: dict[str, dict[int, str]] = {cls: dict(names) for cls, names in _PREFILLED.items()}
_cache_limit: dict[str, int] = {cls: len(names) + _CACHE_LIMIT for cls, names in _cache.items()}
for _cls in _SLOW_PATH:
    _cache.setdefault(_cls, {})
    _cache_limit.setdefault(_cls, _CACHE_LIMIT)


def ioctl_name(device_class: str, command: int) -> str:
    """The driver's name for ``command`` issued on a file of ``device_class``."""
    try:
        return _cache[device_class][command]
    except (KeyError, TypeError):
        return _compute_name(device_class, command)


def _compute_name(device_class: str, command: object) -> str:
    if type(command) is not int and not isinstance(command, int):
        return "IOCTL(?)"
    command = int(command)
    if command < 0:
        command &= _U64  # a signed view of the same 64-bit value
    compute = _SLOW_PATH.get(device_class) if isinstance(device_class, str) else None
    name = compute(command) if compute else _generic(command)
    cache = _cache.get(device_class) if compute else None
    if cache is not None and len(cache) < _cache_limit[device_class]:
        cache[command] = name
    return name


_GENERIC_NAME = re.compile(
    r"^[A-Z][A-Z0-9_]*\([A-Za-z0-9=,]{1,40}\)$"
)  # NV_ESC(nr=0x2a), IOCTL(0x1234)...


def is_ioctl_name(name: str) -> bool:
    """Whether ``name`` is a name :func:`ioctl_name` can give: a known command (or its
    ``(xfer)`` form) or a generic ``PREFIX(...)`` name for an unknown number."""
    base = name[: -len(XFER_SUFFIX)] if name.endswith(XFER_SUFFIX) else name
    return base in _CATEGORY_BY_NAME or _GENERIC_NAME.match(name) is not None


def ioctl_category(name: str) -> str:
    """``"submit"``, ``"memory"``, ``"query"``, ``"setup"`` or ``"other"`` for a name."""
    category = _CATEGORY_BY_NAME.get(name)
    if category is not None:
        return category
    if isinstance(name, str) and name.endswith(XFER_SUFFIX):
        return _CATEGORY_BY_NAME.get(name[: -len(XFER_SUFFIX)], OTHER)
    return OTHER
