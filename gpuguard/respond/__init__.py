"""Response: what gpuguard does about a verdict in enforce mode (gpuguard.respond.responder).

Actions: alert, suspend, kill, kill-on-touch (kernel), quarantine (cgroup
device program), block-egress (cgroup connect programs + nftables sets) and
operator hooks, one module each under ``actions/`` and listed there in
``ACTIONS``; blocks are recorded and pinned so they outlive the agent.
Every action ends as an :class:`~gpuguard.events.agent_events.ActionOutcome`.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate``, ``gpuguard.detect`` and itself;
never ``gpuguard.outputs`` (shared data lives in events) or commands
(tests/test_layers.py).
"""

from gpuguard.respond.responder import Responder
from gpuguard.respond.settings import ResponseSettings, parse_response_settings

__all__ = ["Responder", "ResponseSettings", "parse_response_settings"]
