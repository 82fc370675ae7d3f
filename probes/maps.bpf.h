/* maps.bpf.h - the maps every probe part shares, and the event output.
 *
 * Sizes come from compiler defines set by gpuguard/sources/ebpf/sensor.py, so an
 * operator can tune them without editing C.
 */
#ifndef GG_MAPS_BPF_H
#define GG_MAPS_BPF_H

#ifndef GG_MAX_TRACKED_FDS
#define GG_MAX_TRACKED_FDS 65536
#endif
#ifndef GG_MAX_IOCTL_KEYS
#define GG_MAX_IOCTL_KEYS 65536
#endif
#ifndef GG_MAX_FRESH_SOCKETS
#define GG_MAX_FRESH_SOCKETS 16384
#endif
#ifndef GG_PAYLOAD_WRITES
#define GG_PAYLOAD_WRITES 4
#endif
#ifndef GG_RINGBUF_PAGES
#define GG_RINGBUF_PAGES 1024
#endif
#ifndef GG_FD_SLOTS
#define GG_FD_SLOTS 32768       /* power of two */
#endif

/* (tgid, fd) -> device class for every open GPU file descriptor. */
BPF_HASH(tracked_fds, struct gg_fd_key, struct gg_tracked_fd, GG_MAX_TRACKED_FDS);

/* (tgid, class, cmd) -> ioctls issued; cumulative, user space reports deltas. */
BPF_HASH(ioctl_counts, struct gg_ioctl_key, __u64, GG_MAX_IOCTL_KEYS);

/* (tgid, fd) of sockets the process connected recently -> writes left to
 * capture.  Only these writes are read; every other write costs one lookup. */
BPF_TABLE("lru_hash", struct gg_fd_key, __u32, fresh_sockets, GG_MAX_FRESH_SOCKETS);

#ifndef GG_MAX_WATCHED_CONNS
#define GG_MAX_WATCHED_CONNS 4096
#endif
/* Processes whose connections get an activity record: every GPU holder (set at its
 * first GPU open) plus those user space adds; bounded, user space removes the dead. */
BPF_HASH(watched_tgids, __u32, __u8, GG_MAX_WATCHED_CONNS);
#ifndef GG_ACTIVITY_SLOTS
#define GG_ACTIVITY_SLOTS 8192      /* power of two; a connection takes one of two neighbours */
#endif
/* A watched process's sockets -> their activity (gpuguard.h: "conn_activity is an array"). */
BPF_ARRAY(conn_activity, struct gg_conn_activity, GG_ACTIVITY_SLOTS);

/* Prefilters in front of tracked_fds and fresh_sockets (see "fd slots" in
 * gpuguard.h): an ioctl, write or close on an fd that is neither costs one
 * inlined array read instead of a hash lookup, and an ioctl on a tracked GPU
 * fd whose slot holds its tag gets the device class without one. */
BPF_ARRAY(gpu_fd_slots, __u64, GG_FD_SLOTS);
BPF_ARRAY(sock_fd_slots, __u64, GG_FD_SLOTS);

/* Lost-event counters by enum gg_lost_slot. */
BPF_PERCPU_ARRAY(lost_counts, __u64, GG_LOST_SLOTS);

/* Entries added to the maps user space walks, by enum gg_map_write. */
BPF_ARRAY(map_writes, __u64, GG_WRITE_SLOTS);

static __always_inline void count_write(__u32 slot)
{
    __u64 *n = map_writes.lookup(&slot);
    if (n)
        __sync_fetch_and_add(n, 1);
}

/* One-entry maps that exist only so user space gets each struct's layout
 * from bcc (table.Leaf) instead of redeclaring it. */
BPF_ARRAY(schema_header, struct gg_header, 1);
/* A process whose opens the probes do not look at (the agent itself; 0: none), set at load. */
BPF_ARRAY(ignore_tgid, __u32, 1);
BPF_ARRAY(schema_gpu_open, struct gg_gpu_open, 1);
BPF_ARRAY(schema_connect, struct gg_connect, 1);
BPF_ARRAY(schema_net_payload, struct gg_net_payload, 1);
BPF_ARRAY(schema_exec, struct gg_exec, 1);
BPF_ARRAY(schema_exit, struct gg_exit, 1);
BPF_ARRAY(schema_huge_alloc, struct gg_huge_alloc, 1);

#ifdef GG_PERF_BUFFER
/* Kernels without BPF ring buffers (< 5.8): one per-CPU scratch record + perf buffer. */
union gg_event_buf {
    struct gg_gpu_open gpu_open;
    struct gg_connect connect;
    struct gg_net_payload net_payload;
    struct gg_exec exec;
    struct gg_exit exit;
    struct gg_huge_alloc huge_alloc;
};
BPF_PERF_OUTPUT(events);
BPF_PERCPU_ARRAY(scratch_event, union gg_event_buf, 1);
#else
BPF_RINGBUF_OUTPUT(events, GG_RINGBUF_PAGES);
#endif

static __always_inline void count_lost(__u32 slot)
{
    __u64 *n = lost_counts.lookup(&slot);
    if (n)
        (*n)++;
}

static __always_inline void fill_header(struct gg_header *h, __u32 kind, __u32 size)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u64 ug = bpf_get_current_uid_gid();
    h->kind = kind;
    h->size = size;
    h->time_ns = bpf_ktime_get_boot_ns();
    h->pid = (__u32)id;
    h->tgid = id >> 32;
    h->uid = (__u32)ug;
    h->gid = ug >> 32;
    h->cgroup_id = bpf_get_current_cgroup_id();
    bpf_get_current_comm(&h->comm, sizeof(h->comm));
}

/* The one way every probe gets an event record: a ring-buffer reservation, or
 * (kernels without ring buffers) the per-CPU scratch record.  Returns the record
 * with its header filled, or NULL after counting LOST.  Functions, not macros:
 * bcc refuses map calls inside macros.  SIZE is a constant once inlined, as the
 * verifier requires. */
static __always_inline void *gg_event_reserve(__u32 size, __u32 kind, __u32 lost)
{
#ifdef GG_PERF_BUFFER
    __u32 zero = 0;
    struct gg_header *h = (struct gg_header *)scratch_event.lookup(&zero);
#else
    struct gg_header *h = events.ringbuf_reserve(size);
#endif
    if (!h) {
        count_lost(lost);
        return 0;
    }
    fill_header(h, kind, size);
    return h;
}

/* Send a record from gg_event_reserve (counting LOST if the perf buffer refuses it). */
static __always_inline void gg_event_submit(void *ctx, void *e, __u32 size, __u32 lost)
{
#ifdef GG_PERF_BUFFER
    if (events.perf_submit(ctx, e, size) < 0)
        count_lost(lost);
#else
    events.ringbuf_submit(e, 0);
#endif
}

/* Send a record built elsewhere (a map value, a per-CPU scratch record); counts LOST when
 * the buffer refuses it.  SIZE is a constant once inlined. */
static __always_inline int gg_event_output(void *ctx, void *rec, __u32 size, __u32 lost)
{
#ifdef GG_PERF_BUFFER
    if (events.perf_submit(ctx, rec, size) < 0) {
#else
    if (events.ringbuf_output(rec, size, 0) < 0) {
#endif
        count_lost(lost);
        return -1;
    }
    return 0;
}

/* Low-priority records (exits, execs sent up only because exec_pending was full) may use at
 * most GG_LOW_RATE records per second per CPU (a token bucket, bursts of as many): what a
 * flood of them would take from the ring stays free for GPU, network and exec-of-interest
 * records, which are never rate-limited.  Returns 1 when this record must be shed. */
#ifndef GG_LOW_RATE
#define GG_LOW_RATE 2000
#endif
struct gg_low_bucket {
    __u64 last_ns;
    __u64 tokens;
};
BPF_PERCPU_ARRAY(low_bucket, struct gg_low_bucket, 1);

static __always_inline int gg_shed_low(void)
{
    __u32 zero = 0;
    struct gg_low_bucket *b = low_bucket.lookup(&zero);
    if (!b)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    __u64 earned = (now - b->last_ns) / (1000000000ULL / GG_LOW_RATE);
    if (earned) {
        __u64 t = b->tokens + earned;
        b->tokens = t > GG_LOW_RATE ? GG_LOW_RATE : t;
        b->last_ns = now;
    }
    if (!b->tokens)
        return 1;
    b->tokens--;
    return 0;
}

/* ==== exec filter (GG_EXEC_FILTER: the agent's sensor) ====
 * An exec goes up in full only for a process that matters: one in exec_interest (a GPU holder
 * and its tree, one that connected, one user space marked), or whose executable's basename
 * hashes into exec_names (program names the rules look for).  Any other exec is kept here, in
 * exec_pending, and counted per cgroup in exec_aggregated (a process forked by a pending one
 * waits here too, uncounted: task_newtask in process.bpf.c).  When the process exits first (the
 * short-lived majority) nothing goes up, not even its exit.  A pending process that connects,
 * opens a GPU or asks for huge pages has its exec sent up at once, before that event
 * (gg_exec_promote); user space sends up those still alive after a short age (a short exec
 * that turns into a long-lived spinner), so no process that lives hides. */
#ifndef GG_EXEC_PENDING
#define GG_EXEC_PENDING 16384
#endif
#ifndef GG_EXEC_INTEREST
#define GG_EXEC_INTEREST 16384
#endif
#ifndef GG_EXEC_NAMES
#define GG_EXEC_NAMES 4096
#endif
#ifndef GG_EXEC_CGROUPS
#define GG_EXEC_CGROUPS 4096
#endif
#define GG_FNV_OFFSET 0xcbf29ce484222325ULL
#define GG_FNV_PRIME 0x100000001b3ULL

#ifdef GG_EXEC_FILTER
/* tgid -> its exec record, not yet sent up (a plain hash: never evicts a live process). */
BPF_HASH(exec_pending, __u32, struct gg_exec, GG_EXEC_PENDING);
/* tgid (or tid: a thread forked by a member) -> enum gg_exec_interest flags. */
BPF_TABLE("lru_hash", __u32, __u8, exec_interest, GG_EXEC_INTEREST);
/* FNV-1a 64 of a lower-cased basename ("xmrig") -> 1. */
BPF_HASH(exec_names, __u64, __u8, GG_EXEC_NAMES);
/* cgroup id -> execs kept in the kernel (cumulative; user space reads deltas). */
BPF_HASH(exec_aggregated, __u64, __u64, GG_EXEC_CGROUPS);
BPF_ARRAY(exec_filter_counts, __u64, GG_EXECF_SLOTS);
BPF_PERCPU_ARRAY(exec_scratch, struct gg_exec, 1);
/* 1 while user space sleeps with exec_pending known empty (it set it after a walk found the map
 * empty): the next entry kept clears it and sends a header-only GG_KIND_WAKE record, so an idle
 * sensor need not wake on a timer to notice a kept exec (and a busy one is never woken for it).
 * Two CPUs may both see 1 and send one each: harmless. */
BPF_ARRAY(exec_wake, __u32, 1);

static __always_inline void exec_filter_count(__u32 slot)
{
    __u64 *n = exec_filter_counts.lookup(&slot);
    if (n)
        __sync_fetch_and_add(n, 1);
}

/* An entry was written to exec_pending: count it (user space's walk watches the count), and wake
 * user space if it sleeps on an empty map. */
static __always_inline void exec_pending_added(void *ctx)
{
    exec_filter_count(GG_EXECF_PENDING_ADDED);
    __u32 zero = 0;
    __u32 *wake = exec_wake.lookup(&zero);
    if (!wake || !*wake)
        return;
    *wake = 0;
    struct gg_header *h = gg_event_reserve(sizeof(*h), GG_KIND_WAKE, GG_LOST_EXEC);
    if (h)
        gg_event_submit(ctx, h, sizeof(*h), GG_LOST_EXEC);
}
#endif

static __always_inline void exec_mark(__u32 tgid, __u8 flags)
{
#ifdef GG_EXEC_FILTER
    __u8 *f = exec_interest.lookup(&tgid);
    if (f && (*f & flags) == flags)
        return;
    __u8 v = f ? (*f | flags) : flags;
    exec_interest.update(&tgid, &v);
#endif
}

/* TGID is about to be seen doing something that matters: send up its pending exec first. */
static __always_inline void gg_exec_promote(void *ctx, __u32 tgid)
{
#ifdef GG_EXEC_FILTER
    struct gg_exec *p = exec_pending.lookup(&tgid);
    if (!p)
        return;
    if (gg_event_output(ctx, p, sizeof(*p), GG_LOST_EXEC) == 0)
        exec_filter_count(GG_EXECF_PROMOTED);
    exec_pending.delete(&tgid);
#endif
}
/* ==== end exec filter ==== */

/* What a slot says about (tgid, fd). */
#define GG_SLOT_ABSENT 0        /* not in the map: skip it */
#define GG_SLOT_ASK 0x100       /* may be in the map: look */
/* 1..254: exactly this fd, with that value (device class / 1) */

static __always_inline __u32 gg_slot_index(__u32 tgid, __s32 fd)
{
    return (tgid * (__u32)GG_SLOT_HASH_MUL + (__u32)fd) & (GG_FD_SLOTS - 1);
}

static __always_inline int gg_slot_taggable(__u32 tgid, __s32 fd)
{
    return fd >= 0 && fd < (1 << GG_SLOT_FD_BITS) && tgid < (1U << GG_SLOT_TGID_BITS);
}

static __always_inline __u64 gg_slot_tag(__u32 tgid, __s32 fd)
{
    return (((__u64)tgid << GG_SLOT_FD_BITS) | (__u32)fd) << 8;
}

static __always_inline __u32 gg_slot_match(__u64 v, __u32 tgid, __s32 fd)
{
    if (v == 0)
        return GG_SLOT_ABSENT;
    if (v == GG_SLOT_MULTI)
        return GG_SLOT_ASK;
    /* A tag is never written for an untaggable fd (it gets MULTI), and its
     * bits could alias another (tgid, fd): never compare those. */
    if (!gg_slot_taggable(tgid, fd) || (v & ~0xffULL) != gg_slot_tag(tgid, fd))
        return GG_SLOT_ABSENT;
    return (__u32)(v & 0xff);
}

/* Publish (tgid, fd) -> value in a slot.  Call after the map update, so a
 * slot that is read as "absent" never hides an entry (user-space rebuilds
 * rely on that order too). */
static __always_inline void gg_slot_publish(__u64 *s, __u32 tgid, __s32 fd, __u32 value)
{
    __u64 want = gg_slot_taggable(tgid, fd) ? (gg_slot_tag(tgid, fd) | value) : GG_SLOT_MULTI;
    __u64 old = __sync_val_compare_and_swap(s, 0, want);
    if (old == 0 || old == want || old == GG_SLOT_MULTI)
        return;
    if (want != GG_SLOT_MULTI && (old & ~0xffULL) == (want & ~0xffULL) &&
        __sync_val_compare_and_swap(s, old, want) == old)
        return;                 /* same fd, new value (reopened without close) */
    *s = GG_SLOT_MULTI;         /* another fd is there: both must ask the map */
}

static __always_inline void gpu_slot_publish(__u32 tgid, __s32 fd, __u32 device_class)
{
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = gpu_fd_slots.lookup(&i);
    if (s)
        gg_slot_publish(s, tgid, fd, device_class);
}

static __always_inline void sock_slot_publish(__u32 tgid, __s32 fd)
{
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = sock_fd_slots.lookup(&i);
    if (s)
        gg_slot_publish(s, tgid, fd, 1);
}

/* GG_SLOT_ABSENT, GG_SLOT_ASK or the device class. */
static __always_inline __u32 gpu_slot_get(__u32 tgid, __s32 fd)
{
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = gpu_fd_slots.lookup(&i);
    return s ? gg_slot_match(*s, tgid, fd) : GG_SLOT_ASK;
}

static __always_inline __u32 sock_slot_get(__u32 tgid, __s32 fd)
{
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = sock_fd_slots.lookup(&i);
    return s ? gg_slot_match(*s, tgid, fd) : GG_SLOT_ASK;
}

/* The fd left fresh_sockets: give its slot back if it still holds its tag. */
static __always_inline void sock_slot_release(__u32 tgid, __s32 fd)
{
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = sock_fd_slots.lookup(&i);
    if (!s)
        return;
    __u64 v = *s;
    if (v != 0 && v != GG_SLOT_MULTI && gg_slot_match(v, tgid, fd) != GG_SLOT_ABSENT)
        __sync_val_compare_and_swap(s, v, 0);
}

static __always_inline __u64 gg_activity_owner(__u32 tgid, __s32 fd)
{
    return ((__u64)tgid << 32) | (__u32)fd;
}

/* The first of the two conn_activity slots (tgid, fd) may live in. */
static __always_inline __u32 gg_activity_index(__u32 tgid, __s32 fd)
{
    return (tgid * (__u32)GG_SLOT_HASH_MUL + (__u32)fd) & (GG_ACTIVITY_SLOTS - 2);
}

/* The activity record of (tgid, fd), or NULL. */
static __always_inline struct gg_conn_activity *activity_find(__u32 tgid, __s32 fd)
{
    __u64 owner = gg_activity_owner(tgid, fd);
    __u32 i = gg_activity_index(tgid, fd);
    struct gg_conn_activity *a = conn_activity.lookup(&i);
    if (a && a->owner == owner)
        return a;
    i += 1;
    a = conn_activity.lookup(&i);
    if (a && a->owner == owner)
        return a;
    return 0;
}

/* A watched process connected fd: give it a fresh record in a free slot of its two
 * (or the one it already had: a reconnect on the same fd), else count it lost. */
static __always_inline void activity_claim(__u32 tgid, __s32 fd)
{
    __u64 owner = gg_activity_owner(tgid, fd);
    __u32 i = gg_activity_index(tgid, fd);
    struct gg_conn_activity *a = 0;
    for (int k = 0; k < 2; k++, i++) {
        struct gg_conn_activity *c = conn_activity.lookup(&i);
        if (!c)
            continue;
        if (c->owner == owner || __sync_val_compare_and_swap(&c->owner, 0, owner) == 0) {
            a = c;
            break;
        }
    }
    if (!a) {
        count_lost(GG_LOST_ACTIVITY);
        return;
    }
    count_write(GG_WRITE_ACTIVITY);
    a->start_ns = bpf_ktime_get_boot_ns();
    a->last_ns = 0;
    a->last_jiffies = 0;
    a->bytes_out = 0;
    a->writes_out = 0;
    a->small_writes = 0;
    for (int k = 0; k < GG_ACTIVITY_TIMES; k++)
        a->small_ns[k] = 0;
}

/* The connection is closed: free its slot. */
static __always_inline void activity_release(__u32 tgid, __s32 fd)
{
    struct gg_conn_activity *a = activity_find(tgid, fd);
    if (a)
        __sync_val_compare_and_swap(&a->owner, gg_activity_owner(tgid, fd), 0);
}

/* The fd is closed (or replaced): it no longer refers to a GPU or a fresh
 * socket.  The slots make this free for every other fd. */
static __always_inline void forget_fd(__u32 tgid, __s32 fd)
{
    struct gg_fd_key key = { .tgid = tgid, .fd = fd };
    __u32 i = gg_slot_index(tgid, fd);
    __u64 *s = gpu_fd_slots.lookup(&i);
    if (s) {
        __u64 v = *s;
        __u32 st = gg_slot_match(v, tgid, fd);
        if (st != GG_SLOT_ABSENT) {
            tracked_fds.delete(&key);
            if (st != GG_SLOT_ASK)
                __sync_val_compare_and_swap(s, v, 0);
        }
    }
    s = sock_fd_slots.lookup(&i);
    if (s) {
        __u64 v = *s;
        __u32 st = gg_slot_match(v, tgid, fd);
        if (st != GG_SLOT_ABSENT) {
            fresh_sockets.delete(&key);
            activity_release(tgid, fd);
            if (st != GG_SLOT_ASK)
                __sync_val_compare_and_swap(s, v, 0);
        }
    }
}

#endif /* GG_MAPS_BPF_H */
