"""Build the C test workload and run it with GPU-named device nodes.

The machine has no GPU.  A workload runs in its own mount namespace with a
tmpfs on /dev holding nodes named like GPU devices but backed by the null
driver (major 1, minor 3): open() succeeds, ioctl() fails with ENOTTY, and the
kernel's syscall tracepoints see the real GPU paths (platform.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

WORKLOAD_SOURCE = Path(__file__).resolve().parent.parent / "workloads" / "gpu_workload.c"

EXIT0_DIR = Path("/var/cache/gpuguard-test-bin")  # not a temporary directory (see build_exit0)

GPU_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/kfd",
    "/dev/dri/card0",
    "/dev/dri/renderD128",
    "/dev/mem",
)

# Builds /dev inside the new namespace, then execs the workload (same pid).
_PRIVATE_DEV_SCRIPT = r"""
set -e
mount --make-rprivate / 2>/dev/null || true
mount -t tmpfs -o mode=755 gpuguard-test-dev /dev
mknod -m 666 /dev/null c 1 3
mkdir -p /dev/dri
for node in $GG_NODES; do mkdir -p "${node%/*}"; mknod -m 666 "$node" c 1 3; done
exec "$@"
"""


def build_c_program(
    source: Path,
    directory: Path | None = None,
    flags: tuple[str, ...] = (),
    libs: tuple[str, ...] = (),
) -> Path:
    """Compile a C workload once per source version (and extra ``flags``, and ``libs`` to link,
    given after the source); return the binary."""
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags + libs).encode()).hexdigest()[:12]
    directory = directory or Path(tempfile.gettempdir()) / "gpuguard-test-bin"
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / f"{source.stem}-{digest}"
    if not binary.exists():
        tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
        subprocess.run(
            ["gcc", "-O2", "-Wall", *flags, "-o", str(tmp), str(source), *libs], check=True
        )
        tmp.rename(binary)
    return binary


def build_exit0() -> Path:
    """tests/workloads/exit0.c, static and without libc: the cheapest program to exec.

    Built outside /tmp (EXIT0_DIR): a program in a temporary directory weighs in the rules, and
    the flood benchmarks measure plain execs."""
    source = WORKLOAD_SOURCE.parent / "exit0.c"
    return build_c_program(source, EXIT0_DIR, ("-static", "-nostdlib"))


def exit0_named(name: str) -> Path:
    """A copy of :func:`build_exit0` called ``name`` (e.g. a name the rules list, whose every
    exec the exec filter sends up in full), in a directory of its own beside it."""
    exit0 = build_exit0()
    program = exit0.parent / f"{exit0.name}.named" / name
    if not program.exists():
        program.parent.mkdir(exist_ok=True)
        tmp = program.with_name(f".{name}.{os.getpid()}.tmp")
        shutil.copy(exit0, tmp)
        tmp.rename(program)
    return program


def build_workload(directory: Path | None = None) -> Path:
    """Compile gpu_workload.c once per source version; return the binary."""
    return build_c_program(WORKLOAD_SOURCE, directory)


def private_dev_command(
    argv: list[str], nodes: tuple[str, ...] = GPU_NODES
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` with GPU-named nodes."""
    env = dict(os.environ, GG_NODES=" ".join(nodes))
    unshare = shutil.which("unshare") or "unshare"
    return [
        unshare,
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        _PRIVATE_DEV_SCRIPT,
        "gpuguard-test",
        *argv,
    ], env


def run_with_gpu_nodes(
    argv: list[str], *, nodes: tuple[str, ...] = GPU_NODES, **popen_kwargs
) -> subprocess.Popen:
    """Start ``argv`` in a private mount namespace with GPU-named nodes; pid == the workload's."""
    command, env = private_dev_command(argv, nodes)
    popen_kwargs.setdefault("stdin", subprocess.PIPE)
    popen_kwargs.setdefault("stdout", subprocess.PIPE)
    popen_kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(command, env=env, **popen_kwargs)
