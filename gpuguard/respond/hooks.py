"""Firewall hooks: operator programs run with the finding as JSON on stdin.

How a site plugs in its own firewall, ticketing or scheduler (cordon the
node, evict the pod).  The argv is fixed in the config (no shell, nothing
from the offender in it); the offender's names reach the program only inside
the JSON document on stdin.  The environment is cleaned to PATH and LANG,
the program (and anything it started) is killed at its timeout, and its exit status and (bounded,
escaped) output go into the action's outcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

from gpuguard.escape import escape_text
from gpuguard.respond.settings import HookSettings

CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
MAX_OUTPUT = 4096
# Their row in docs/respond.md's action table (gpuguard.respond.action_docs).
WHAT = (
    "operator programs (a site's firewall, ticketing, cluster scheduler) run with the finding as "
    "JSON on stdin: `finding` (the finding the log records, every field: "
    "`gpuguard/outputs/finding_document.py`), and `verdict`, `actions`, `process`, `connections` "
    "as before"
)


def run_hook(hook: HookSettings, finding: dict[str, Any]) -> dict[str, Any]:
    """Run one hook; the outcome detail (status, exit code, output) — never raises for the hook's faults."""
    document = json.dumps(finding, ensure_ascii=True)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(hook.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(CLEAN_ENV),
            close_fds=True,
            cwd="/",
            start_new_session=True,
        )
    except OSError as exc:
        return {
            "hook": hook.name,
            "ok": False,
            "error": f"cannot run {escape_text(hook.argv[0])}: {exc.strerror}",
        }
    try:
        stdout, stderr = proc.communicate(document.encode(), timeout=hook.timeout_s)
    except subprocess.TimeoutExpired:
        # The hook runs in its own session: whatever it started goes with it.
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return {
            "hook": hook.name,
            "ok": False,
            "error": f"timed out after {hook.timeout_s:g} s",
            "stdout": _bounded(stdout),
            "stderr": _bounded(stderr),
        }
    return {
        "hook": hook.name,
        "ok": proc.returncode == 0,
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - started, 3),
        "stdout": _bounded(stdout),
        "stderr": _bounded(stderr),
    }


def _bounded(data: bytes | None) -> str:
    if not data:
        return ""
    return escape_text(data[:MAX_OUTPUT].decode("utf-8", "replace"))
