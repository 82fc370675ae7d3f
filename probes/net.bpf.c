/* net.bpf.c - where processes connect, and the first bytes they send there.
 *
 * Every IPv4/IPv6 connect(2) becomes a connect event (the correlator decides
 * what matters).  A connect that succeeds or is in progress marks the socket
 * "fresh": its first GG_PAYLOAD_WRITES writes/sends are copied (up to
 * GG_PAYLOAD_LEN bytes each) as net_payload events, then it is forgotten.
 * Writes on any other fd cost one inlined array read (sock_fd_slots).
 * A process that holds a GPU (watched_tgids) also gets an activity record per
 * connection (conn_activity): bytes and writes out, the times of its latest small
 * writes, its age; user space reads it on an interval (sources/net/conn_activity.py).
 */

#define GG_AF_INET 2
#define GG_AF_INET6 10
#define GG_EINPROGRESS 115

struct gg_pending_connect {
    __s32 fd;
    __u16 family;
    __u16 port;
    __u8 addr[16];
};

BPF_TABLE("lru_hash", __u64, struct gg_pending_connect, pending_connects, 4096);

/* struct iovec and the start of struct msghdr as user space lays them out
 * (LP64); only UAPI-visible layouts are read. */
struct gg_iovec {
    __u64 base;
    __u64 len;
};

struct gg_user_msghdr {
    __u64 msg_name;
    __u32 msg_namelen;
    __u32 _pad;
    __u64 msg_iov;
    __u64 msg_iovlen;
};

static __always_inline int connect_enter(__s32 fd, const char *uservaddr)
{
    __u16 family = 0;
    if (bpf_probe_read_user(&family, sizeof(family), uservaddr) < 0)
        return 0;
    if (family != GG_AF_INET && family != GG_AF_INET6)
        return 0;
    struct gg_pending_connect pc = { .fd = fd, .family = family };
    __u16 port_be = 0;
    /* sin_port and sin6_port both sit at offset 2. */
    bpf_probe_read_user(&port_be, sizeof(port_be), (char *)uservaddr + 2);
    pc.port = (port_be >> 8) | ((port_be & 0xff) << 8);
    if (family == GG_AF_INET)
        bpf_probe_read_user(pc.addr, 4, (char *)uservaddr + 4);   /* sin_addr */
    else
        bpf_probe_read_user(pc.addr, 16, (char *)uservaddr + 8);  /* sin6_addr */
    __u64 id = bpf_get_current_pid_tgid();
    pending_connects.update(&id, &pc);
    return 0;
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_connect)
{
    return connect_enter(args->fd, (const char *)args->uservaddr);
}
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_connect)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_pending_connect *pc = pending_connects.lookup(&id);
    if (!pc)
        return 0;
    long ret = args->ret;

#ifdef GG_PAYLOAD_CAPTURE
    if (ret == 0 || ret == -GG_EINPROGRESS) {
        struct gg_fd_key key = { .tgid = id >> 32, .fd = pc->fd };
        __u32 writes = GG_PAYLOAD_WRITES;
        if (fresh_sockets.update(&key, &writes) == 0)
            sock_slot_publish(key.tgid, key.fd);
        if (watched_tgids.lookup(&key.tgid))
            activity_claim(key.tgid, key.fd);
    }
#endif
    exec_mark(id >> 32, GG_INTEREST_NET);      /* its later execs go up in full */
    gg_exec_promote(args, id >> 32);           /* its exec first, if still pending */

    struct gg_connect *e = gg_event_reserve(sizeof(*e), GG_KIND_CONNECT, GG_LOST_CONNECT);
    if (!e) {
        pending_connects.delete(&id);
        return 0;
    }
    e->fd = pc->fd;
    e->result = (__s32)ret;
    e->family = pc->family;
    e->port = pc->port;
    e->_pad = 0;
    __builtin_memcpy(e->addr, pc->addr, sizeof(e->addr));
    gg_event_submit(args, e, sizeof(*e), GG_LOST_CONNECT);
    pending_connects.delete(&id);
    return 0;
}

#ifdef GG_PAYLOAD_CAPTURE
/* A write on a watched connection: count it, and keep the time of a small one.
 * Returns its writes so far (0: not watched).  The clock is read only on the first
 * write of a jiffy (bpf_jiffies64 is a plain load): a socket-heavy process pays it
 * once a tick, a pool's share every 15-60 s gets its exact time. */
static __always_inline __u32 note_activity(struct gg_fd_key *key, __u64 len)
{
    struct gg_conn_activity *a = activity_find(key->tgid, key->fd);
    if (!a)
        return 0;
    __u64 jiffies = bpf_jiffies64();
    if (jiffies != a->last_jiffies) {
        a->last_jiffies = jiffies;
        a->last_ns = bpf_ktime_get_boot_ns();
    }
    __sync_fetch_and_add(&a->bytes_out, len);
    __sync_fetch_and_add(&a->writes_out, 1);
    if (len <= GG_SMALL_WRITE_BYTES) {
        /* Not atomic (old BPF cannot use a fetch-add's result): two threads writing on
         * one socket at the same instant may keep one time; the count is a lower bound. */
        __u32 n = a->small_writes;
        a->small_ns[n & (GG_ACTIVITY_TIMES - 1)] = a->last_ns;
        a->small_writes = n + 1;
    }
    return a->writes_out;
}

static __always_inline int capture_write(void *ctx, __s32 fd, __u64 buf, __u64 len)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_fd_key key = { .tgid = id >> 32, .fd = fd };
    if (sock_slot_get(key.tgid, fd) == GG_SLOT_ABSENT)
        return 0;
    __u32 watched = note_activity(&key, len);
    if (watched > GG_PAYLOAD_WRITES)
        return 0;           /* its first writes were captured long ago: no second lookup */
    __u32 *left = fresh_sockets.lookup(&key);
    if (!left)
        return 0;
    __u32 seq = GG_PAYLOAD_WRITES - *left;
    if (*left <= 1) {
        fresh_sockets.delete(&key);
        if (!watched)       /* a watched connection keeps its slot: its writes still count */
            sock_slot_release(key.tgid, fd);
    } else
        __sync_fetch_and_add(left, -1);

    struct gg_net_payload *e = gg_event_reserve(sizeof(*e), GG_KIND_NET_PAYLOAD, GG_LOST_NET_PAYLOAD);
    if (!e)
        return 0;
    __u32 n = len > GG_PAYLOAD_LEN ? GG_PAYLOAD_LEN : (__u32)len;
    e->fd = fd;
    e->seq = seq;
    e->orig_len = len > 0xffffffffULL ? 0xffffffff : (__u32)len;
    e->len = 0;
    if (n > 0 && n <= GG_PAYLOAD_LEN &&
        bpf_probe_read_user(e->data, n, (void *)buf) == 0)
        e->len = n;
    gg_event_submit(ctx, e, sizeof(*e), GG_LOST_NET_PAYLOAD);
    return 0;
}

static __always_inline int capture_iov(void *ctx, __s32 fd, __u64 iov, __u64 iovlen)
{
    if (iovlen == 0)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_fd_key key = { .tgid = id >> 32, .fd = fd };
    if (sock_slot_get(key.tgid, fd) == GG_SLOT_ABSENT)
        return 0;
    if (!fresh_sockets.lookup(&key) && !activity_find(key.tgid, key.fd))
        return 0;
    struct gg_iovec first = {};
    if (bpf_probe_read_user(&first, sizeof(first), (void *)iov) < 0)
        return 0;
    return capture_write(ctx, fd, first.base, first.len);
}

static __always_inline int sendmsg_enter(void *ctx, __s32 fd, const void *msg)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_fd_key key = { .tgid = id >> 32, .fd = fd };
    if (sock_slot_get(key.tgid, key.fd) == GG_SLOT_ABSENT)
        return 0;
    if (!fresh_sockets.lookup(&key) && !activity_find(key.tgid, key.fd))
        return 0;
    struct gg_user_msghdr mh = {};
    if (bpf_probe_read_user(&mh, sizeof(mh), msg) < 0)
        return 0;
    return capture_iov(ctx, fd, mh.msg_iov, mh.msg_iovlen);
}

#ifndef GG_RAW_SYS_ENTER
TRACEPOINT_PROBE(syscalls, sys_enter_write)
{
    return capture_write(args, (__s32)args->fd, (__u64)args->buf, args->count);
}

TRACEPOINT_PROBE(syscalls, sys_enter_sendto)
{
    return capture_write(args, args->fd, (__u64)args->buff, args->len);
}

TRACEPOINT_PROBE(syscalls, sys_enter_writev)
{
    return capture_iov(args, (__s32)args->fd, (__u64)args->vec, args->vlen);
}

TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg)
{
    return sendmsg_enter(args, args->fd, args->msg);
}
#endif
#endif /* GG_PAYLOAD_CAPTURE */
