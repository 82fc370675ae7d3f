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
 * The response scope holds here too: with touch_settings[1] set, a task is
 * acted on (killed, blocked at exec, reported for matching) only when its
 * cgroup v2, or an ancestor of it, is in touch_scope (cgroup ids user space
 * fills from response.cgroups, or from the container cgroups it knows for
 * `scope: containers`).  A suspended entry (its block's circuit breaker
 * tripped) kills nothing.  Every report carries the pid's exit generation
 * (touch_exit_gens, bumped at exit) so user space opens a pidfd for exactly
 * the reported process.
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
#define GG_SCOPE_LEVELS 16         /* cgroup depth checked against touch_scope */

BPF_TABLE_PINNED("hash", __u64, struct gg_touch_entry, touch_paths, 1024, GG_PIN_ROOT "/maps/touch_paths");
BPF_TABLE_PINNED("hash", __u32, struct gg_touch_entry, touch_tgids, 8192, GG_PIN_ROOT "/maps/touch_tgids");
/* [0] = 1: report every exec (user space holds identities to match by inode/sha256);
 * [1] = 1: act only inside touch_scope. */
BPF_ARRAY(touch_settings, __u32, 2);
BPF_HASH(touch_scope, __u64, __u8, 1024);
BPF_ARRAY(touch_exit_gens, __u32, GG_PID_MAX);
BPF_PERCPU_ARRAY(touch_scratch, struct gg_touch_event, 1);
/* Kills and exec reports go up on rings of their own, so a flood of execs can never crowd
 * out the report of a kill; a kill whose report found no room is still counted. */
BPF_RINGBUF_OUTPUT(touch_events, 64);
BPF_RINGBUF_OUTPUT(touch_kills, 64);
BPF_ARRAY(touch_lost, __u64, 2);        /* [0] kill reports, [1] exec reports without room */
/* Never written: exports struct gg_touch_event's layout to user space (bcc builds the ctypes class). */
BPF_ARRAY(schema_touch_event, struct gg_touch_event, 1);

static __always_inline int gg_live(struct gg_touch_entry *e)
{
    return e && !(e->flags & GG_TOUCH_SUSPENDED)
        && (e->expires_ns == 0 || bpf_ktime_get_ns() < e->expires_ns);
}

static __always_inline __u32 gg_setting(__u32 index)
{
    __u32 *value = touch_settings.lookup(&index);
    return value ? *value : 0;
}

/* The current task's cgroup (or one of its ancestors) is in the response scope. */
static __always_inline int gg_in_scope(void)
{
    if (!gg_setting(1))
        return 1;
#pragma unroll
    for (int level = 0; level < GG_SCOPE_LEVELS; level++) {
        __u64 id = bpf_get_current_ancestor_cgroup_id(level);
        if (id == 0)
            break;
        if (touch_scope.lookup(&id))
            return 1;
    }
    return 0;
}

static __always_inline void gg_lost(__u32 which)
{
    __u64 *count = touch_lost.lookup(&which);
    if (count)
        __sync_fetch_and_add(count, 1);
}

static __always_inline void gg_report(struct gg_touch_event *src)
{
    struct gg_touch_event *e = touch_events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gg_lost(1);
        return;
    }
    __builtin_memcpy(e, src, sizeof(*e));
    touch_events.ringbuf_submit(e, 0);
}

static __always_inline void gg_report_kill(struct gg_touch_event *src)
{
    struct gg_touch_event *e = touch_kills.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gg_lost(0);
        return;
    }
    __builtin_memcpy(e, src, sizeof(*e));
    touch_kills.ringbuf_submit(e, 0);
}

static __always_inline struct gg_touch_event *gg_event(__u32 tgid, __u32 reason, __u32 block)
{
    __u32 zero = 0;
    struct gg_touch_event *e = touch_scratch.lookup(&zero);
    if (!e)
        return 0;
    e->time_ns = bpf_ktime_get_boot_ns();
    e->tgid = tgid;
    __u32 *gen = touch_exit_gens.lookup(&tgid);
    e->exit_gen = gen ? *gen : 0;
    e->reason = reason;
    e->block = block;
    e->flags = 0;
    e->_pad = 0;
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
    struct gg_touch_entry *member = touch_tgids.lookup(&tgid);
    if (gg_live(member)) {
        /* One of a block's processes execs something new: reported so user space knows what
         * it runs now (the kill report names it); it stays blocked. */
        e->block = member->block;
        e->flags = member->flags;
        gg_report(e);
        return 0;
    }
    if (!gg_in_scope())
        return 0;               /* outside the response scope: never blocked, never reported */
    struct gg_touch_entry *blocked = touch_paths.lookup(&hash);
    if (gg_live(blocked)) {
        struct gg_touch_entry copy = *blocked;
        copy.added_ns = bpf_ktime_get_boot_ns();
        copy.flags = 0;         /* blocked by path: not the offender's own tree */
        touch_tgids.update(&tgid, &copy);
        e->block = copy.block;
        gg_report(e);
        return 0;
    }
    if (gg_setting(zero))
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
    __u64 id = bpf_get_current_pid_tgid();
    __u32 pid = (__u32)id;
    touch_tgids.delete(&pid);
    __u32 tgid = id >> 32;
#ifdef GG_EXIT_GROUP_DEAD
    int gone = args->group_dead;        /* the group's last thread */
#else
    int gone = pid == tgid;             /* the leader: the safe side on older kernels */
#endif
    if (gone) {
        __u32 *gen = touch_exit_gens.lookup(&tgid);
        if (gen)
            __sync_fetch_and_add(gen, 1);   /* before the pid can be reused */
    }
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
    if (!gg_in_scope())
        return 0;          /* it left the scope (moved cgroup): not ours to kill */
    __u32 block = blocked->block;
    __u32 flags = blocked->flags;
    struct gg_touch_event *e = gg_event(tgid, reason, block);
    if (!e)
        return 0;
    e->flags = flags;
    if (path) {
        if (bpf_probe_read_user_str(e->path, sizeof(e->path), path) < 0)
            return 0;
        if (!gg_is_gpu_path(e->path))
            return 0;
    }
    bpf_send_signal(GG_SIGKILL);
    gg_report_kill(e);
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
