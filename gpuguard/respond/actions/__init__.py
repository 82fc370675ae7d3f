"""The response actions, listed here in the order they run; one module per action.

The kernel blocks go in first so a respawn or a child started while the
offender dies is already caught.  Adding an action: its module here (its run,
options and their model, block kinds, hooks and doc row: :class:`Action`), its
entry in ``ACTIONS``, and its :class:`~gpuguard.events.action_kinds.ActionKind`
(name, ECS/OCSF terms) in ``gpuguard.events.action_kinds``.  Nothing else names it.

May import: what ``gpuguard.respond`` may, below the responder; the action
context only for type checking.
"""

from gpuguard.events.agent_events import ActionOutcome
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


def touch_kill_of(outcome: ActionOutcome) -> str | None:
    """The touch (gpu-open, connect, exec) when ``outcome`` reports a kill the kernel made."""
    action = BY_NAME.get(outcome.action)
    if action is None or action.touch_kill is None:
        return None
    return action.touch_kill(outcome)


__all__ = ["ACTIONS", "BLOCKS", "BLOCK_KINDS", "BY_NAME", "STEPS", "Action", "touch_kill_of"]
