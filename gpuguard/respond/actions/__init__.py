"""The response actions, listed here in the order they run; one module per action.

The kernel blocks go in first so a respawn or a child started while the
offender dies is already caught.  Adding an action: its module here, its entry
in ``ACTIONS``, and its :class:`~gpuguard.events.action_kinds.ActionKind` (name,
ECS/OCSF terms) in ``gpuguard.events.action_kinds``.

May import: what ``gpuguard.respond`` may; the responder only for type checking.
"""

from gpuguard.respond.actions import alert, block_egress, kill, kill_on_touch, quarantine, suspend
from gpuguard.respond.actions.action import Action

ACTIONS: tuple[Action, ...] = (
    alert.ACTION,
    kill_on_touch.ACTION,
    quarantine.ACTION,
    block_egress.ACTION,
    suspend.ACTION,
    kill.ACTION,
)
BY_NAME = {action.name: action for action in ACTIONS}
STEPS = tuple(action.name for action in ACTIONS)  # in the order they run
BLOCKS = {kind.name: kind for action in ACTIONS for kind in action.blocks}
BLOCK_KINDS = tuple(BLOCKS)

__all__ = ["ACTIONS", "BLOCKS", "BLOCK_KINDS", "BY_NAME", "STEPS", "Action"]
