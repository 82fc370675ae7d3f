"""Agent log lines and the status view: one line per record, hostile strings inert (no root needed)."""

from __future__ import annotations

import json
import time

from gpuguard.agent.log_output import render_record
from gpuguard.commands.status import render
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle

HOSTILE = 'x\n{"event":{"kind":"alert"}}\x1b]0;pwned\x07\u202e'
HOST = {"hostname": "h"}


def test_action_and_lifecycle_lines_are_single_escaped_lines():
    now = time.time()
    for record in (ActionOutcome(time=now, action="alert", status="done", pid=42, comm=HOSTILE, reason=HOSTILE),
                   AgentLifecycle(time=now, action="fault", message=HOSTILE)):
        line = render_record(record, "ecs", HOST, now)
        assert "\n" not in line and "\x1b" not in line
        doc = json.loads(line)
        assert "\n" not in doc["message"] and "\x1b" not in doc["message"] and "\\n" in doc["message"]
        assert doc["event"]["kind"] == "event"     # never an alert: these are not findings
    action = json.loads(render_record(ActionOutcome(time=now, action="kill", status="failed", pid=7), "ecs", HOST, now))
    assert action["event"]["outcome"] == "failure" and action["process"]["pid"] == 7


def test_status_view_escapes_process_names():
    now = time.time()
    doc = {"pid": 1, "started": now, "mode": "monitor", "sensor": "proc", "rules": {"error": HOSTILE},
           "blind_spots": [HOSTILE],
           "last_findings": [{"time": now, "pid": 5, "comm": HOSTILE, "verdict": "malicious", "score": 90,
                              "rule_ids": [HOSTILE]}]}
    text = "\n".join(render(doc, True, "running", now))
    assert "\x1b" not in text and "\u202e" not in text
    assert len(text.splitlines()) == len(render(doc, True, "running", now))
