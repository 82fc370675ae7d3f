/* sensor.bpf.c - the GPU sensor: the one program gpuguard loads.
 *
 * Compiled by bcc at start-up with -I<probes> and the GG_* defines chosen in
 * gpuguard/sources/ebpf/probe_source.py (ProbeSettings.cflags: GG_PAYLOAD_CAPTURE,
 * GG_PERF_BUFFER, map sizes; GG_PID_MAX from sources/ebpf/exit_gens.py).  The
 * constants user space shares with it live in gpuguard.h, which
 * gpuguard/events/abi.py reads (DEFINES).
 * Reads only tracepoint arguments, user memory and UAPI-stable layouts, so it
 * loads correctly with kernel headers that do not match the running kernel.
 */
#include <uapi/linux/ptrace.h>
#include "gpuguard.h"
#include "maps.bpf.h"
#include "gpu_files.bpf.c"
#include "gpu_ioctl.bpf.c"
#include "net.bpf.c"
#include "process.bpf.c"
#include "huge_pages.bpf.c"
#include "raw_enter.bpf.c"
