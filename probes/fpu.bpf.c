/* fpu.bpf.c - the SSE rounding mode each thread leaves in its FPU at context switches.
 *
 * RandomX (Monero's proof of work) sets the MXCSR rounding mode from random register bits
 * inside its hot loop (the CFROUND instruction), so a RandomX miner's threads are switched out
 * in any of the four modes, in even shares, each look independent of the one before.  Ordinary
 * programs stay in round-to-nearest; the few that switch on purpose (interval arithmetic,
 * set-once numeric code, test suites) do it in fixed patterns.  The counts kept here let user
 * space tell the two apart (gpuguard/events/rounding_modes.py).  A stringless, throttled miner
 * behind TLS cannot drop this without computing wrong hashes.  (cryptnono's Monero detector
 * watches the same tracepoint for the same reason.)
 *
 * x86_fpu_regs_deactivated fires after the kernel saved the outgoing task's registers to
 * fpu->fpstate, in that task's context (current is still the outgoing task).  The offsets into
 * struct fpu, struct fpstate and struct task_struct differ between kernel builds and the
 * installed headers may be another kernel's, so user space reads them from BTF and passes them
 * in: GG_FPU_FPSTATE_OFF (struct fpu.fpstate), GG_FPSTATE_MXCSR_OFF
 * (struct fpstate.regs.xsave.i387.mxcsr; the legacy area is at the start of every XSAVE
 * layout, compacted or not) and GG_TASK_STATE_OFF (struct task_struct.__state).
 *
 * Cost on the common path (a thread that never left nearest): two kernel reads and one hash
 * lookup that misses, as before.  Only a thread found in another mode gets an entry, and its
 * looks are counted at most once per GG_FPU_MIN_GAP_NS.  An entry is only ever written by its
 * own thread's switch-outs, one CPU at a time, so plain increments suffice.
 */
#include <uapi/linux/bpf.h>
#include "gpuguard.h"

#ifndef GG_FPU_MIN_GAP_NS
#define GG_FPU_MIN_GAP_NS 1000000ULL /* 1 ms */
#endif
#define GG_MXCSR_RC_SHIFT 13
/* task states (include/linux/sched.h): stopped or traced from outside, or frozen */
#define GG_TASK_STOPPED_MASK (0x0004 | 0x0008 | 0x8000)

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
    __u32 mode = (mxcsr >> GG_MXCSR_RC_SHIFT) & 3;
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    struct gg_fpu_rounding *e = fpu_rounding.lookup(&tid);
    if (!e && mode == GG_FPU_NEAREST)
        return 0;
    __u64 now = bpf_ktime_get_boot_ns();
    if (e && now - e->last_ns < GG_FPU_MIN_GAP_NS)
        return 0;
    __u32 state = 0;
    void *task = (void *)bpf_get_current_task();
    bpf_probe_read_kernel(&state, sizeof(state), (char *)task + GG_TASK_STATE_OFF);
    if (!e) {
        struct gg_fpu_rounding fresh = {};
        fresh.first_ns = now;
        fresh.last_ns = now;
        fresh.modes[mode] = 1;
        fresh.tgid = id >> 32;
        fresh.last_mode = mode;
        if (state == 0)
            fresh.preempted = 1;
        else if (state & GG_TASK_STOPPED_MASK)
            fresh.stopped = 1;
        fpu_rounding.update(&tid, &fresh);
        return 0;
    }
    e->last_ns = now;
    e->modes[mode] += 1;
    e->next[((e->last_mode & 3) << 2) | mode] += 1;
    e->last_mode = mode;
    if (state == 0)
        e->preempted += 1;
    else if (state & GG_TASK_STOPPED_MASK)
        e->stopped += 1;
    return 0;
}
