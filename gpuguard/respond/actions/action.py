"""The Action record: one response action's name, settings, behaviour and the blocks it leaves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import ActionKind
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.blocks import Block, BlockKind

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.responder import Responder

    Run = Callable[[Responder, Verdict, ProcessState, dict[str, Any]], ActionOutcome]


@dataclass(frozen=True, slots=True)
class Option:
    """One key of an action's ``response:`` section and the ResponseSettings field it fills.

    The default is the field's default in :class:`~gpuguard.respond.settings.ResponseSettings`
    (declared once there).  ``type``: number (>= 0), count (an int >= 0), text, flag, texts,
    networks (CIDRs) or choice (one of ``choices``).
    """

    key: str
    field: str
    type: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Action:
    """A response step: its kind (name, ECS/OCSF terms), settings, what runs it, what it leaves."""

    kind: ActionKind
    run: Run | None  # (responder, verdict, state, base fields) -> outcome; None: the alert itself
    section: str = ""  # its key under ``response:`` ("": no settings of its own)
    options: tuple[Option, ...] = ()
    default_on: tuple[str, ...] = ()  # the verdicts it answers when ``response.actions`` is unset
    blocks: tuple[BlockKind, ...] = ()  # the kinds of block it leaves behind

    @property
    def name(self) -> str:
        return self.kind.name


def name_block(block: Block, verdict: Verdict) -> None:
    """Name the offender in a block a lower layer made from a pid."""
    block.start_time = verdict.key.start_time
    block.comm = verdict.comm
    block.exe = block.exe or verdict.exe


def note_exit_during_move(outcome: ActionOutcome, alive: bool) -> ActionOutcome:
    """A cgroup move names a pid: when the offender exited meanwhile, say the move may have missed."""
    if not alive:
        outcome.detail["offender_exited_during_move"] = True
        outcome.reason += (
            "; the offender exited while it was moved: its pid may name another process now "
            "(see the block's cgroup, or `gpuguard unblock` it)"
        )
    return outcome
