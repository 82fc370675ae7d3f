"""The CUDA driver API through ctypes (``libcuda.so.1``): what the device check's workloads call.

No framework and no compiler: the kernels are PTX text (``KERNELS``) the driver compiles at
``cuModuleLoadData``.  ``GG_LIBCUDA`` names another library with the same entry points: the
dry run's stand-in (fake_libcuda.c), on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import time

LIBRARY_ENV = "GG_LIBCUDA"
_ATTR_CC_MAJOR, _ATTR_CC_MINOR, _ATTR_SMS = 75, 76, 16  # CU_DEVICE_ATTRIBUTE_*
_JIT_ERROR_LOG, _JIT_ERROR_LOG_SIZE = 5, 6  # CU_JIT_ERROR_LOG_BUFFER(_SIZE_BYTES)

# hash_rounds: each thread mixes one nonce through ``rounds`` add/rotate/xor rounds (integer
# work only, like SHA-256d/Blake3-style miners), and the few results under ``target`` race for
# the minimum in out[0] (nonce in out[1]).  axpy: y += a * x over n floats, a grid-stride loop
# (memory-bound, like an optimiser step).  PTX ISA 7.0 for sm_70 and later; checked with ptxas
# 13.0 for sm_75 and sm_90.
KERNELS = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry hash_rounds(
    .param .u64 out,
    .param .u32 nonce_base,
    .param .u32 rounds,
    .param .u32 header_word,
    .param .u32 target
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.u32 %r1, [nonce_base];
    ld.param.u32 %r2, [rounds];
    ld.param.u32 %r3, [header_word];
    ld.param.u32 %r17, [target];
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.u32 %r7, %r4, %r5, %r6;
    add.u32 %r8, %r7, %r1;
    xor.b32 %r9, %r8, %r3;
    mov.u32 %r10, 0x6a09e667;
    mov.u32 %r11, 0;
ROUND:
    shf.l.wrap.b32 %r12, %r9, %r9, 5;
    xor.b32 %r13, %r10, 0x5be0cd19;
    add.u32 %r9, %r12, %r13;
    shf.l.wrap.b32 %r14, %r10, %r10, 13;
    xor.b32 %r10, %r14, %r9;
    add.u32 %r11, %r11, 1;
    setp.lt.u32 %p1, %r11, %r2;
    @%p1 bra ROUND;
    xor.b32 %r15, %r9, %r10;
    setp.ge.u32 %p2, %r15, %r17;
    @%p2 bra DONE;
    atom.global.min.u32 %r16, [%rd1], %r15;
    st.global.u32 [%rd1+4], %r8;
DONE:
    ret;
}

.visible .entry axpy(
    .param .u64 x,
    .param .u64 y,
    .param .f32 a,
    .param .u64 n
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.f32 %f1, [a];
    ld.param.u64 %rd3, [n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
STEP:
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra END;
    shl.b64 %rd7, %rd4, 2;
    add.u64 %rd8, %rd1, %rd7;
    add.u64 %rd9, %rd2, %rd7;
    ld.global.f32 %f2, [%rd8];
    ld.global.f32 %f3, [%rd9];
    fma.rn.f32 %f3, %f1, %f2, %f3;
    st.global.f32 [%rd9], %f3;
    add.u64 %rd4, %rd4, %rd6;
    bra STEP;
END:
    ret;
}
"""

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_SZ = ctypes.c_size_t
_DPTR = ctypes.c_uint64
_SIGNATURES = {
    "cuInit": [_U],
    "cuDriverGetVersion": [ctypes.POINTER(_I)],
    "cuDeviceGetCount": [ctypes.POINTER(_I)],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetName": [ctypes.c_char_p, _I, _I],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDeviceTotalMem_v2": [ctypes.POINTER(_SZ), _I],
    "cuCtxCreate_v2": [ctypes.POINTER(_P), _U, _I],
    "cuCtxDestroy_v2": [_P],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), _I],
    "cuDevicePrimaryCtxRelease_v2": [_I],
    "cuCtxSetCurrent": [_P],
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleLoadDataEx": [
        ctypes.POINTER(_P),
        ctypes.c_char_p,
        _U,
        ctypes.POINTER(_I),
        ctypes.POINTER(_P),
    ],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuMemAlloc_v2": [ctypes.POINTER(_DPTR), _SZ],
    "cuMemFree_v2": [_DPTR],
    "cuMemAllocHost_v2": [ctypes.POINTER(_P), _SZ],
    "cuMemFreeHost": [_P],
    "cuMemsetD32_v2": [_DPTR, _U, _SZ],
    "cuMemcpyHtoD_v2": [_DPTR, _P, _SZ],
    "cuMemcpyDtoH_v2": [_P, _DPTR, _SZ],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)],
    "cuCtxSynchronize": [],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
}


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str, log: str = "") -> None:
        super().__init__(f"{call} failed: {name} ({code}){': ' + log if log else ''}")
        self.call, self.code, self.name = call, code, name


class CudaDriver:
    """One process's use of the driver: a device, a context, a module of kernels."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get(LIBRARY_ENV) or "libcuda.so.1"
        self.lib = ctypes.CDLL(self.path)
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self.context = _P()
        self.context_kind = ""
        self.device = 0
        self.times: dict[str, float] = {}

    def _call(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise CudaError(name, code, self.error_name(code))

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode()
        return "CUDA_ERROR_?"

    def _timed(self, what: str, fn, *args):
        started = time.perf_counter()
        result = fn(*args)
        self.times[what] = round(time.perf_counter() - started, 4)
        return result

    def start(self, ordinal: int = 0) -> dict:
        """cuInit, the device, a context on it; what they say about the device."""
        self._timed("init_s", self._call, "cuInit", 0)
        version, dev, count = _I(), _I(), _I()
        self._call("cuDriverGetVersion", ctypes.byref(version))
        self._call("cuDeviceGetCount", ctypes.byref(count))
        self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
        self.device = dev.value
        name = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", name, 256, self.device)
        major, minor, sms, total = _I(), _I(), _I(), _SZ()
        self._call("cuDeviceGetAttribute", ctypes.byref(major), _ATTR_CC_MAJOR, self.device)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), _ATTR_CC_MINOR, self.device)
        self._call("cuDeviceGetAttribute", ctypes.byref(sms), _ATTR_SMS, self.device)
        self._call("cuDeviceTotalMem_v2", ctypes.byref(total), self.device)
        self._timed("context_s", self._create_context)
        return {
            "library": self.path,
            "driver_version": version.value,
            "devices": count.value,
            "device": name.value.decode(errors="replace"),
            "compute_capability": f"{major.value}.{minor.value}",
            "multiprocessors": sms.value,
            "memory_total": total.value,
            "context": self.context_kind,
        }

    def _create_context(self) -> None:
        # cuCtxCreate as the issue asks; drivers that no longer export the _v2 entry point
        # still give the primary context, which the runtime API (and every framework) uses.
        if getattr(self.lib, "cuCtxCreate_v2", None) is not None:
            code = self.lib.cuCtxCreate_v2(ctypes.byref(self.context), 0, self.device)
            if code == 0:
                self.context_kind = "cuCtxCreate_v2"
                return
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self._call("cuCtxSetCurrent", self.context)
        self.context_kind = "primary"

    def load(self, ptx: bytes = KERNELS) -> ctypes.c_void_p:
        """cuModuleLoadData (the driver compiles the PTX); its error log when it refuses."""
        module = _P()
        code = self._timed("module_s", self.lib.cuModuleLoadData, ctypes.byref(module), ptx)
        if code == 0:
            return module
        log = ctypes.create_string_buffer(8192)
        options = (_I * 2)(_JIT_ERROR_LOG, _JIT_ERROR_LOG_SIZE)
        values = (_P * 2)(ctypes.cast(log, _P), _P(len(log)))
        self.lib.cuModuleLoadDataEx(ctypes.byref(_P()), ptx, 2, options, values)
        raise CudaError(
            "cuModuleLoadData", code, self.error_name(code), log.value.decode(errors="replace")
        )

    def function(self, module: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        fn = _P()
        self._call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return fn

    def alloc(self, nbytes: int) -> int:
        ptr = _DPTR()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        return ptr.value

    def alloc_host(self, nbytes: int) -> ctypes.c_void_p:
        """Page-locked host memory (what DataLoader's pin_memory gives)."""
        ptr = _P()
        self._call("cuMemAllocHost_v2", ctypes.byref(ptr), nbytes)
        return ptr

    def fill32(self, ptr: int, value: int, count: int) -> None:
        self._call("cuMemsetD32_v2", ptr, value, count)

    def to_device(self, dst: int, src: ctypes.c_void_p | int, nbytes: int) -> None:
        self._call("cuMemcpyHtoD_v2", dst, src, nbytes)

    def to_host(self, dst: ctypes.c_void_p | int, src: int, nbytes: int) -> None:
        self._call("cuMemcpyDtoH_v2", dst, src, nbytes)

    def launch(self, fn, grid: int, block: int, *args) -> None:
        """One launch on the default stream; ``args`` are ctypes values in the kernel's order."""
        params = (_P * len(args))(*[ctypes.cast(ctypes.pointer(a), _P) for a in args])
        self._call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, 0, None, params, None)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def close(self) -> None:
        if self.context_kind == "cuCtxCreate_v2":
            self.lib.cuCtxDestroy_v2(self.context)
        elif self.context_kind == "primary":
            self.lib.cuDevicePrimaryCtxRelease_v2(self.device)
        self.context_kind = ""
