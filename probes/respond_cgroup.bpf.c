/* respond_cgroup.bpf.c - quarantine and egress block, attached to offenders' cgroups.
 *
 * deny_gpu_devices (BPF_PROG_TYPE_CGROUP_DEVICE) refuses every access to a
 * character device whose major is in denied_majors: open(2) of a GPU node
 * fails with EPERM inside the cgroup while the processes keep running.
 * refuse_pool_connect4/6 (BPF_PROG_TYPE_CGROUP_SOCK_ADDR, loaded with their
 * expected attach types) refuse connect(2) to an address in pool_addresses
 * until its deadline.  Both read only their context and maps; the maps are
 * pinned (BPF_TABLE_PINNED) so a restarted agent shares them with programs
 * still attached from before.  Compiled with -DGG_PIN_ROOT="...".
 */
#include <uapi/linux/bpf.h>
#include "gpuguard.h"

#define GG_AF_INET 2
#define GG_AF_INET6 10

BPF_TABLE_PINNED("hash", struct gg_major_key, __u32, denied_majors, 64, GG_PIN_ROOT "/maps/denied_majors");
BPF_TABLE_PINNED("hash", struct gg_pool_key, struct gg_touch_entry, pool_addresses, 4096, GG_PIN_ROOT "/maps/pool_addresses");

int deny_gpu_devices(struct bpf_cgroup_dev_ctx *ctx)
{
    __u32 type = ctx->access_type & 0xFFFF;
    if (type != BPF_DEVCG_DEV_CHAR)
        return 1;
    struct gg_major_key key = { .major = ctx->major };
    return denied_majors.lookup(&key) ? 0 : 1;
}

static __always_inline int pool_refused(struct gg_pool_key *key)
{
    struct gg_touch_entry *entry = pool_addresses.lookup(key);
    if (!entry)
        return 0;
    return entry->expires_ns == 0 || bpf_ktime_get_ns() < entry->expires_ns;
}

int refuse_pool_connect4(struct bpf_sock_addr *ctx)
{
    struct gg_pool_key key = { .family = GG_AF_INET };
    __u32 ip = ctx->user_ip4;
    __builtin_memcpy(key.addr, &ip, 4);
    return pool_refused(&key) ? 0 : 1;
}

int refuse_pool_connect6(struct bpf_sock_addr *ctx)
{
    struct gg_pool_key key = { .family = GG_AF_INET6 };
    __u32 w0 = ctx->user_ip6[0], w1 = ctx->user_ip6[1], w2 = ctx->user_ip6[2], w3 = ctx->user_ip6[3];
    __builtin_memcpy(key.addr, &w0, 4);
    __builtin_memcpy(key.addr + 4, &w1, 4);
    __builtin_memcpy(key.addr + 8, &w2, 4);
    __builtin_memcpy(key.addr + 12, &w3, 4);
    return pool_refused(&key) ? 0 : 1;
}
