"""Shared pieces of the `gpuguard scan` tests: tiny C programs, a fake pool, the JSON shape.

No tests live here.  The programs are compiled with gcc into the test's
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

REPO = Path(__file__).resolve().parent.parent
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
        cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *cmd]
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


# ---- the documented JSON shape (docs/scan.md "JSON output") ----------------------
# A JSON-schema-like description: "type" is a Python type or tuple; "required"
# lists keys; "properties" describes nested objects; "items" describes list items.

_STR, _INT, _NUM, _BOOL = str, int, (int, float), bool
_STRS = {"type": list, "items": {"type": _STR}}

ECS_FINDING_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": ["@timestamp", "ecs", "message", "event", "rule", "threat", "host", "gpuguard"],
    "properties": {
        "@timestamp": {"type": _STR},
        "ecs": {"type": dict, "required": ["version"]},
        "message": {"type": _STR},
        "event": {
            "type": dict,
            "required": ["kind", "category", "type", "risk_score", "severity", "module", "dataset"],
            "properties": {
                "kind": {"type": _STR, "enum": ["alert", "event"]},
                "category": _STRS,
                "type": _STRS,
                "risk_score": {"type": _NUM},
                "severity": {"type": _INT},
            },
        },
        "rule": {
            "type": dict,
            "required": ["id", "name", "description"],
            "properties": {
                "id": {"type": _STR},
                "name": {"type": _STR},
                "description": {"type": _STR},
            },
        },
        "threat": {
            "type": dict,
            "required": ["framework", "technique"],
            "properties": {
                "framework": {"type": _STR, "enum": ["MITRE ATT&CK"]},
                "technique": {
                    "type": dict,
                    "required": ["id", "name"],
                    "properties": {"id": _STRS, "name": _STRS},
                },
            },
        },
        "process": {
            "type": dict,
            "required": ["pid"],
            "properties": {
                "pid": {"type": _INT},
                "name": {"type": _STR},
                "executable": {"type": _STR},
                "command_line": {"type": _STR},
                "args": _STRS,
                "parent": {"type": dict, "properties": {"pid": {"type": _INT}}},
            },
        },
        "user": {"type": dict, "properties": {"id": {"type": _STR}, "name": {"type": _STR}}},
        "container": {"type": dict, "required": ["id"]},
        "orchestrator": {"type": dict, "required": ["type", "resource"]},
        "gpuguard": {
            "type": dict,
            "required": ["kind", "score", "verdict", "severity", "rule_ids", "evidence"],
            "properties": {
                "kind": {"type": _STR, "enum": ["process", "host"]},
                "score": {"type": _NUM},
                "verdict": {"type": _STR, "enum": ["clean", "suspicious", "malicious"]},
                "rule_ids": _STRS,
                "evidence": {
                    "type": list,
                    "items": {
                        "type": dict,
                        "required": ["rule_id", "detail", "weight"],
                        "properties": {
                            "rule_id": {"type": _STR},
                            "detail": {"type": _STR},
                            "weight": {"type": _NUM},
                        },
                    },
                },
            },
        },
    },
}

OCSF_FINDING_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": [
        "class_uid",
        "category_uid",
        "activity_id",
        "type_uid",
        "severity_id",
        "time",
        "finding_info",
        "metadata",
        "evidences",
    ],
    "properties": {
        "class_uid": {"type": _INT, "enum": [2004]},
        "category_uid": {"type": _INT, "enum": [2]},
        "activity_id": {"type": _INT, "enum": [1]},
        "type_uid": {"type": _INT, "enum": [200401]},
        "severity_id": {"type": _INT, "enum": [1, 2, 3, 4, 5]},
        "time": {"type": _INT},
        "finding_info": {
            "type": dict,
            "required": ["uid", "title", "analytic"],
            "properties": {
                "uid": {"type": _STR},
                "title": {"type": _STR},
                "types": _STRS,
                "analytic": {"type": dict, "required": ["type_id"]},
            },
        },
        "metadata": {
            "type": dict,
            "required": ["product", "version"],
            "properties": {"product": {"type": dict, "required": ["name", "version"]}},
        },
        "evidences": {"type": list, "items": {"type": dict}},
    },
}

SCAN_DOCUMENT_SHAPE: dict[str, Any] = {
    "type": dict,
    "required": ["scanner", "host", "summary", "findings"],
    "properties": {
        "scanner": {
            "type": dict,
            "required": ["name", "version", "command", "started", "finished", "schema"],
        },
        "host": {"type": dict, "required": ["hostname"]},
        "summary": {
            "type": dict,
            "required": [
                "processes_scanned",
                "findings",
                "malicious",
                "suspicious",
                "highest_score",
                "exit_code",
                "could_not_see",
                "gpu_stack",
            ],
            "properties": {
                "processes_scanned": {"type": _INT},
                "exit_code": {"type": _INT, "enum": [0, 1]},
                "could_not_see": _STRS,
            },
        },
        "findings": {"type": list},
    },
}


def shape_errors(value: Any, shape: dict[str, Any], where: str = "$") -> list[str]:
    """Every place ``value`` departs from ``shape`` (empty when it conforms)."""
    errors: list[str] = []
    expected = shape.get("type")
    if expected is not None:
        # bool is an int in Python; a number field must not accept True.
        if (
            isinstance(value, bool)
            and expected is not bool
            and (expected is int or (isinstance(expected, tuple) and bool not in expected))
        ):
            return [f"{where}: expected {expected}, got bool"]
        if not isinstance(value, expected):
            return [f"{where}: expected {expected}, got {type(value).__name__}"]
    if "enum" in shape and value not in shape["enum"]:
        errors.append(f"{where}: {value!r} not in {shape['enum']}")
    if isinstance(value, dict):
        for key in shape.get("required", ()):
            if key not in value:
                errors.append(f"{where}: missing {key!r}")
        for key, sub in shape.get("properties", {}).items():
            if key in value:
                errors.extend(shape_errors(value[key], sub, f"{where}.{key}"))
    if isinstance(value, list) and "items" in shape:
        for i, item in enumerate(value):
            errors.extend(shape_errors(item, shape["items"], f"{where}[{i}]"))
    return errors
