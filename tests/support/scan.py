"""`gpuguard scan` run for tests, and what it scans: tiny C programs (a miner, a hider), a fake pool.

The programs are compiled with gcc into the test's
temporary directory:

* ``MINER_C`` — a miner stand-in: opens the GPU nodes it finds, connects to the
  ``-o`` URL, sends a stratum ``mining.subscribe`` line and waits; ``--comm``
  renames it (prctl), like miners that borrow kernel-thread names;
* ``HIDER_C`` — an LD_PRELOAD readdir hook that drops one pid from /proc
  listings (the trick of libprocesshider-style rootkits).

:func:`started_miner` runs the miner inside a private mount namespace whose
/dev is a tmpfs with GPU-named nodes made from the null device
(docs/platform: "the private-/dev trick"), then deletes its executable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuguard.proving.simulator import LoopbackPool
from tests.support.unprivileged import as_nobody

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
WALLET = "4" + "8" * 94  # a Monero-shaped address: 4, then 94 base58 characters

MINER_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *url = NULL, *comm = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) url = argv[++i];
        else if (!strcmp(argv[i], "--comm") && i + 1 < argc) comm = argv[++i];
    }
    if (comm) prctl(PR_SET_NAME, comm, 0, 0, 0);
    const char *nodes[] = {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"};
    int opened = 0;
    for (unsigned i = 0; i < sizeof nodes / sizeof *nodes; i++) opened += open(nodes[i], O_RDWR) >= 0;
    int connected = 0;
    if (url) {
        const char *hostport = strstr(url, "://");
        hostport = hostport ? hostport + 3 : url;
        char host[64] = {0};
        const char *colon = strrchr(hostport, ':');
        if (!colon || colon - hostport >= (long)sizeof host) return 2;
        memcpy(host, hostport, colon - hostport);
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
        inet_pton(AF_INET, host, &addr.sin_addr);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&addr, sizeof addr) == 0) {
            const char *hello = "{\"id\":1,\"method\":\"mining.subscribe\",\"params\":[\"XMRig/6.21.0\"]}\n";
            connected = write(s, hello, strlen(hello)) > 0;
        }
    }
    printf("ready gpu=%d pool=%d\n", opened, connected);
    fflush(stdout);
    for (;;) pause();
}
"""

HIDER_C = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int hide(DIR *dir, const char *name) {
    const char *pid = getenv("GG_TEST_HIDE_PID");
    if (!pid || strcmp(name, pid)) return 0;
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd(dir));
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    return !strcmp(target, "/proc");
}

struct dirent *readdir(DIR *dir) {
    static struct dirent *(*real)(DIR *);
    if (!real) real = dlsym(RTLD_NEXT, "readdir");
    struct dirent *e;
    while ((e = real(dir)) && hide(dir, e->d_name)) {}
    return e;
}

struct dirent64 *readdir64(DIR *dir) {
    static struct dirent64 *(*real)(DIR *);
    if (!real) real = dlsym(RTLD_NEXT, "readdir64");
    struct dirent64 *e;
    while ((e = real(dir)) && hide(dir, e->d_name)) {}
    return e;
}
"""

# Private /dev: a tmpfs with the null device under GPU names (major 1, minor 3).
PRIVATE_DEV_SCRIPT = (
    "mount -t tmpfs -o mode=755 none /dev && "
    "mknod -m 666 /dev/null c 1 3 && "
    "mknod -m 666 /dev/nvidiactl c 1 3 && "
    "mknod -m 666 /dev/nvidia0 c 1 3 && "
    "mknod -m 666 /dev/nvidia-uvm c 1 3 && "
    'exec "$@"'
)


def compile_c(source: str, out: Path, shared: bool = False) -> Path:
    if shutil.which("gcc") is None:
        import pytest

        pytest.skip("gcc is not installed")
    src = out.with_suffix(".c")
    src.write_text(source)
    cmd = ["gcc", "-O1", "-o", str(out), str(src)]
    if shared:
        cmd[1:1] = ["-shared", "-fPIC"]
        cmd.append("-ldl")
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@contextlib.contextmanager
def pool_listener() -> Iterator[LoopbackPool]:
    listener = LoopbackPool()
    listener.start()
    try:
        yield listener
    finally:
        listener.close()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@contextlib.contextmanager
def started_miner(
    workdir: Path, pool_port: int, name: str = "kdevtmpfsi", comm: str = "kworker/0:2"
) -> Iterator[dict[str, Any]]:
    """The miner stand-in, running from ``workdir`` (under /tmp) with GPU nodes, then deleted."""
    binary = compile_c(MINER_C, workdir / "miner-src")
    exe = workdir / name
    shutil.copy(binary, exe)
    os.chmod(exe, 0o755)
    url = f"stratum+tcp://127.0.0.1:{pool_port}"
    argv = [str(exe), "-o", url, "-u", WALLET, "--donate-level", "1", "--comm", comm]
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_DEV_SCRIPT, "sh", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(
                f"miner stand-in did not start: {ready!r} {proc.stderr.read() if proc.poll() is not None else ''}"
            )
        exe.unlink()  # run-and-delete, like droppers do
        yield {
            "pid": proc.pid,
            "exe": str(exe),
            "url": url,
            "argv": argv,
            "ready": ready.strip(),
            "comm": comm,
        }
    finally:
        stop(proc)


@contextlib.contextmanager
def sleeper(*extra: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600", *extra])
    try:
        yield proc
    finally:
        stop(proc)


def run_scan(
    *args: str,
    user: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str = "/",
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """``gpuguard scan ARGS`` in a fresh interpreter; ``user="nobody"`` drops to uid/gid 65534."""
    cmd = [PYTHON, "-m", "gpuguard", "scan", *args]
    if user == "nobody":
        cmd = [*as_nobody(), *cmd]
    elif user is not None:
        raise ValueError(f"run_scan runs as root or nobody, not {user}")
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO)
    full_env.update(env or {})
    return subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )


def scan_json(*args: str, **kwargs) -> tuple[int, dict[str, Any], str]:
    result = run_scan("--json", *args, **kwargs)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def write_rules_override(path: Path, pool_port: int) -> Path:
    """A rules layer adding the test pool's ephemeral port to ``pool_ports``."""
    path.write_text(f"version: 1\nlists:\n  pool_ports: {{extend: [{pool_port}]}}\n")
    os.chmod(path, 0o644)
    return path


def findings_for_pid(doc: dict[str, Any], pid: int) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f.get("process", {}).get("pid") == pid]
