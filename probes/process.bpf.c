/* process.bpf.c - process exec and exit, so user space can attach facts and clean up.
 *
 * exit_group(2)'s code is remembered per process so the exit event can carry
 * it; processes killed by a signal report -1.
 */

BPF_TABLE("lru_hash", __u32, __s32, exit_codes, 8192);
/* Exit generation per pid (see gg_exec.exit_gen in gpuguard.h). */
BPF_ARRAY(exit_gens, __u32, GG_PID_MAX);

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
    struct gg_exit *e = gg_event_reserve(sizeof(*e), GG_KIND_EXIT, GG_LOST_EXIT);
    if (!e)
        return 0;
    e->exit_code = code;
    e->_pad = 0;
    gg_event_submit(args, e, sizeof(*e), GG_LOST_EXIT);
    return 0;
}
