"""The agent's state file: what ``gpuguard status`` shows, written atomically, readable by root only.

The agent rewrites it every few seconds (and at once when a new finding is
raised) by writing a temporary file beside it and renaming it over the old
one, so a reader never sees half a document.  On stop the agent marks it
``running: false``.  A file whose writer pid is gone, or that has not been
refreshed for several intervals, means the agent is not running.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpuguard.errors import GpuguardError

# An unchanged state file is rewritten every this many status intervals (20 s by default): each
# rewrite cost an idle agent ~1 ms of CPU, a third of its detect loop's idle time at 3.
STATUS_HEARTBEAT = 10
# A reader calls the file stale past a heartbeat, plus an idle loop's stretched look at it
# (schedule.IDLE_STRETCH intervals: tests/test_agent_schedule.py holds the sum), plus one.
STALE_AFTER_INTERVALS = 16


def status_document(
    c: Any,
    config: Any,
    rule_sources: list[str],
    events_per_s: float,
    now: float,
    running: bool = True,
) -> dict[str, Any]:
    """The state file's document from the agent's counters (:class:`AgentCounters`) and config."""
    return {
        "running": running,
        "pid": os.getpid(),
        "started": c.started,
        "run_id": c.run_id,
        "updated": now,
        "interval_s": config.status_interval_s,
        "mode": config.mode,
        "dry_run": config.dry_run,
        "sensor": c.sensor_mode,
        "blind_spots": c.blind_spots,
        "probes_attached": c.probes_attached,
        "headers": {"source": c.headers, "detail": c.headers_why} if c.headers else None,
        "config": {"path": config.source or None, "error": c.config_error},
        "rules": {
            "version": c.rules_version,
            "generation": c.rules_generation,
            "error": c.rules_error,
            "sources": rule_sources,
        },
        "log": {
            "path": config.log_path,
            "format": config.log_format,
            "faults": c.log_faults,
            "last_error": c.last_output_error,
            "status_errors": c.status_errors,
        },
        "events_per_s": round(events_per_s, 1),
        "events_total": c.events_total(),
        "drops": {
            "ring_lost": dict(c.ring_lost),
            "intake": dict(c.intake_dropped),
            "output": c.output_dropped,
            "output_errors": c.output_errors,
        },
        "processes_tracked": c.processes_tracked,
        "last_findings": list(c.last_findings),
        "last_actions": list(c.last_actions),
        "rules_acting": rules_acting(c),
        "host_findings": list(c.host_findings),
        "gpus": [{"vendor": v, "index": i, **info} for (v, i), info in sorted(c.gpus.items())],
        "counters": c.snapshot(),
    }


def rules_acting(c: Any) -> list[dict[str, Any]]:
    """Per rule: the acting steps its matches would have taken and those taken, by action, and
    the latest processes' names (escaped): what enforce would cost, rule by rule."""
    rules = sorted({r for r, _ in c.rule_would_act} | {r for r, _ in c.rule_acted})
    return [
        {
            "rule": rule,
            "would_act": {a: n for (r, a), n in sorted(c.rule_would_act.items()) if r == rule},
            "acted": {a: n for (r, a), n in sorted(c.rule_acted.items()) if r == rule},
            "processes": list(c.rule_processes.get(rule, ())),
        }
        for rule in rules
    ]


def write_status(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` (mode 0600, directory 0700 when we create it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(document, ensure_ascii=True, default=str).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GpuguardError(
            f"no agent state file at {path}: the agent is not running (or never ran here)",
            "start it: gpuguard agent (or systemctl start gpuguard)",
        ) from None
    except PermissionError:
        raise GpuguardError(
            f"cannot read {path}: it is readable by root only", "run gpuguard status as root"
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuguardError(
            f"the agent state file {path} is not valid JSON ({exc.msg})",
            "restart the agent; it rewrites the file",
        ) from None
    if not isinstance(doc, dict):
        raise GpuguardError(
            f"the agent state file {path} is not a JSON object", "restart the agent"
        )
    return doc


def agent_alive(doc: dict[str, Any], now: float | None = None) -> tuple[bool, str]:
    """Whether the agent that wrote ``doc`` runs now, and why not."""
    now = time.time() if now is None else now
    if not doc.get("running"):
        return False, "stopped"
    pid = doc.get("pid")
    if not isinstance(pid, int) or not os.path.exists(f"/proc/{pid}"):
        return False, f"its process {pid} is gone (it did not stop cleanly)"
    age = now - float(doc.get("updated", 0))
    interval = float(doc.get("interval_s", 2.0))
    if age > STALE_AFTER_INTERVALS * interval + 1:
        return False, f"its state file was last refreshed {age:.0f} s ago (the agent is stuck?)"
    return True, "running"
