"""Firewall hooks: operator programs run with the finding as JSON on stdin.

How a site plugs in its own firewall, ticketing or scheduler (cordon the
node, evict the pod).  The argv is fixed in the config (no shell, nothing
from the offender in it); the offender's names reach the program only inside
the JSON document on stdin.  The environment is cleaned to PATH and LANG,
the program is killed at its timeout, and its exit status and (bounded,
escaped) output go into the action's outcome.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from gpuguard.escape import escape_text
from gpuguard.respond.settings import HookSettings

CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
MAX_OUTPUT = 4096


def run_hook(hook: HookSettings, finding: dict[str, Any]) -> dict[str, Any]:
    """Run one hook; the outcome detail (status, exit code, output) — never raises for the hook's faults."""
    document = json.dumps(finding, ensure_ascii=True)
    started = time.monotonic()
    try:
        done = subprocess.run(list(hook.argv), input=document.encode(), capture_output=True, env=dict(CLEAN_ENV),
                              timeout=hook.timeout_s, close_fds=True, cwd="/", start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        return {"hook": hook.name, "ok": False, "error": f"timed out after {hook.timeout_s:g} s",
                "stdout": _bounded(exc.stdout), "stderr": _bounded(exc.stderr)}
    except OSError as exc:
        return {"hook": hook.name, "ok": False, "error": f"cannot run {escape_text(hook.argv[0])}: {exc.strerror}"}
    return {"hook": hook.name, "ok": done.returncode == 0, "exit_code": done.returncode,
            "seconds": round(time.monotonic() - started, 3),
            "stdout": _bounded(done.stdout), "stderr": _bounded(done.stderr)}


def _bounded(data: bytes | None) -> str:
    if not data:
        return ""
    return escape_text(data[:MAX_OUTPUT].decode("utf-8", "replace"))
