/* respond_touch.bpf.c - kill-on-touch: a blocked program dies at its first GPU open or connect.
 *
 * touch_paths holds blocked executables by the FNV-1a hash of their path;
 * touch_tgids blocked processes.  An exec of a blocked path puts the new
 * process in touch_tgids, and a fork of a blocked process puts the child
 * there, so respawns and children are blocked before they run a line of code;
 * an exiting pid leaves the map.
 * At sys_enter of open/openat/openat2 of a GPU path, or of connect(2) to an
 * IPv4/IPv6 peer, a blocked process gets SIGKILL from bpf_send_signal: the
 * kernel delivers it before the syscall returns, so the process never uses
 * the fd or the socket.  Every kill, and (when user space asks through
 * touch_settings) every exec, is reported on touch_events so user space can
 * log it and match renamed copies by device+inode or sha256.
 *
 * Only tracepoint arguments and user memory are read (never task_struct):
 * bcc's headers do not match the running kernel.  Compiled with
 * -DGG_PIN_ROOT="..." so the maps are pinned there and outlive the agent.
 */
#include <uapi/linux/ptrace.h>
#include "gpuguard.h"

#define GG_AF_INET 2
#define GG_AF_INET6 10
#define GG_SIGKILL 9
#define GG_FNV_OFFSET 0xcbf29ce484222325ULL
#define GG_FNV_PRIME 0x100000001b3ULL

BPF_TABLE_PINNED("hash", __u64, struct gg_touch_entry, touch_paths, 1024, GG_PIN_ROOT "/maps/touch_paths");
BPF_TABLE_PINNED("hash", __u32, struct gg_touch_entry, touch_tgids, 8192, GG_PIN_ROOT "/maps/touch_tgids");
/* [0] = 1: report every exec (user space holds identities to match by inode/sha256). */
BPF_ARRAY(touch_settings, __u32, 1);
BPF_PERCPU_ARRAY(touch_scratch, struct gg_touch_event, 1);
BPF_RINGBUF_OUTPUT(touch_events, 64);
/* Never written: exports struct gg_touch_event's layout to user space (bcc builds the ctypes class). */
BPF_ARRAY(schema_touch_event, struct gg_touch_event, 1);

static __always_inline int gg_live(struct gg_touch_entry *e)
{
    return e && (e->expires_ns == 0 || bpf_ktime_get_ns() < e->expires_ns);
}

static __always_inline void gg_report(struct gg_touch_event *src)
{
    struct gg_touch_event *e = touch_events.ringbuf_reserve(sizeof(*e));
    if (!e)
        return;
    __builtin_memcpy(e, src, sizeof(*e));
    touch_events.ringbuf_submit(e, 0);
}

static __always_inline struct gg_touch_event *gg_event(__u32 tgid, __u32 reason, __u32 block)
{
    __u32 zero = 0;
    struct gg_touch_event *e = touch_scratch.lookup(&zero);
    if (!e)
        return 0;
    e->time_ns = bpf_ktime_get_boot_ns();
    e->tgid = tgid;
    e->ppid = 0;
    e->reason = reason;
    e->block = block;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    e->path[0] = 0;
    return e;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u32 zero = 0;
    struct gg_touch_event *e = gg_event(tgid, GG_TOUCH_EXEC, 0);
    if (!e)
        return 0;
    __u32 off = args->data_loc_filename & 0xFFFF;
    if (bpf_probe_read_kernel_str(e->path, sizeof(e->path), (char *)args + off) < 0)
        return 0;
    __u64 hash = GG_FNV_OFFSET;
    for (int i = 0; i < GG_PATH_LEN; i++) {
        char c = e->path[i];
        if (c == 0)
            break;
        hash = (hash ^ (__u8)c) * GG_FNV_PRIME;
    }
    struct gg_touch_entry *blocked = touch_paths.lookup(&hash);
    if (gg_live(blocked)) {
        struct gg_touch_entry copy = *blocked;
        copy.added_ns = bpf_ktime_get_boot_ns();
        touch_tgids.update(&tgid, &copy);
        e->block = copy.block;
        gg_report(e);
        return 0;
    }
    __u32 *report = touch_settings.lookup(&zero);
    if (report && *report)
        gg_report(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    __u32 parent = args->parent_pid;
    struct gg_touch_entry *blocked = touch_tgids.lookup(&parent);
    if (!gg_live(blocked))
        return 0;
    struct gg_touch_entry copy = *blocked;
    copy.added_ns = bpf_ktime_get_boot_ns();
    __u32 child = args->child_pid;
    touch_tgids.update(&child, &copy);
    return 0;
}

/* A blocked pid (or thread id) that exits leaves the map, so the number can
 * never block the unrelated process that gets it next. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u32 pid = (__u32)bpf_get_current_pid_tgid();
    touch_tgids.delete(&pid);
    return 0;
}

static __always_inline int gg_is_gpu_path(const char *p)
{
    /* The device paths of probes/gpu_files.bpf.c's classifier, by prefix:
     * /dev/nvidia..., /dev/kfd, /dev/dri/..., and relative names of those. */
    if (p[0] == '/') {
        if (p[1] != 'd' || p[2] != 'e' || p[3] != 'v' || p[4] != '/')
            return 0;
        p += 5;
    }
    if (p[0] == 'n' && p[1] == 'v' && p[2] == 'i' && p[3] == 'd' && p[4] == 'i' && p[5] == 'a')
        return 1;
    if (p[0] == 'k' && p[1] == 'f' && p[2] == 'd' && p[3] == 0)
        return 1;
    if (p[0] == 'd' && p[1] == 'r' && p[2] == 'i' && p[3] == '/')
        return 1;
    if (p[0] == 'r' && p[1] == 'e' && p[2] == 'n' && p[3] == 'd' && p[4] == 'e' && p[5] == 'r' && p[6] == 'D')
        return 1;
    return 0;
}

static __always_inline int gg_touch(void *ctx, __u32 reason, const char *path)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct gg_touch_entry *blocked = touch_tgids.lookup(&tgid);
    if (!blocked)
        return 0;          /* the common case: one hash lookup */
    if (!gg_live(blocked))
        return 0;
    __u32 block = blocked->block;
    struct gg_touch_event *e = gg_event(tgid, reason, block);
    if (!e)
        return 0;
    if (path) {
        if (bpf_probe_read_user_str(e->path, sizeof(e->path), path) < 0)
            return 0;
        if (!gg_is_gpu_path(e->path))
            return 0;
    }
    bpf_send_signal(GG_SIGKILL);
    gg_report(e);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
    return gg_touch(args, GG_TOUCH_GPU_OPEN, args->filename);
}

TRACEPOINT_PROBE(syscalls, sys_enter_open)
{
    return gg_touch(args, GG_TOUCH_GPU_OPEN, args->filename);
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat2)
{
    return gg_touch(args, GG_TOUCH_GPU_OPEN, args->filename);
}

TRACEPOINT_PROBE(syscalls, sys_enter_connect)
{
    __u16 family = 0;
    bpf_probe_read_user(&family, sizeof(family), args->uservaddr);
    if (family != GG_AF_INET && family != GG_AF_INET6)
        return 0;
    return gg_touch(args, GG_TOUCH_CONNECT, 0);
}
