"""The open process findings on disk, beside the state file: a restarted agent continues them.

The file holds, per open finding, its id, its process (pid, start time) and the number of the
last record written; the detect loop rewrites it (atomically, mode 0600) when that changes.  A
restarted agent (``kill -9`` included) reads it before its first scoring: a process still
running under a finding id listed there is picked up as that finding, numbered on, and the
record marked ``continued``.  It lives in /run beside the state file, so a reboot (where no
process survives) starts afresh.  Details: docs/agent.md, "Restarts".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuguard.agent.stages.s5_report.findings import Carried
from gpuguard.agent.status_file import write_status
from gpuguard.correlate.state import ProcessKey
from gpuguard.escape import escape_text

VERSION = 1


def ledger_path(status_path: str | Path) -> Path:
    """The ledger beside the state file, named after it (two agents never share one)."""
    path = Path(status_path)
    return path.with_name(f"{path.stem}.findings.json")


def load_ledger(path: Path) -> tuple[dict[str, Carried], str | None]:
    """The findings an earlier run left open, and a problem line when the file was unusable
    (then nothing is carried: the findings are reported as new, never lost)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return (
            {},
            f"cannot read the open findings of the last run ({escape_text(str(path))}): {reason}",
        )
    carried: dict[str, Carried] = {}
    rows = doc.get("findings") if isinstance(doc, dict) and doc.get("version") == VERSION else None
    if not isinstance(rows, list):
        return (
            {},
            f"the open findings of the last run ({escape_text(str(path))}) are not in a known form",
        )
    for row in rows:
        try:
            fid, pid, start, sequence = row["id"], row["pid"], row["start_time"], row["sequence"]
            key = ProcessKey(int(pid), float(start))
            carried[str(fid)] = Carried(key, int(sequence))
        except (KeyError, TypeError, ValueError):
            continue  # one damaged row costs that finding its continuation, nothing more
    return carried, None


def save_ledger(path: Path, run_id: str, open_findings: dict[str, Carried]) -> None:
    """Replace the ledger with ``open_findings`` (raises OSError, which the caller counts)."""
    document: dict[str, Any] = {
        "version": VERSION,
        "run_id": run_id,
        "findings": [
            {"id": fid, "pid": c.key.pid, "start_time": c.key.start_time, "sequence": c.sequence}
            for fid, c in open_findings.items()
        ],
    }
    write_status(path, document)
