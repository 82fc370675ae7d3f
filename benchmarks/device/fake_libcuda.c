/* fake_libcuda.c - a stand-in for libcuda.so.1 for the device check's dry run (no GPU there).
 *
 * The entry points, signatures and error codes of the CUDA driver API functions that
 * cuda_driver.py calls.  It does no GPU work, and says so: the device is named
 * "stand-in (no GPU)".
 *  - cuInit replays a CUDA start-up's ioctls: GG_FAKE_CUDA_IOCTLS names a file of
 *    "PATH CMD" lines (made from an H100 start-up recorded in tests/traces/h100); each PATH is
 *    opened once and kept open, like the driver's fds, and each CMD issued on it.  In the dry
 *    run the paths are null-device nodes in a private /dev: the ioctls fail with ENOTTY, and
 *    the kernel's tracepoints (and gpuguard's probes) still see them on GPU-named files.
 *  - cuModuleLoadData accepts text holding ".entry"; cuModuleGetFunction finds ".entry NAME(".
 *  - Device and page-locked memory are host memory; copies are memcpy.
 *  - A launch checks its arguments and does nothing; the next cuCtxSynchronize sleeps
 *    GG_FAKE_CUDA_KERNEL_MS (default 20) milliseconds, the kernel's stand-in time.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
};

#define MAX_PATHS 16
static struct { char path[128]; int fd; } opened[MAX_PATHS];
static int nopened, initialised, context_made, pending;

static int fd_of(const char *path)
{
    for (int i = 0; i < nopened; i++)
        if (!strcmp(opened[i].path, path))
            return opened[i].fd;
    if (nopened == MAX_PATHS)
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    snprintf(opened[nopened].path, sizeof opened[nopened].path, "%s", path);
    opened[nopened++].fd = fd;
    return fd;
}

static void replay_startup(void)
{
    const char *script = getenv("GG_FAKE_CUDA_IOCTLS");
    FILE *f = script ? fopen(script, "r") : NULL;
    char path[128];
    unsigned long cmd;
    static unsigned char arg[4096];
    if (!f)
        return;
    while (fscanf(f, "%127s %lx", path, &cmd) == 2) {
        int fd = fd_of(path);
        if (fd >= 0)
            ioctl(fd, cmd, arg); /* ENOTTY on a null node: the call was still made */
    }
    fclose(f);
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialised)
        replay_startup();
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 0; /* no driver */
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device)
{
    if (device != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "stand-in (no GPU)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device)
{
    if (device != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *value = 0; /* a stand-in has no compute capability and no multiprocessors */
    (void)attribute;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device)
{
    if (device != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = 0;
    return CUDA_SUCCESS;
}

static CUresult make_context(CUcontext *ctx, CUdevice device)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (device != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    context_made = 1;
    *ctx = (CUcontext)&context_made;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device)
{
    (void)flags;
    return make_context(ctx, device);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) { return make_context(ctx, device); }
CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    context_made = 0;
    return ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device)
{
    context_made = 0;
    return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!context_made)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!image || !strstr((const char *)image, ".entry"))
        return CUDA_ERROR_INVALID_IMAGE;
    *module = strdup((const char *)image);
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, int *options,
                            void **values)
{
    (void)n, (void)options, (void)values;
    return cuModuleLoadData(module, image);
}

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name)
{
    char needle[160];
    if (!module || !name)
        return CUDA_ERROR_INVALID_HANDLE;
    snprintf(needle, sizeof needle, ".entry %s(", name);
    if (!strstr((const char *)module, needle))
        return CUDA_ERROR_NOT_FOUND;
    *fn = strdup(name);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes)
{
    void *p;
    if (!context_made)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    p = calloc(1, bytes);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    free((void *)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **ptr, size_t bytes)
{
    if (!context_made)
        return CUDA_ERROR_INVALID_CONTEXT;
    *ptr = calloc(1, bytes);
    return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *ptr)
{
    free(ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr ptr, unsigned int value, size_t count)
{
    unsigned int *p = (unsigned int *)(uintptr_t)ptr;
    for (size_t i = 0; i < count; i++)
        p[i] = value;
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream stream, void **params, void **extra)
{
    (void)shared, (void)stream;
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || (!params && !extra))
        return CUDA_ERROR_INVALID_VALUE;
    pending = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    const char *ms = getenv("GG_FAKE_CUDA_KERNEL_MS");
    long wait_ms = ms ? atol(ms) : 20;
    if (!context_made)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pending && wait_ms > 0) {
        struct timespec t = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    pending = 0;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name)
{
    static const struct { int code; const char *name; } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == error) {
            *name = names[i].name;
            return CUDA_SUCCESS;
        }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
