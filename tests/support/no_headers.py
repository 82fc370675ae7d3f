"""Run a command as on a managed GPU node: no kernel headers (and, when asked, no tracefs or x86_fpu).

A private mount namespace with empty tmpfs over /lib/modules and /usr/src: gpuguard must
compile its probes from its own header set.  Nothing outside the namespace changes.
"""

from __future__ import annotations

HIDE_HEADERS = (
    "mount -t tmpfs -o size=1m gg-noheaders /lib/modules && "
    "mount -t tmpfs -o size=1m gg-noheaders /usr/src"
)
HIDE_TRACEFS = (
    "mount -t tmpfs -o size=1m gg-notracefs /sys/kernel/tracing && "
    "mount -t tmpfs -o size=1m gg-notracefs /sys/kernel/debug"
)
HIDE_FPU = "mount -t tmpfs -o size=1m gg-nofpu /sys/kernel/tracing/events/x86_fpu"
# A host tree that passes a look at its files but does not compile (a leftover, a wrong link).
BROKEN_HOST_TREE = (
    "R=$(uname -r) && for f in include/linux/kconfig.h include/generated/autoconf.h "
    "include/uapi/linux/ptrace.h include/uapi/linux/bpf.h; do "
    'mkdir -p "/lib/modules/$R/build/$(dirname $f)" && '
    'echo "#error not this kernel" > "/lib/modules/$R/build/$f"; done'
)


def own_runtime_dir(path: str) -> str:
    """A step giving the namespace's processes ``path`` as their header runtime dir, so a test
    sees the trees of its own processes only (others on the host use /run/gpuguard/headers)."""
    return f"mkdir -p /run/gpuguard/headers && mount --bind {path} /run/gpuguard/headers"


def without_headers(*also: str) -> tuple[str, ...]:
    """A wrapper (argv prefix) running the rest of the argv with the headers out of sight."""
    steps = " && ".join(["mount --make-rprivate /", HIDE_HEADERS, *also, 'exec "$@"'])
    return ("unshare", "-m", "--", "bash", "-c", steps, "gg-noheaders")
