/* gpu_ioctl.bpf.c - count ioctls on tracked GPU fds, in the kernel.
 *
 * One counter per (process, device class, command); user space drains the
 * counters on an interval instead of receiving one event per ioctl.  An ioctl
 * on any other fd costs one inlined array read (gpu_fd_slots); one on a
 * tracked fd whose slot holds its tag costs that read plus one hash lookup
 * (the slot carries the device class, so tracked_fds is not consulted).
 * NVIDIA's IOCTL_XFER_CMD wrapper (escape 211) carries the real command in
 * user memory: it is unwrapped here so user space sees what the process
 * actually asked for.
 *
 * Hooked at syscalls:sys_enter_ioctl, or from raw_enter.bpf.c when
 * ProbeSettings.enter_hook is "raw" (GG_RAW_SYS_ENTER).
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

static __always_inline int count_ioctl(__u32 tgid, __s32 fd, __u32 cmd, __u64 arg)
{
    __u32 device_class = gpu_slot_get(tgid, fd);
    if (device_class == GG_SLOT_ABSENT)
        return 0;
    if (device_class == GG_SLOT_ASK) {
        struct gg_fd_key fdkey = { .tgid = tgid, .fd = fd };
        struct gg_tracked_fd *t = tracked_fds.lookup(&fdkey);
        if (!t)
            return 0;
        device_class = t->device_class;
    }

    struct gg_ioctl_key key = {
        .tgid = tgid,
        .device_class = device_class,
        .command = cmd,
    };
    if (is_nvidia_rm_class(device_class) &&
        ((cmd >> 8) & 0xff) == GG_NV_IOCTL_MAGIC &&
        (cmd & 0xff) == GG_NV_ESC_IOCTL_XFER_CMD) {
        struct gg_nv_ioctl_xfer xfer = {};
        if (bpf_probe_read_user(&xfer, sizeof(xfer), (void *)arg) == 0)
            key.command = GG_NV_XFER_FLAG | xfer.cmd;
    }

    __u64 *count = ioctl_counts.lookup(&key);
    if (count) {
        __sync_fetch_and_add(count, 1);
        return 0;
    }
    __u64 one = 1;
    if (ioctl_counts.insert(&key, &one) == 0) {
        count_write(GG_WRITE_IOCTL_KEYS);
    } else {
        /* Lost a race with another thread inserting the same key, or full. */
        count = ioctl_counts.lookup(&key);
        if (count)
            __sync_fetch_and_add(count, 1);
        else
            count_lost(GG_LOST_IOCTL_KEYS);
    }
    return 0;
}

#ifndef GG_RAW_SYS_ENTER             /* else raw_enter.bpf.c dispatches here */
TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    __u64 id = bpf_get_current_pid_tgid();
    return count_ioctl(id >> 32, (__s32)args->fd, args->cmd, args->arg);
}
#endif
