/* raw_enter.bpf.c - every syscall-entry hook from one raw sys_enter program.
 *
 * Compiled only with GG_RAW_SYS_ENTER (ProbeSettings.enter_hook = "raw"); the
 * per-syscall sys_enter_* tracepoints are then left out, and the sys_exit_*
 * ones stay.  The kernel's per-syscall tracepoint path costs ~150 ns per
 * traced call before a program does anything (benchmarks/README-sensor.md);
 * a raw sys_enter program costs ~80 ns, but on EVERY syscall of the host, not
 * only the traced ones.  That is the trade-off this option makes.
 *
 * Arguments come from the syscall's struct pt_regs, whose layout is the UAPI
 * register layout (asm/ptrace.h); arguments 1-3 sit in adjacent registers
 * and are read with one bpf_probe_read_kernel.  No kernel-internal struct is
 * read.  Only architectures listed below are supported.
 */
#ifdef GG_RAW_SYS_ENTER
#include <asm/unistd.h>             /* __NR_* for the target architecture */

#if defined(bpf_target_x86)         /* bpf_target_* come from bcc's helpers.h */
#define GG_ARGS_AT(regs) (&(regs)->dx)          /* dx, si, di = arg3, arg2, arg1 */
#define GG_ARG1(a) ((a)[2])
#define GG_ARG2(a) ((a)[1])
#define GG_ARG3(a) ((a)[0])
#define GG_ARG4_AT(regs) (&(regs)->r10)         /* the syscall ABI passes arg4 in r10 */
#elif defined(bpf_target_arm64)
#define GG_ARGS_AT(regs) (&(regs)->regs[0])     /* x0, x1, x2 */
#define GG_ARG1(a) ((a)[0])
#define GG_ARG2(a) ((a)[1])
#define GG_ARG3(a) ((a)[2])
#define GG_ARG4_AT(regs) (&(regs)->regs[3])
#else
#error "enter_hook=raw supports x86_64 and arm64; use the tracepoint hooks"
#endif

RAW_TRACEPOINT_PROBE(sys_enter)
{
    /* TP_PROTO(struct pt_regs *regs, long id) */
    long nr = (long)ctx->args[1];
    switch (nr) {
    case __NR_ioctl:
    case __NR_close:
    case __NR_write:
    case __NR_sendto:
    case __NR_writev:
    case __NR_sendmsg:
    case __NR_openat:
    case __NR_openat2:
    case __NR_dup:
    case __NR_dup3:
    case __NR_connect:
    case __NR_exit_group:
    case __NR_mmap:
    case __NR_shmget:
#ifdef __NR_open
    case __NR_open:
#endif
#ifdef __NR_dup2
    case __NR_dup2:
#endif
        break;
    default:
        return 0;
    }
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    __u64 a[3];
    if (bpf_probe_read_kernel(a, sizeof(a), GG_ARGS_AT(regs)) < 0)
        return 0;
    __u64 a1 = GG_ARG1(a), a2 = GG_ARG2(a), a3 = GG_ARG3(a);

    if (nr == __NR_ioctl) {
        __u64 id = bpf_get_current_pid_tgid();
        return count_ioctl(id >> 32, (__s32)a1, (__u32)a2, a3);
    }
    if (nr == __NR_close)
        return close_enter((__s32)a1);
#ifdef GG_PAYLOAD_CAPTURE
    if (nr == __NR_write || nr == __NR_sendto)
        return capture_write(ctx, (__s32)a1, a2, a3);
    if (nr == __NR_writev)
        return capture_iov(ctx, (__s32)a1, a2, a3);
    if (nr == __NR_sendmsg)
        return sendmsg_enter(ctx, (__s32)a1, (const void *)a2);
#endif
    if (nr == __NR_openat)
        return open_enter(ctx, (const char *)a2, (__u32)a3);
#ifdef __NR_open
    if (nr == __NR_open)
        return open_enter(ctx, (const char *)a1, (__u32)a2);
#endif
    if (nr == __NR_openat2)
        return openat2_enter(ctx, (const char *)a2, (const void *)a3);
    if (nr == __NR_dup)
        return dup_enter((__u32)a1, -1);
#ifdef __NR_dup2
    if (nr == __NR_dup2)
        return dup_enter((__u32)a1, (__s32)a2);
#endif
    if (nr == __NR_dup3)
        return dup_enter((__u32)a1, (__s32)a2);
    if (nr == __NR_connect)
        return connect_enter((__s32)a1, (const char *)a2);
    if (nr == __NR_exit_group)
        return exit_group_enter((__s32)a1);
    if (nr == __NR_shmget)
        return shmget_enter(ctx, a2, a3);
    if (nr == __NR_mmap) {
        __u64 flags;
        if (bpf_probe_read_kernel(&flags, sizeof(flags), GG_ARG4_AT(regs)) < 0)
            return 0;
        return mmap_enter(ctx, a2, flags);
    }
    return 0;
}
#endif /* GG_RAW_SYS_ENTER */
