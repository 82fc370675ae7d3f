/* gpu_files.bpf.c - which processes open GPU device files, and which fds they hold.
 *
 * A successful open(2)/openat(2)/openat2(2) of a GPU path becomes a gpu_open
 * event, a tracked_fds entry and its gpu_fd_slots tag; close(2) and dup*(2)
 * keep both right (a close of any other fd costs two array reads).
 * Paths are classified by name (no kernel-internal structs), the same way
 * gpuguard/events/devices.py does it.
 */

struct gg_pending_open {
    __u32 device_class;
    __u32 open_flags;
    __u32 gg_flags;
    __u32 _pad;
    __u64 filename;             /* user pointer, handed to the classifier */
    char path[GG_PATH_LEN];
};

/* The one classifier program (slot 0), shared by every open hook through a
 * tail call: the path tests are large, and compiling them once per hook
 * cost ~0.2 s of clang time each at start-up. */
BPF_PROG_ARRAY(open_classifier, 1);

/* thread -> open in flight (enter seen, exit not yet) */
BPF_TABLE("lru_hash", __u64, struct gg_pending_open, pending_opens, 4096);
BPF_PERCPU_ARRAY(pending_scratch, struct gg_pending_open, 1);
/* thread -> old fd of a dup in flight */
BPF_TABLE("lru_hash", __u64, __s32, pending_dups, 4096);

/* Byte-wise prefix test.  After inlining, the loop unrolls and the literal's
 * bytes fold into immediates (bcc cannot load .rodata; memcmp would be a call). */
static __always_inline int gg_has_prefix(const char *s, const char *lit, const int n)
{
    #pragma unroll
    for (int i = 0; i < 24; i++) {
        if (i >= n)
            return 1;
        if (s[i] != lit[i])
            return 0;
    }
    return 1;
}
#define GG_PREFIX(s, lit) gg_has_prefix((s), (lit), sizeof(lit) - 1)
#define GG_IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

/* Index just past the last '/' of p (or -1); bounded so the verifier can follow. */
static __always_inline int gg_basename_at(const char *p)
{
    int last = -1;
    #pragma unroll
    for (int i = 0; i < GG_PATH_LEN - 16; i++) {
        if (p[i] == 0)
            break;
        if (p[i] == '/')
            last = i;
    }
    return last >= 0 && last < GG_PATH_LEN - 16 ? last + 1 : -1;
}

/* /dev/cpu/N/msr, N up to 5 digits; d points after "/dev/". */
static __always_inline __u32 classify_cpu_node(const char *d)
{
    const char *c = d + 4;
    if (!GG_IS_DIGIT(c[0]))
        return GG_DEV_NONE;
    #pragma unroll
    for (int i = 1; i < 6; i++) {
        if (c[i] == '/')
            return (GG_PREFIX(c + i + 1, "msr") && c[i + 4] == 0) ? GG_DEV_MSR : GG_DEV_NONE;
        if (!GG_IS_DIGIT(c[i]))
            return GG_DEV_NONE;
    }
    return GG_DEV_NONE;
}

/* The msr and huge-page tuning files (GG_PREFIX tests at most 24 bytes: long paths in pieces). */
static __always_inline __u32 classify_tuning(const char *p)
{
    if (GG_PREFIX(p, "/proc/sys/vm/") && GG_PREFIX(p + 13, "nr_hugepages") && p[25] == 0)
        return GG_DEV_HUGEPAGES_CONFIG;
    if (GG_PREFIX(p, "/sys/module/msr/") && GG_PREFIX(p + 16, "parameters/allow_writes") && p[39] == 0)
        return GG_DEV_MSR_CONFIG;
    if (GG_PREFIX(p, "/sys/kernel/mm/") && GG_PREFIX(p + 15, "hugepages/")) {
        int b = gg_basename_at(p);
        if (b > 25 && GG_PREFIX(p + b, "nr_hugepages") && p[b + 12] == 0)
            return GG_DEV_HUGEPAGES_CONFIG;
    }
    return GG_DEV_NONE;
}

/* Classify a NUL-terminated absolute path already read into p. */
static __always_inline __u32 classify_absolute(const char *p)
{
    if (GG_PREFIX(p, "/dev/")) {
        const char *d = p + 5;
        if (GG_PREFIX(d, "cpu/"))
            return classify_cpu_node(d);
        if (GG_PREFIX(d, "nvidia")) {
            const char *n = d + 6;
            if (GG_IS_DIGIT(n[0]))
                return GG_DEV_NVIDIA;
            if (GG_PREFIX(n, "ctl") && n[3] == 0)
                return GG_DEV_NVIDIA_CTL;
            if (GG_PREFIX(n, "-uvm-tools") && n[10] == 0)
                return GG_DEV_NVIDIA_UVM_TOOLS;
            if (GG_PREFIX(n, "-uvm") && n[4] == 0)
                return GG_DEV_NVIDIA_UVM;
            if (GG_PREFIX(n, "-modeset") && n[8] == 0)
                return GG_DEV_NVIDIA_MODESET;
            if (GG_PREFIX(n, "-caps/"))
                return GG_DEV_NVIDIA_CAPS;
            return GG_DEV_NONE;
        }
        if (GG_PREFIX(d, "kfd") && d[3] == 0)
            return GG_DEV_KFD;
        if (GG_PREFIX(d, "mem") && d[3] == 0)
            return GG_DEV_MEM;
        if (GG_PREFIX(d, "dri/card") && GG_IS_DIGIT(d[8]))
            return GG_DEV_DRM_CARD;
        if (GG_PREFIX(d, "dri/renderD") && GG_IS_DIGIT(d[11]))
            return GG_DEV_DRM_RENDER;
        return GG_DEV_NONE;
    }
    if (GG_PREFIX(p, "/sys/bus/pci/devices/") || GG_PREFIX(p, "/sys/devices/pci")) {
        /* .../<bdf>/resourceN: find the last '/' and test the basename. */
        int last = -1;
        #pragma unroll
        for (int i = 0; i < GG_PATH_LEN - 10; i++) {
            if (p[i] == 0)
                break;
            if (p[i] == '/')
                last = i;
        }
        if (last >= 0 && last < GG_PATH_LEN - 10) {
            const char *b = p + last + 1;
            if (GG_PREFIX(b, "resource") && GG_IS_DIGIT(b[8]))
                return GG_DEV_PCI_BAR;
        }
        return GG_DEV_NONE;
    }
    return classify_tuning(p);
}

/* A relative path (openat(dirfd, "renderD128")): classify by basename;
 * user space confirms through /proc/PID/fd and drops false positives. */
static __always_inline __u32 classify_relative(const char *p)
{
    int start = 0;
    #pragma unroll
    for (int i = 0; i < 64; i++) {
        if (p[i] == 0)
            break;
        if (p[i] == '/')
            start = i + 1;
    }
    if (start > 64)
        return GG_DEV_NONE;
    const char *b = p + (start & 63);
    if (GG_PREFIX(b, "nvidia"))
        return GG_IS_DIGIT(b[6]) ? GG_DEV_NVIDIA :
               (GG_PREFIX(b + 6, "ctl") ? GG_DEV_NVIDIA_CTL :
               (GG_PREFIX(b + 6, "-uvm-tools") ? GG_DEV_NVIDIA_UVM_TOOLS :
               (GG_PREFIX(b + 6, "-uvm") ? GG_DEV_NVIDIA_UVM :
               (GG_PREFIX(b + 6, "-modeset") ? GG_DEV_NVIDIA_MODESET : GG_DEV_NONE))));
    if (GG_PREFIX(b, "kfd") && b[3] == 0)
        return GG_DEV_KFD;
    if (GG_PREFIX(b, "mem") && b[3] == 0)
        return GG_DEV_MEM;
    if (GG_PREFIX(b, "renderD") && GG_IS_DIGIT(b[7]))
        return GG_DEV_DRM_RENDER;
    if (GG_PREFIX(b, "card") && GG_IS_DIGIT(b[4]))
        return GG_DEV_DRM_CARD;
    if (GG_PREFIX(b, "resource") && GG_IS_DIGIT(b[8]))
        return GG_DEV_PCI_BAR;
    return GG_DEV_NONE;
}

static __always_inline int open_enter(void *ctx, const char *filename, __u32 flags)
{
    /* Most opens are not GPU files: look at the first bytes before
     * paying for the whole path. */
    char head[8] = {};
    if (bpf_probe_read_user(head, sizeof(head), filename) < 0)
        return 0;
    if (head[0] == '/') {
        /* "/proc/sy": only /proc/sys/vm/nr_hugepages is of interest under /proc. */
        if (!GG_PREFIX(head, "/dev/") && !GG_PREFIX(head, "/sys/") && !GG_PREFIX(head, "/proc/sy"))
            return 0;
    }
    __u32 zero = 0;
    /* The agent's own opens (its host checks read the huge-page settings every few seconds)
     * would make it a GPU holder in its own eyes: user space names it here before attaching
     * (a map, not a define, so one compiled image serves every agent). */
    __u32 *ignored = ignore_tgid.lookup(&zero);
    if (ignored && *ignored && (__u32)(bpf_get_current_pid_tgid() >> 32) == *ignored)
        return 0;
    struct gg_pending_open *po = pending_scratch.lookup(&zero);
    if (!po)
        return 0;
    po->filename = (__u64)filename;
    po->open_flags = flags;
    open_classifier.call(ctx, 0);
    count_lost(GG_LOST_OPEN_CLASSIFY);  /* reached only if the tail call failed */
    return 0;
}

/* Tail-call target (loaded by the sensor, not attached): classify the path
 * stashed by open_enter on this CPU and remember a GPU open in flight. */
int classify_open(void *ctx)
{
    __u32 zero = 0;
    struct gg_pending_open *po = pending_scratch.lookup(&zero);
    if (!po)
        return 0;
    const char *filename = (const char *)po->filename;
    if (bpf_probe_read_user_str(po->path, sizeof(po->path), filename) < 0)
        return 0;
    if (po->path[0] == '/') {
        po->device_class = classify_absolute(po->path);
        po->gg_flags = 0;
    } else {
        po->device_class = classify_relative(po->path);
        po->gg_flags = GG_OPEN_RELATIVE;
    }
    if (po->device_class == GG_DEV_NONE)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    pending_opens.update(&id, po);
    return 0;
}

static __always_inline int open_exit(void *ctx, long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_pending_open *po = pending_opens.lookup(&id);
    if (!po)
        return 0;
    if (ret < 0) {
        pending_opens.delete(&id);
        return 0;
    }
    struct gg_fd_key key = { .tgid = id >> 32, .fd = (__s32)ret };
    struct gg_tracked_fd val = { .device_class = po->device_class, .open_flags = po->open_flags };
    if (tracked_fds.update(&key, &val) < 0) {
        count_lost(GG_LOST_TRACKED_FDS);
    } else {
        count_write(GG_WRITE_TRACKED_FDS);
        gpu_slot_publish(key.tgid, key.fd, val.device_class);
    }
    if (val.device_class < GG_DEV_MSR) {    /* a GPU holder: its connections get activity records */
        __u8 one = 1;
        watched_tgids.update(&key.tgid, &one);
        exec_mark(key.tgid, GG_INTEREST_GPU);   /* its tree's execs go up in full */
    }
    gg_exec_promote(ctx, key.tgid);             /* its exec first, if still pending */

    struct gg_gpu_open *e = gg_event_reserve(sizeof(*e), GG_KIND_GPU_OPEN, GG_LOST_GPU_OPEN);
    if (!e) {
        pending_opens.delete(&id);
        return 0;
    }
    e->fd = (__s32)ret;
    e->open_flags = po->open_flags;
    e->device_class = po->device_class;
    e->gg_flags = po->gg_flags;
    __builtin_memcpy(e->path, po->path, sizeof(e->path));
    gg_event_submit(ctx, e, sizeof(*e), GG_LOST_GPU_OPEN);
    pending_opens.delete(&id);
    return 0;
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
    return open_enter(args, args->filename, args->flags);
}
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
    return open_exit(args, args->ret);
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_open)
{
    return open_enter(args, args->filename, args->flags);
}
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_open)
{
    return open_exit(args, args->ret);
}

static __always_inline int openat2_enter(void *ctx, const char *filename, const void *how)
{
    __u64 flags = 0;
    bpf_probe_read_user(&flags, sizeof(flags), how); /* open_how.flags is first */
    return open_enter(ctx, filename, (__u32)flags);
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_openat2)
{
    return openat2_enter(args, args->filename, args->how);
}
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_openat2)
{
    return open_exit(args, args->ret);
}

static __always_inline int close_enter(__s32 fd)
{
    __u64 id = bpf_get_current_pid_tgid();
    forget_fd(id >> 32, fd);
    return 0;
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    return close_enter((__s32)args->fd);
}
#endif

/* dup/dup2/dup3 of a tracked fd: the new fd drives the same GPU.  dup2/dup3
 * close newfd first, so whatever newfd was is forgotten either way. */
static __always_inline int dup_enter(__u32 oldfd, __s32 newfd)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (newfd >= 0 && (__u32)newfd != oldfd)
        forget_fd(id >> 32, newfd);
    struct gg_fd_key key = { .tgid = id >> 32, .fd = (__s32)oldfd };
    __u32 st = gpu_slot_get(key.tgid, key.fd);
    if (st == GG_SLOT_ABSENT)
        return 0;
    if (st == GG_SLOT_ASK && !tracked_fds.lookup(&key))
        return 0;
    __s32 fd = (__s32)oldfd;
    pending_dups.update(&id, &fd);
    return 0;
}

static __always_inline int dup_exit(long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    __s32 *oldfd = pending_dups.lookup(&id);
    if (!oldfd)
        return 0;
    struct gg_fd_key oldkey = { .tgid = id >> 32, .fd = *oldfd };
    pending_dups.delete(&id);
    if (ret < 0)
        return 0;
    struct gg_tracked_fd *val = tracked_fds.lookup(&oldkey);
    if (!val)
        return 0;
    struct gg_tracked_fd copy = *val;
    struct gg_fd_key newkey = { .tgid = id >> 32, .fd = (__s32)ret };
    if (tracked_fds.update(&newkey, &copy) < 0) {
        count_lost(GG_LOST_TRACKED_FDS);
    } else {
        count_write(GG_WRITE_TRACKED_FDS);
        gpu_slot_publish(newkey.tgid, newkey.fd, copy.device_class);
    }
    return 0;
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_dup) { return dup_enter(args->fildes, -1); }
TRACEPOINT_PROBE(syscalls, sys_enter_dup2) { return dup_enter(args->oldfd, (__s32)args->newfd); }
TRACEPOINT_PROBE(syscalls, sys_enter_dup3) { return dup_enter(args->oldfd, (__s32)args->newfd); }
#endif
TRACEPOINT_PROBE(syscalls, sys_exit_dup) { return dup_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup2) { return dup_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup3) { return dup_exit(args->ret); }
