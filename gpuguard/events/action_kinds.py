"""Each response action's name and ECS/OCSF terms: the vocabulary detect, respond and outputs share.

One :class:`ActionKind` per action outcome a log can carry.  It lives here, below
detect, respond and outputs, because all three read it: the rules file may name
the ones with ``in_rules`` (detect validates them), the responder runs them
(``gpuguard.respond.actions`` holds the behaviour), and the ECS/OCSF renderers
map them (``gpuguard.outputs.records``) without importing respond.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ActionKind:
    """An action's name, whether a rules file may name it, and its ECS and OCSF terms."""

    name: str
    in_rules: bool = False  # a rules file's ``actions:`` may name it
    ecs_type: str = "info"  # ECS event.type
    ecs_category: str = "process"  # ECS event.category
    ocsf_class: int = 7001  # OCSF Remediation class: 7001 Activity, 7003 Process, 7004 Network
    ocsf_activity: tuple[int, str] = (99, "Other")  # D3FEND: 1 Isolate, 2 Evict, 3 Restore
    # Capabilities beyond monitor mode's that it needs (docs/deploy.md, "Capabilities")
    capabilities: tuple[str, ...] = ()


ISOLATE, EVICT, RESTORE = (1, "Isolate"), (2, "Evict"), (3, "Restore")

# In the order of strength a rules file and a guard policy rank them (weakest first).
ALERT = ActionKind("alert", in_rules=True)
# Signals to another user's process need CAP_KILL (the eBPF programs of kill-on-touch do not).
SUSPEND = ActionKind(
    "suspend", True, "change", ocsf_class=7003, ocsf_activity=ISOLATE, capabilities=("CAP_KILL",)
)
KILL = ActionKind(
    "kill", True, "end", ocsf_class=7003, ocsf_activity=EVICT, capabilities=("CAP_KILL",)
)
# ECS expects denied/allowed under intrusion_detection (an IPS's verdict), not under process.
QUARANTINE = ActionKind("quarantine", True, "denied", "intrusion_detection", 7003, ISOLATE)
BLOCK_EGRESS = ActionKind("block-egress", True, "denied", "network", 7004, ISOLATE)
KILL_ON_TOUCH = ActionKind("kill-on-touch", False, "denied", "intrusion_detection", 7003, EVICT)
# Outcomes that are not steps of a response: a hook's result, a block lifted.
HOOK = ActionKind("hook")
UNBLOCK = ActionKind("unblock", False, "allowed", "intrusion_detection", ocsf_activity=RESTORE)

ACTION_KINDS = (ALERT, SUSPEND, KILL, QUARANTINE, BLOCK_EGRESS, KILL_ON_TOUCH, HOOK, UNBLOCK)
BY_NAME = {kind.name: kind for kind in ACTION_KINDS}
RULE_ACTIONS = tuple(kind.name for kind in ACTION_KINDS if kind.in_rules)


def kind_of(name: str) -> ActionKind:
    """The kind named ``name``; an unknown name reports as a generic remediation."""
    return BY_NAME.get(name) or ActionKind(name)
