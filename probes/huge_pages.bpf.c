/* huge_pages.bpf.c - huge-page allocations: mmap(MAP_HUGETLB) and shmget(SHM_HUGETLB).
 *
 * RandomX CPU miners allocate their dataset (~2 GiB) and cache (256 MiB) in huge
 * pages, 1 GiB pages when they can; nothing else about them needs a string.  The
 * filter is the flag test here, in the kernel: every other mmap costs the
 * tracepoint and one AND.  The request is reported at entry, so one the kernel
 * refuses (no huge pages reserved: ENOMEM) is seen too.
 */

#define GG_MAP_HUGETLB 0x40000      /* uapi asm-generic/mman-common.h */
#define GG_SHM_HUGETLB 04000        /* uapi linux/shm.h */
#define GG_HUGE_SHIFT 26            /* MAP_HUGE_SHIFT == SHM_HUGE_SHIFT */
#define GG_HUGE_MASK 0x3f

static __always_inline int huge_alloc(void *ctx, __u32 source, __u64 length, __u64 flags)
{
    gg_exec_promote(ctx, bpf_get_current_pid_tgid() >> 32);   /* its exec first, if still pending */
    struct gg_huge_alloc *e = gg_event_reserve(sizeof(*e), GG_KIND_HUGE_ALLOC, GG_LOST_HUGE_ALLOC);
    if (!e)
        return 0;
    e->length = length;
    e->flags = flags;
    e->source = source;
    e->page_shift = (flags >> GG_HUGE_SHIFT) & GG_HUGE_MASK;
    gg_event_submit(ctx, e, sizeof(*e), GG_LOST_HUGE_ALLOC);
    return 0;
}

static __always_inline int mmap_enter(void *ctx, __u64 length, __u64 flags)
{
    if (!(flags & GG_MAP_HUGETLB))
        return 0;
    return huge_alloc(ctx, GG_HUGE_MMAP, length, flags);
}

static __always_inline int shmget_enter(void *ctx, __u64 size, __u64 shmflg)
{
    if (!(shmflg & GG_SHM_HUGETLB))
        return 0;
    return huge_alloc(ctx, GG_HUGE_SHMGET, size, (__u32)shmflg);
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    return mmap_enter(args, args->len, args->flags);
}

TRACEPOINT_PROBE(syscalls, sys_enter_shmget)
{
    return shmget_enter(args, args->size, args->shmflg);
}
#endif
