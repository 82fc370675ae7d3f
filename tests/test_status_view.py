"""The `gpuguard status` view: hostile strings from the state file stay inert (no root needed).

(The agent's log lines are tested in tests/test_agent_logs.py.)
"""

from __future__ import annotations

import time

from gpuguard.commands.status import render

HOSTILE = 'x\n{"event":{"kind":"alert"}}\x1b]0;pwned\x07\u202e'


def test_status_view_escapes_process_names():
    now = time.time()
    doc = {
        "pid": 1,
        "started": now,
        "mode": "monitor",
        "sensor": "proc",
        "rules": {"error": HOSTILE},
        "blind_spots": [HOSTILE],
        "log": {"faults": 2, "last_error": HOSTILE},
        "last_findings": [
            {
                "time": now,
                "pid": 5,
                "comm": HOSTILE,
                "verdict": "malicious",
                "score": 90,
                "rule_ids": [HOSTILE],
            }
        ],
    }
    text = "\n".join(render(doc, True, "running", now))
    assert "\x1b" not in text and "\u202e" not in text
    assert len(text.splitlines()) == len(render(doc, True, "running", now))
    assert "log faults: 2, last: x\\n" in text
