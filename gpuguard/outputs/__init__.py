"""Outputs: terminal views, JSON lines, the agent's SIEM log (ECS, OCSF, CEF to a
file, stdout or syslog) and its Prometheus metrics.

Owns how verdicts, findings, events and the agent's own events are shown or
shipped; it decides nothing.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate``, ``gpuguard.detect`` and itself;
never ``gpuguard.respond`` (shared data lives in events) or commands
(tests/test_layers.py).
"""
