/* gpuguard.h - the one definition of every kernel->user event and of the
 * enums user space shares with the probes.
 *
 * User space never mirrors these structs by hand: the sensor exports each
 * struct's layout through a one-entry "schema_*" array map, and bcc builds the
 * ctypes class from clang's view of this file.  gpuguard/events/abi.py parses
 * the enums below (and only them) so replay and decoding work without a kernel.
 *
 * Rules for editing: keep every enum as `NAME = number,` on its own line; add
 * new kinds at the end; bump GG_ABI_VERSION when a struct changes.
 */
#ifndef GPUGUARD_H
#define GPUGUARD_H

#define GG_ABI_VERSION 4

#define GG_COMM_LEN 16
#define GG_PATH_LEN 128
#ifndef GG_PAYLOAD_LEN
#define GG_PAYLOAD_LEN 512
#endif

enum gg_event_kind {
    GG_KIND_GPU_OPEN = 1,
    GG_KIND_CONNECT = 2,
    GG_KIND_NET_PAYLOAD = 3,
    GG_KIND_EXEC = 4,
    GG_KIND_EXIT = 5,
    GG_KIND_HUGE_ALLOC = 6,
    GG_KIND_WAKE = 7,            /* a header alone: the exec filter wakes user space (maps.bpf.h) */
};

/* What kind of GPU-related file a descriptor refers to. */
enum gg_device_class {
    GG_DEV_NONE = 0,
    GG_DEV_NVIDIA = 1,           /* /dev/nvidiaN: one GPU */
    GG_DEV_NVIDIA_CTL = 2,       /* /dev/nvidiactl */
    GG_DEV_NVIDIA_UVM = 3,       /* /dev/nvidia-uvm */
    GG_DEV_NVIDIA_UVM_TOOLS = 4, /* /dev/nvidia-uvm-tools */
    GG_DEV_NVIDIA_MODESET = 5,   /* /dev/nvidia-modeset */
    GG_DEV_KFD = 6,              /* /dev/kfd: AMD ROCm compute */
    GG_DEV_DRM_CARD = 7,         /* /dev/dri/cardN */
    GG_DEV_DRM_RENDER = 8,       /* /dev/dri/renderDN */
    GG_DEV_PCI_BAR = 9,          /* /sys/bus/pci/devices/X/resourceN */
    GG_DEV_MEM = 10,             /* /dev/mem */
    GG_DEV_NVIDIA_CAPS = 11,     /* /dev/nvidia-caps/... (MIG capabilities) */
    /* Host tuning files CPU miners touch as root for speed (RandomX): not GPUs, but opened,
     * tracked and reported the same way so a miner with no strings still shows them. */
    GG_DEV_MSR = 12,             /* /dev/cpu/N/msr: model-specific registers */
    GG_DEV_MSR_CONFIG = 13,      /* /sys/module/msr/parameters/allow_writes */
    GG_DEV_HUGEPAGES_CONFIG = 14, /* /proc/sys/vm/nr_hugepages, /sys/kernel/mm/hugepages/X/nr_hugepages */
};

/* Which ring-buffer/perf reservation failed, for the lost-event counters. */
enum gg_lost_slot {
    GG_LOST_GPU_OPEN = 0,
    GG_LOST_CONNECT = 1,
    GG_LOST_NET_PAYLOAD = 2,
    GG_LOST_EXEC = 3,
    GG_LOST_EXIT = 4,
    GG_LOST_IOCTL_KEYS = 5,      /* ioctl counter map full: a new key was dropped */
    GG_LOST_TRACKED_FDS = 6,     /* tracked-fd map full: an open was not tracked */
    GG_LOST_OPEN_CLASSIFY = 7,   /* the tail call to the open classifier failed */
    GG_LOST_ACTIVITY = 8,        /* both activity slots of a watched connection were taken */
    GG_LOST_HUGE_ALLOC = 9,
    GG_LOST_SLOTS = 10,
};

/* Writes that add an entry to a map user space walks (map_writes, by index): while a map's
 * count stands still since a walk found it empty, it is still empty and the walk is skipped. */
enum gg_map_write {
    GG_WRITE_TRACKED_FDS = 0,    /* a GPU fd tracked */
    GG_WRITE_IOCTL_KEYS = 1,     /* a new (tgid, class, command) counted */
    GG_WRITE_ACTIVITY = 2,       /* a watched connection given an activity slot */
    GG_WRITE_SLOTS = 3,
};

/* Why the exec filter (GG_EXEC_FILTER, the agent's sensor) sends a process's execs up in full:
 * exec_interest values, OR-ed.  The flags marked "inherited" pass to the children it forks. */
enum gg_exec_interest {
    GG_INTEREST_GPU = 1,         /* opened a GPU (inherited) */
    GG_INTEREST_NET = 2,         /* connected somewhere */
    GG_INTEREST_TREE = 4,        /* forked by a process with an inherited flag (inherited) */
    GG_INTEREST_USER = 8,        /* user space asked (a scored process) (inherited) */
};

/* Counters of the exec filter (exec_filter_counts, by index). */
enum gg_exec_filter_count {
    GG_EXECF_PROMOTED = 0,       /* pending execs sent up by the kernel (a connect, GPU open, huge pages) */
    GG_EXECF_PENDING_FULL = 1,   /* exec_pending was full: sent up in full instead */
    GG_EXECF_CGROUPS_FULL = 2,   /* exec_aggregated had no room for a new cgroup: counted here only */
    GG_EXECF_PENDING_ADDED = 3,  /* execs written to exec_pending (user space skips its walk while
                                  * this stands still and its last walk left nothing there) */
    GG_EXECF_SLOTS = 4,
};

/* Flags on a gpu_open event. */
enum gg_open_flag {
    GG_OPEN_RELATIVE = 1,        /* path was relative: classified by basename only */
};

/* Flag OR-ed into an NVIDIA ioctl command when the count is for the command
 * carried inside an IOCTL_XFER_CMD (escape 211) wrapper. */
#define GG_NV_XFER_FLAG 0x100000000ULL

/* Every event starts with this header (Tetragon-style): user space reads
 * kind and size, then casts to the struct for that kind. */
struct gg_header {
    __u32 kind;
    __u32 size;
    __u64 time_ns;          /* bpf_ktime_get_boot_ns() */
    __u32 pid;              /* thread id */
    __u32 tgid;             /* process id */
    __u32 uid;
    __u32 gid;
    __u64 cgroup_id;
    char comm[GG_COMM_LEN];
};

struct gg_gpu_open {
    struct gg_header hdr;
    __s32 fd;
    __u32 open_flags;       /* flags passed to open(2) */
    __u32 device_class;     /* enum gg_device_class */
    __u32 gg_flags;         /* enum gg_open_flag */
    char path[GG_PATH_LEN];
};

struct gg_connect {
    struct gg_header hdr;
    __s32 fd;
    __s32 result;           /* 0 or -errno (e.g. -EINPROGRESS) */
    __u16 family;           /* AF_INET / AF_INET6 */
    __u16 port;             /* host byte order */
    __u32 _pad;
    __u8 addr[16];          /* IPv4 in the first 4 bytes */
};

struct gg_net_payload {
    struct gg_header hdr;
    __s32 fd;
    __u32 seq;              /* 0 for the first write on the socket, 1 next... */
    __u32 len;              /* bytes captured in data */
    __u32 orig_len;         /* bytes the process wrote in that call */
    __u8 data[GG_PAYLOAD_LEN];
};

/* Per-connection activity of a watched process (one that holds a GPU, or that user
 * space asked to watch): kept in the kernel (conn_activity), read on an interval.
 * The times of the latest small writes (shares, keepalives) show a pool's cadence
 * even inside TLS.
 *
 * conn_activity is an array, not a hash: a write on a watched connection must cost
 * next to nothing (a hash lookup alone was ~75 ns, the clock read ~100 ns on a VM).
 * A connection lives in slot gg_activity_index(tgid, fd) or the one after it, whose
 * owner field names it; a write reads both slots (inlined array reads) and the clock
 * at most once per jiffy per connection, so times are exact to one tick (1-10 ms). */
#define GG_ACTIVITY_TIMES 8        /* power of two */
#define GG_SMALL_WRITE_BYTES 1024

struct gg_conn_activity {
    __u64 owner;            /* gg_activity_owner(tgid, fd) of the connection here; 0: free slot */
    __u64 start_ns;         /* connect, or when user space started watching (bpf_ktime_get_boot_ns) */
    __u64 last_ns;          /* latest write, as of the first write in its jiffy */
    __u64 last_jiffies;     /* the jiffy last_ns was read in */
    __u64 bytes_out;
    __u32 writes_out;
    __u32 small_writes;     /* writes of at most GG_SMALL_WRITE_BYTES */
    __u64 small_ns[GG_ACTIVITY_TIMES];   /* ring: small write n at [n % GG_ACTIVITY_TIMES] */
};

/* The exit generation of a pid: bumped when a process (its thread-group leader) exits,
 * which is before its pid can be handed out again.  An event carrying the generation it
 * saw lets user space prove that a pidfd it opens later names that same process: open
 * the pidfd, read the generation; unchanged means no process with that pid has exited
 * since (gpuguard/sources/proc/identity.py).  Sized by GG_PID_MAX (the host's pid_max). */
#ifndef GG_PID_MAX
#define GG_PID_MAX 4194304
#endif

struct gg_exec {
    struct gg_header hdr;
    __u32 ppid;             /* filled in user space when 0 */
    __u32 exit_gen;         /* the pid's exit generation at the exec */
    char filename[GG_PATH_LEN];
};

struct gg_exit {
    struct gg_header hdr;
    __s32 exit_code;        /* from exit_group(2) when seen, else -1 */
    __u32 _pad;
};

/* Which call asked for huge pages (gg_huge_alloc.source). */
enum gg_huge_source {
    GG_HUGE_MMAP = 1,            /* mmap(2) with MAP_HUGETLB */
    GG_HUGE_SHMGET = 2,          /* shmget(2) with SHM_HUGETLB */
};

/* mmap(MAP_HUGETLB) or shmget(SHM_HUGETLB), seen at syscall entry (so also a request
 * the kernel then refuses, e.g. with ENOMEM): RandomX miners ask for a ~2 GiB dataset
 * and a 256 MiB cache, often in 1 GiB pages. */
struct gg_huge_alloc {
    struct gg_header hdr;
    __u64 length;           /* bytes asked for */
    __u64 flags;            /* mmap flags / shmflg as passed */
    __u32 source;           /* enum gg_huge_source */
    __u32 page_shift;       /* log2 of the page size asked for (MAP_HUGE_SHIFT bits); 0 = the default size */
};

/* Kernel-side maps whose layout user space reads. */
struct gg_fd_key {
    __u32 tgid;
    __s32 fd;
};

struct gg_tracked_fd {
    __u32 device_class;
    __u32 open_flags;
};

struct gg_ioctl_key {
    __u32 tgid;
    __u32 device_class;
    __u64 command;          /* ioctl cmd; NVIDIA XFER inner cmd | GG_NV_XFER_FLAG */
};

/* fd slots: a direct-mapped prefilter in front of tracked_fds and
 * fresh_sockets (BPF arrays, so the verifier inlines the lookup: no helper
 * call).  Slot index = (tgid * GG_SLOT_HASH_MUL + fd) mod the slot count.
 * A slot's __u64 is
 *   0                    nothing there: the fd is not in the map (no lookup)
 *   GG_SLOT_MULTI        several fds (or one that does not fit a tag) may be
 *                        there: look in the map
 *   tag | value          exactly this (tgid, fd): tag = (tgid << GG_SLOT_FD_BITS
 *                        | fd) << 8, value (1..254) = the device class for
 *                        gpu_fd_slots, 1 for sock_fd_slots
 * The kernel moves a slot 0 -> tag (cmpxchg), tag -> 0 (cmpxchg, on close of
 * that fd) and anything -> GG_SLOT_MULTI (plain store); user space only ever
 * writes GG_SLOT_MULTI.  So a slot never says "absent" for an fd in the map. */
#define GG_SLOT_MULTI 0xffffffffffffffffULL
#define GG_SLOT_HASH_MUL 0x9E3779B1
#define GG_SLOT_FD_BITS 26
#define GG_SLOT_TGID_BITS 22

/* ==== respond: kill-on-touch and cgroup blocks (gpuguard/respond) ====
 * Maps of probes/respond_touch.bpf.c and probes/respond_cgroup.bpf.c, pinned
 * under the block root (/sys/fs/bpf/gpuguard by default) so blocks outlive
 * the agent.  Deadlines are CLOCK_MONOTONIC ns (bpf_ktime_get_ns), 0 = never. */

/* Why kill-on-touch killed a process. */
enum gg_touch_reason {
    GG_TOUCH_GPU_OPEN = 1,       /* opened a GPU device path */
    GG_TOUCH_CONNECT = 2,        /* connect(2) to an IPv4/IPv6 peer */
    GG_TOUCH_EXEC = 3,           /* exec of a blocked path (not killed: reported so user space checks it) */
};

/* Flags of a kill-on-touch entry (gg_touch_entry.flags, copied into reports). */
enum gg_touch_flag {
    GG_TOUCH_TREE = 1,           /* the offender's own: its tree, or an exact copy of it (set by
                                    user space) and what those fork */
    GG_TOUCH_SUSPENDED = 2,      /* the block's circuit breaker tripped: nothing is killed (set in
                                    touch_blocks, the per-block state; honoured on entries too) */
};

/* Bytes of a blocked process's argv kept (a power of two). */
#define GG_ARGS_LEN 256

/* What a blocked process runs, kept in the kernel (touch_procs) for its kill report: a victim is
 * dead by the time user space could read /proc.  Filled at its exec (argv read at execve entry),
 * copied to its forks, and by user space for the processes a block names when placed. */
struct gg_touch_proc {
    __u32 args_len;              /* bytes used in args (NUL-separated, like /proc/PID/cmdline) */
    __u32 cut;                   /* 1: argv was longer than GG_ARGS_LEN bytes */
    char exe[GG_PATH_LEN];       /* the path it exec'd ("": not seen exec'ing) */
    char args[GG_ARGS_LEN];
};

/* A blocked executable path (by its hash) or process (by tgid). */
struct gg_touch_entry {
    __u64 expires_ns;
    __u64 added_ns;              /* CLOCK_BOOTTIME when a tgid was added: a process that started
                                    later is a recycled pid, and user space drops the entry */
    __u32 block;                 /* the block's number, for the kill report */
    __u32 flags;                 /* enum gg_touch_flag */
};

/* Kernel -> user: a kill at the touch (or an exec to check). */
struct gg_touch_event {
    __u64 time_ns;               /* bpf_ktime_get_boot_ns() */
    __u32 tgid;
    __u32 exit_gen;              /* the tgid's exit generation (touch_exit_gens) at the event */
    __u32 reason;                /* enum gg_touch_reason */
    __u32 block;
    __u32 flags;                 /* the matched entry's enum gg_touch_flag */
    __u32 _pad;
    char comm[GG_COMM_LEN];
    char path[GG_PATH_LEN];      /* the GPU path opened, or the path exec'd */
    struct gg_touch_proc proc;   /* what the process runs, as the kernel kept it (may be empty) */
};

/* A pool address refused by the cgroup connect programs. */
struct gg_pool_key {
    __u32 family;                /* AF_INET / AF_INET6 */
    __u8 addr[16];               /* IPv4 in the first 4 bytes */
};

/* A device major denied by the cgroup device program. */
struct gg_major_key {
    __u32 major;
};
/* ==== end respond ==== */

/* ==== fpu (probes/fpu.bpf.c) ==== */
/* Per thread (map value, keyed by the thread's id): the SSE rounding mode (MXCSR.RC) it left
 * the FPU in at context switches, counted per mode and per pair of consecutive looks, and why
 * it was switched out.  An entry exists only once a look found a mode other than
 * round-to-nearest.  RandomX (CFROUND) is found in all four modes in even shares, each look
 * independent of the one before; interval arithmetic, set-once code and numeric test suites
 * switch modes in fixed patterns (docs/rules.md).  Kept per thread so that one thread's fixed
 * cycle is not blurred by the interleaving of its siblings' looks; user space sums a process's
 * threads. */
enum gg_fpu_mode {
    GG_FPU_NEAREST = 0,          /* MXCSR.RC 00: round to nearest, ties to even (the default) */
    GG_FPU_DOWN = 1,             /* 01: toward -infinity */
    GG_FPU_UP = 2,               /* 10: toward +infinity */
    GG_FPU_TOWARD_ZERO = 3,      /* 11: truncate */
};
struct gg_fpu_rounding {
    __u64 first_ns;              /* bpf_ktime_get_boot_ns() of the first counted look */
    __u64 last_ns;               /* ... of the latest */
    __u64 modes[4];              /* looks (at most one per GG_FPU_MIN_GAP_NS) per gg_fpu_mode */
    __u64 next[16];              /* consecutive looks: [mode of the previous look * 4 + mode] */
    __u64 preempted;             /* looks at a switch-out while runnable: preempted, throttled
                                    by a CPU quota, yielded */
    __u64 stopped;               /* ... while stopped from outside (SIGSTOP, ptrace, freezer);
                                    the rest of the looks were sleeps (it blocked) */
    __u32 tgid;                  /* the process the thread belongs to */
    __u32 last_mode;
};
/* ==== end fpu ==== */

#endif /* GPUGUARD_H */
