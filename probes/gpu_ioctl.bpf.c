/* gpu_ioctl.bpf.c - count ioctls on tracked GPU fds, in the kernel.
 *
 * One counter per (process, device class, command); user space drains the
 * counters on an interval instead of receiving one event per ioctl.  An ioctl
 * on any other fd costs one hash lookup.  NVIDIA's IOCTL_XFER_CMD wrapper
 * (escape 211) carries the real command in user memory: it is unwrapped here
 * so user space sees what the process actually asked for.
 */

#define GG_NV_IOCTL_MAGIC 0x46      /* 'F' */
#define GG_NV_ESC_IOCTL_XFER_CMD 211

struct gg_nv_ioctl_xfer {           /* nv_ioctl_xfer_t: UAPI-stable layout */
    __u32 cmd;
    __u32 size;
    __u64 ptr;
};

static __always_inline int is_nvidia_rm_class(__u32 c)
{
    return c == GG_DEV_NVIDIA || c == GG_DEV_NVIDIA_CTL || c == GG_DEV_NVIDIA_MODESET;
}

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct gg_fd_key fdkey = { .tgid = id >> 32, .fd = (__s32)args->fd };
    struct gg_tracked_fd *t = tracked_fds.lookup(&fdkey);
    if (!t)
        return 0;

    struct gg_ioctl_key key = {
        .tgid = fdkey.tgid,
        .device_class = t->device_class,
        .command = args->cmd,
    };
    if (is_nvidia_rm_class(t->device_class) &&
        ((args->cmd >> 8) & 0xff) == GG_NV_IOCTL_MAGIC &&
        (args->cmd & 0xff) == GG_NV_ESC_IOCTL_XFER_CMD) {
        struct gg_nv_ioctl_xfer xfer = {};
        if (bpf_probe_read_user(&xfer, sizeof(xfer), (void *)args->arg) == 0)
            key.command = GG_NV_XFER_FLAG | xfer.cmd;
    }

    __u64 *count = ioctl_counts.lookup(&key);
    if (count) {
        __sync_fetch_and_add(count, 1);
        return 0;
    }
    __u64 one = 1;
    if (ioctl_counts.insert(&key, &one) < 0) {
        /* Lost a race with another thread inserting the same key, or full. */
        count = ioctl_counts.lookup(&key);
        if (count)
            __sync_fetch_and_add(count, 1);
        else
            count_lost(GG_LOST_IOCTL_KEYS);
    }
    return 0;
}
