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


def test_status_lists_rule_by_rule_what_enforce_would_do_and_did():
    now = time.time()
    doc = {
        "pid": 1,
        "started": now,
        "mode": "monitor",
        "rules_acting": [
            {
                "rule": "cpu-randomx-miner",
                "would_act": {"kill": 3, "kill-on-touch": 3},
                "acted": {},
                "processes": ["xmrig(4242)", HOSTILE],
            },
            {"rule": "miner-config-keys", "would_act": {}, "acted": {"kill": 1}, "processes": []},
        ],
    }
    lines = render(doc, True, "running", now)
    text = "\n".join(lines)
    assert "rule by rule, enforce would act / acted:" in text
    row = next(line for line in lines if "cpu-randomx-miner" in line)
    assert "would act: kill 3, kill-on-touch 3; acted: -" in row and "xmrig(4242)" in row
    assert "\x1b" not in text and "\u202e" not in text
    assert "would act: -; acted: kill 1" in next(row for row in lines if "miner-config-keys" in row)
    assert "rule by rule: nothing to act on" in "\n".join(render({"pid": 1}, True, "x", now))
