/* maps.bpf.h - the maps every probe part shares, and the event output.
 *
 * Sizes come from compiler defines set by gpuguard/sources/sensor.py, so an
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

/* (tgid, fd) -> device class for every open GPU file descriptor. */
BPF_HASH(tracked_fds, struct gg_fd_key, struct gg_tracked_fd, GG_MAX_TRACKED_FDS);

/* (tgid, class, cmd) -> ioctls issued; cumulative, user space reports deltas. */
BPF_HASH(ioctl_counts, struct gg_ioctl_key, __u64, GG_MAX_IOCTL_KEYS);

/* (tgid, fd) of sockets the process connected recently -> writes left to
 * capture.  Only these writes are read; every other write costs one lookup. */
BPF_TABLE("lru_hash", struct gg_fd_key, __u32, fresh_sockets, GG_MAX_FRESH_SOCKETS);

/* Lost-event counters by enum gg_lost_slot. */
BPF_PERCPU_ARRAY(lost_counts, __u64, GG_LOST_SLOTS);

/* One-entry maps that exist only so user space gets each struct's layout
 * from bcc (table.Leaf) instead of redeclaring it. */
BPF_ARRAY(schema_header, struct gg_header, 1);
BPF_ARRAY(schema_gpu_open, struct gg_gpu_open, 1);
BPF_ARRAY(schema_connect, struct gg_connect, 1);
BPF_ARRAY(schema_net_payload, struct gg_net_payload, 1);
BPF_ARRAY(schema_exec, struct gg_exec, 1);
BPF_ARRAY(schema_exit, struct gg_exit, 1);

#ifdef GG_PERF_BUFFER
/* Kernels without BPF ring buffers (< 5.8): per-CPU scratch + perf buffer. */
BPF_PERF_OUTPUT(events);
BPF_PERCPU_ARRAY(scratch_gpu_open, struct gg_gpu_open, 1);
BPF_PERCPU_ARRAY(scratch_connect, struct gg_connect, 1);
BPF_PERCPU_ARRAY(scratch_net_payload, struct gg_net_payload, 1);
BPF_PERCPU_ARRAY(scratch_exec, struct gg_exec, 1);
BPF_PERCPU_ARRAY(scratch_exit, struct gg_exit, 1);
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

/* The fd is closed (or replaced): it no longer refers to a GPU or a fresh socket. */
static __always_inline void forget_fd(__u32 tgid, __s32 fd)
{
    struct gg_fd_key key = { .tgid = tgid, .fd = fd };
    tracked_fds.delete(&key);
    fresh_sockets.delete(&key);
}

#endif /* GG_MAPS_BPF_H */
