"""Outputs: terminal views, SIEM JSON (ECS, OCSF), JSON lines and metrics.

Owns how verdicts, findings, events and the agent's own events are shown or
shipped; it decides nothing.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate``, ``gpuguard.detect`` and itself;
never ``gpuguard.respond`` (shared data lives in events) or commands
(tests/test_layers.py).
"""
