"""alert: the finding is logged; every response starts with it, and monitor mode does nothing else."""

from gpuguard.events.action_kinds import ALERT
from gpuguard.respond.actions.action import Action

ACTION = Action(
    ALERT,
    None,
    default_on=("suspicious",),
    what="an outcome in the log, nothing else",
)
