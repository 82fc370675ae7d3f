"""Outputs: terminal views, JSON lines, the agent's SIEM log and its Prometheus metrics.

The SIEM log is ECS, OCSF or CEF, to a file, stdout or syslog.

Owns how verdicts, findings, events and the agent's own events are shown or
shipped; it decides nothing.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate``, ``gpuguard.detect`` and itself;
never ``gpuguard.respond`` (shared data lives in events) or commands
(tests/test_layers.py).
"""
