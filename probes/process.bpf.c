/* process.bpf.c - process exec and exit, so user space can attach facts and clean up.
 *
 * exit_group(2)'s code is remembered per process so the exit event can carry
 * it; processes killed by a signal report -1.
 */

BPF_TABLE("lru_hash", __u32, __s32, exit_codes, 8192);
/* Exit generation per pid (see gg_exec.exit_gen in gpuguard.h). */
BPF_ARRAY(exit_gens, __u32, GG_PID_MAX);

#ifdef GG_EXEC_FILTER
/* Does an exec of PATH by TGID go up in full?  (See "exec filter" in maps.bpf.h.)  One pass
 * over the path hashes its lower-cased basename. */
static __always_inline int exec_matters(__u32 tgid, const char *path)
{
    if (exec_interest.lookup(&tgid))
        return 1;
    __u64 base = GG_FNV_OFFSET;
    for (int i = 0; i < GG_PATH_LEN; i++) {
        __u8 c = path[i];
        if (c == 0)
            break;
        if (c == '/') {
            base = GG_FNV_OFFSET;
        } else {
            __u8 lower = (c >= 'A' && c <= 'Z') ? c + 32 : c;
            base = (base ^ lower) * GG_FNV_PRIME;
        }
    }
    return exec_names.lookup(&base) != 0;
}

static __always_inline void exec_aggregate(__u64 cgroup_id)
{
    __u64 *n = exec_aggregated.lookup(&cgroup_id);
    if (!n) {
        __u64 zero = 0;
        exec_aggregated.insert(&cgroup_id, &zero);   /* fails when full, or a racing insert won */
        n = exec_aggregated.lookup(&cgroup_id);
        if (!n) {
            exec_filter_count(GG_EXECF_CGROUPS_FULL);
            return;
        }
    }
    __sync_fetch_and_add(n, 1);
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    __u32 zero = 0;
    struct gg_exec *e = exec_scratch.lookup(&zero);
    if (!e)
        return 0;
    fill_header(&e->hdr, GG_KIND_EXEC, sizeof(*e));
    e->ppid = 0;
    __u32 tgid = e->hdr.tgid;
    __u32 *gen = exit_gens.lookup(&tgid);
    e->exit_gen = gen ? *gen : 0;
    __u32 off = args->data_loc_filename & 0xFFFF;
    bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), (char *)args + off);
    if (exec_matters(tgid, e->filename)) {
        exec_pending.delete(&tgid);         /* an earlier exec of this process is superseded */
        gg_event_output(args, e, sizeof(*e), GG_LOST_EXEC);
        return 0;
    }
    struct gg_exec *old = exec_pending.lookup(&tgid);
    if (old)
        e->hdr.time_ns = old->hdr.time_ns;  /* a re-exec keeps its age: promoted as soon */
    if (exec_pending.update(&tgid, e) == 0) {
        exec_pending_added(args);
        exec_aggregate(e->hdr.cgroup_id);
        return 0;
    }
    exec_filter_count(GG_EXECF_PENDING_FULL);
    if (gg_shed_low()) {                    /* low priority: shed before anything that matters */
        count_lost(GG_LOST_EXEC);
        return 0;
    }
    gg_event_output(args, e, sizeof(*e), GG_LOST_EXEC);
    return 0;
}

#define GG_CLONE_THREAD 0x00010000ULL
#define GG_CLONE_INTO_CGROUP 0x200000000ULL

/* A new task (current is its parent).  A child forked by a GPU holder's tree (or a process user
 * space marked) is in it too.  A process forked by one whose exec is pending (user space knows
 * nothing of it) waits in exec_pending as well, as a copy of that exec record (its image and
 * command line are its parent's until it execs): the subshells of `sh -c 'a | b'` and the forks
 * of a short program then end without a record, like their parent, and one that lives, connects
 * or opens a GPU goes up as a pending exec does.  Not a thread, and not a child placed in
 * another cgroup (clone3's CLONE_INTO_CGROUP: the record's cgroup would be its parent's): their
 * ends go up as before. */
TRACEPOINT_PROBE(task, task_newtask)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u32 child = args->pid;
    __u8 *f = exec_interest.lookup(&tgid);
    if (f) {
        if (*f & (GG_INTEREST_GPU | GG_INTEREST_TREE | GG_INTEREST_USER)) {
            __u8 v = GG_INTEREST_TREE;
            exec_interest.update(&child, &v);
        }
        return 0;
    }
    if (args->clone_flags & (GG_CLONE_THREAD | GG_CLONE_INTO_CGROUP))
        return 0;
    struct gg_exec *parent = exec_pending.lookup(&tgid);
    if (!parent)
        return 0;
    __u32 zero = 0;
    struct gg_exec *e = exec_scratch.lookup(&zero);
    if (!e)
        return 0;
    __builtin_memcpy(e, parent, sizeof(*e));
    e->hdr.time_ns = bpf_ktime_get_boot_ns();   /* its own age */
    e->hdr.pid = child;
    e->hdr.tgid = child;
    e->ppid = tgid;
    __u32 *gen = exit_gens.lookup(&child);
    e->exit_gen = gen ? *gen : 0;
    if (exec_pending.update(&child, e) == 0)
        exec_pending_added(args);
    return 0;
}
#else
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct gg_exec *e = gg_event_reserve(sizeof(*e), GG_KIND_EXEC, GG_LOST_EXEC);
    if (!e)
        return 0;
    e->ppid = 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u32 *gen = exit_gens.lookup(&tgid);
    e->exit_gen = gen ? *gen : 0;
    /* __data_loc: low 16 bits are the offset of the string in the record. */
    __u32 off = args->data_loc_filename & 0xFFFF;
    bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), (char *)args + off);
    gg_event_submit(args, e, sizeof(*e), GG_LOST_EXEC);
    return 0;
}
#endif

static __always_inline int exit_group_enter(__s32 code)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    exit_codes.update(&tgid, &code);
    return 0;
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    return exit_group_enter(args->error_code);
}
#endif

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
#ifdef GG_EXIT_GROUP_DEAD
    /* The group's last thread: the process is gone (a leader that called pthread_exit left
     * before its workers, so the generation moves now, not then: a miner cannot look exited). */
    if (args->group_dead) {
        __u32 *gen = exit_gens.lookup(&tgid);
        if (gen)
            __sync_fetch_and_add(gen, 1);   /* before the pid can be reused */
    }
#endif
#ifdef GG_EXEC_FILTER
    __u32 task = (__u32)id;
    exec_interest.delete(&task);    /* a member (process or thread) is gone */
#endif
    if ((__u32)id != tgid)
        return 0;   /* a thread, not the process */
#ifndef GG_EXIT_GROUP_DEAD
    __u32 *gen = exit_gens.lookup(&tgid);
    if (gen)
        __sync_fetch_and_add(gen, 1);   /* the leader's exit: the safe side on older kernels */
#endif
    __s32 code = -1;
    __s32 *saved = exit_codes.lookup(&tgid);
    if (saved) {
        code = *saved;
        exit_codes.delete(&tgid);
    }
#ifdef GG_EXEC_FILTER
    if (exec_pending.delete(&tgid) == 0)
        return 0;   /* its exec never went up: user space knows nothing to forget */
    if (gg_shed_low()) {
        count_lost(GG_LOST_EXIT);
        return 0;
    }
#endif
    struct gg_exit *e = gg_event_reserve(sizeof(*e), GG_KIND_EXIT, GG_LOST_EXIT);
    if (!e)
        return 0;
    e->exit_code = code;
    e->_pad = 0;
    gg_event_submit(args, e, sizeof(*e), GG_LOST_EXIT);
    return 0;
}
