/* fpu.bpf.c - the SSE rounding mode each process leaves in its FPU at context switches.
 *
 * RandomX (Monero's proof of work) changes the MXCSR rounding mode inside its hot loop
 * (the CFROUND instruction), so a RandomX miner's threads are switched out in any of the
 * four modes; ordinary programs stay in round-to-nearest.  A stringless, throttled miner
 * behind TLS cannot drop this without computing wrong hashes.  (cryptnono's Monero detector
 * watches the same tracepoint for the same reason.)
 *
 * x86_fpu_regs_deactivated fires after the kernel saved the outgoing task's registers to
 * fpu->fpstate, in that task's context.  The offsets into struct fpu and struct fpstate
 * differ between kernel builds and the installed headers may be another kernel's, so user
 * space reads them from BTF and passes them in: GG_FPU_FPSTATE_OFF (struct fpu.fpstate) and
 * GG_FPSTATE_MXCSR_OFF (struct fpstate.regs.xsave.i387.mxcsr; the legacy area is at the
 * start of every XSAVE layout, compacted or not).
 *
 * Cost on the common path (a task that never left nearest): two kernel reads and one hash
 * lookup that misses.  Only a process found in another mode gets an entry, and its looks are
 * counted at most once per GG_FPU_MIN_GAP_NS.
 */
#include <uapi/linux/bpf.h>
#include "gpuguard.h"

#ifndef GG_FPU_MIN_GAP_NS
#define GG_FPU_MIN_GAP_NS 1000000ULL /* 1 ms */
#endif
#define GG_MXCSR_RC_SHIFT 13

BPF_TABLE("lru_hash", __u32, struct gg_fpu_rounding, fpu_rounding, 8192);

/* layout self-check for user space (bcc builds the ctypes class from it) */
BPF_ARRAY(schema_fpu_rounding, struct gg_fpu_rounding, 1);

TRACEPOINT_PROBE(x86_fpu, x86_fpu_regs_deactivated)
{
    void *fpstate = NULL;
    __u32 mxcsr = 0;
    if (bpf_probe_read_kernel(&fpstate, sizeof(fpstate), (char *)args->fpu + GG_FPU_FPSTATE_OFF) || !fpstate)
        return 0;
    if (bpf_probe_read_kernel(&mxcsr, sizeof(mxcsr), (char *)fpstate + GG_FPSTATE_MXCSR_OFF))
        return 0;
    __u32 rc = (mxcsr >> GG_MXCSR_RC_SHIFT) & 3;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct gg_fpu_rounding *e = fpu_rounding.lookup(&tgid);
    if (!e && rc == 0)
        return 0;
    __u64 now = bpf_ktime_get_boot_ns();
    if (!e) {
        struct gg_fpu_rounding fresh = {};
        fresh.first_ns = now;
        fresh.last_ns = now;
        fresh.samples = 1;
        fresh.nondefault = 1;
        fresh.changes = 1; /* from the nearest every process starts in */
        fresh.last_rc = rc;
        fpu_rounding.update(&tgid, &fresh);
        return 0;
    }
    if (now - e->last_ns < GG_FPU_MIN_GAP_NS)
        return 0;
    e->last_ns = now;
    __sync_fetch_and_add(&e->samples, 1);
    if (rc)
        __sync_fetch_and_add(&e->nondefault, 1);
    if (rc != e->last_rc) {
        __sync_fetch_and_add(&e->changes, 1);
        e->last_rc = rc;
    }
    return 0;
}
