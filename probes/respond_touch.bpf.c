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
 * `scope: containers`).  Each placed block has its state in touch_blocks: an
 * entry acts only while its block is there and armed.  A lift deletes the
 * block's state and a tripped circuit breaker marks it suspended: one write, so
 * every entry of the block, and any a fork copies from it meanwhile, stops at
 * once.  A suspended block kills, blocks and is inherited by nothing until
 * user space re-arms it (`gpuguard unblock --rearm`).  Every report carries the pid's exit generation
 * (touch_exit_gens, bumped at exit) so user space opens a pidfd for exactly
 * the reported process.
 *
 * A kill report names its victim from touch_procs (what the process exec'd and
 * its argv, read at execve entry for the execs that can end up blocked: a
 * blocked process's, and those of a blocked path), since the victim is gone
 * before user space could read /proc.
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
#define GG_ARGS_MAX 32             /* argv entries read at an execve */

BPF_TABLE_PINNED("hash", __u64, struct gg_touch_entry, touch_paths, 1024, GG_PIN_ROOT "/maps/touch_paths");
BPF_TABLE_PINNED("hash", __u32, struct gg_touch_entry, touch_tgids, 8192, GG_PIN_ROOT "/maps/touch_tgids");
/* Block number -> its state, enum gg_touch_flag: 0 armed, GG_TOUCH_SUSPENDED its breaker tripped;
 * absent: lifted (or never placed), so its entries are dead. */
BPF_TABLE_PINNED("hash", __u32, __u32, touch_blocks, 4096, GG_PIN_ROOT "/maps/touch_blocks");
/* [0] = 1: report every exec (user space holds identities to match by inode/sha256);
 * [1] = 1: act only inside touch_scope; [2] = 1: touch_paths may hold entries. */
BPF_ARRAY(touch_settings, __u32, 3);
BPF_HASH(touch_scope, __u64, __u8, 1024);
BPF_ARRAY(touch_exit_gens, __u32, GG_PID_MAX);
BPF_PERCPU_ARRAY(touch_scratch, struct gg_touch_event, 1);
/* tgid -> what it runs, for its kill report (an LRU: an entry left by a failed exec ages out). */
BPF_TABLE_PINNED("lru_hash", __u32, struct gg_touch_proc, touch_procs, 8192, GG_PIN_ROOT "/maps/touch_procs");
/* argv is read in place: an argument at offset off (< GG_ARGS_LEN) may run GG_ARGS_LEN bytes on. */
struct gg_touch_proc_scratch {
    struct gg_touch_proc proc;
    char spill[GG_ARGS_LEN];
};
BPF_PERCPU_ARRAY(touch_proc_scratch, struct gg_touch_proc_scratch, 1);
/* Kills and exec reports go up on rings of their own, so a flood of execs can never crowd
 * out the report of a kill; a kill whose report found no room is still counted. */
BPF_RINGBUF_OUTPUT(touch_events, 64);
BPF_RINGBUF_OUTPUT(touch_kills, 64);
BPF_ARRAY(touch_lost, __u64, 2);        /* [0] kill reports, [1] exec reports without room */
/* Never written: exports struct gg_touch_event's layout to user space (bcc builds the ctypes class). */
BPF_ARRAY(schema_touch_event, struct gg_touch_event, 1);

/* An entry that may act: not expired, its block placed and armed (looked up only on a hit). */
static __always_inline int gg_live(struct gg_touch_entry *e)
{
    if (!e || (e->flags & GG_TOUCH_SUSPENDED))
        return 0;
    if (e->expires_ns != 0 && bpf_ktime_get_ns() >= e->expires_ns)
        return 0;
    __u32 block = e->block;
    __u32 *state = touch_blocks.lookup(&block);
    return state && !(*state & GG_TOUCH_SUSPENDED);
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
    e->proc.args_len = 0;
    e->proc.cut = 0;
    e->proc.exe[0] = 0;
    return e;
}

/* A report about a blocked process names what it runs (only those have a touch_procs entry). */
static __always_inline void gg_attach_proc(struct gg_touch_event *e, __u32 tgid)
{
    struct gg_touch_proc *proc = touch_procs.lookup(&tgid);
    if (proc)
        __builtin_memcpy(&e->proc, proc, sizeof(e->proc));
}

static __always_inline __u64 gg_path_hash(const char *path)
{
    __u64 hash = GG_FNV_OFFSET;
    for (int i = 0; i < GG_PATH_LEN; i++) {
        char c = path[i];
        if (c == 0)
            break;
        hash = (hash ^ (__u8)c) * GG_FNV_PRIME;
    }
    return hash;
}

/* At execve entry (the old image still mapped): keep argv of an exec that can end up blocked. */
static __always_inline int gg_keep_argv(const char *filename, const char *const *argv)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u32 zero = 0;
    struct gg_touch_proc_scratch *s = touch_proc_scratch.lookup(&zero);
    if (!s)
        return 0;
    if (!gg_live(touch_tgids.lookup(&tgid))) {
        if (!gg_setting(2))
            return 0;                   /* no path is blocked: the common case, one array read */
        if (bpf_probe_read_user_str(s->proc.exe, sizeof(s->proc.exe), filename) < 0)
            return 0;
        __u64 hash = gg_path_hash(s->proc.exe);
        if (!gg_live(touch_paths.lookup(&hash)))
            return 0;
    }
    __u32 off = 0;
    s->proc.cut = 0;
    for (int i = 0; i < GG_ARGS_MAX; i++) {
        const char *arg = 0;
        if (bpf_probe_read_user(&arg, sizeof(arg), &argv[i]) < 0 || !arg)
            break;
        if (off >= GG_ARGS_LEN || i == GG_ARGS_MAX - 1) {
            s->proc.cut = 1;
            break;
        }
        __u32 at = off;
        asm volatile("" : "+r"(at));    /* keep the mask: the verifier needs it, clang sees no use */
        at &= GG_ARGS_LEN - 1;
        int n = bpf_probe_read_user_str(&s->proc.args[at], GG_ARGS_LEN, arg);
        if (n <= 0)
            break;
        off += n;
    }
    if (off > GG_ARGS_LEN) {
        off = GG_ARGS_LEN;
        s->proc.cut = 1;
    }
    s->proc.args_len = off;
    s->proc.exe[0] = 0;                 /* set at sched_process_exec, if the exec succeeds */
    touch_procs.update(&tgid, &s->proc);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_execve)
{
    return gg_keep_argv(args->filename, args->argv);
}

TRACEPOINT_PROBE(syscalls, sys_enter_execveat)
{
    return gg_keep_argv(args->filename, args->argv);
}

/* The exec went through: the kept argv is this process's; note what it runs. */
static __always_inline void gg_note_exe(__u32 tgid, const char *path)
{
    struct gg_touch_proc *proc = touch_procs.lookup(&tgid);
    if (proc)
        bpf_probe_read_kernel_str(proc->exe, sizeof(proc->exe), path);
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
    __u64 hash = gg_path_hash(e->path);
    struct gg_touch_entry *member = touch_tgids.lookup(&tgid);
    if (gg_live(member)) {
        /* One of a block's processes execs something new: reported so user space knows what
         * it runs now (the kill report names it); it stays blocked. */
        gg_note_exe(tgid, e->path);
        gg_attach_proc(e, tgid);
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
        gg_note_exe(tgid, e->path);
        gg_attach_proc(e, tgid);
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
    struct gg_touch_proc *proc = touch_procs.lookup(&parent);
    if (proc)
        touch_procs.update(&child, proc);   /* a fork runs what its parent runs */
    return 0;
}

/* A blocked pid (or thread id) that exits leaves the map, so the number can
 * never block the unrelated process that gets it next. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 pid = (__u32)id;
    if (touch_tgids.delete(&pid) == 0)
        touch_procs.delete(&pid);       /* a blocked thread's own copy, from its clone */
    __u32 tgid = id >> 32;
#ifdef GG_EXIT_GROUP_DEAD
    int gone = args->group_dead;        /* the group's last thread */
#else
    int gone = pid == tgid;             /* the leader: the safe side on older kernels */
#endif
    if (gone) {
        touch_procs.delete(&tgid);
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
    gg_attach_proc(e, tgid);
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
