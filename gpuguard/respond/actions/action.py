"""The Action record: one response action's name, settings, behaviour, hooks and the blocks it leaves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuguard.config.schema import Key
from gpuguard.events.action_kinds import ActionKind
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, BlockKind
from gpuguard.respond.cgroup_blocks import CgroupBlocker

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext

    Run = Callable[[ActionContext, Verdict, ProcessState, dict[str, Any]], ActionOutcome]
    Start = Callable[[ActionContext, list[Block]], None]
    Sweep = Callable[[ActionContext, list[Block], float], list[ActionOutcome]]
    Lifted = Callable[[ActionContext, Block], None]


@dataclass(frozen=True, slots=True)
class Action:
    """A response step: its kind (name, ECS/OCSF terms), settings, what runs it, what it leaves.

    Its hooks run in an acting responder (enforce mode, not a dry run), each with the action's
    own :class:`~gpuguard.respond.context.ActionContext` and its unexpired blocks (those of
    the kinds in ``blocks``): ``start`` when the responder starts (a restart restores them
    here), ``sweep`` at each housekeeping sweep, ``lifted`` when it lifted one of them.
    """

    kind: ActionKind
    run: Run | None  # (context, verdict, state, base fields) -> outcome; None: the alert itself
    section: str = ""  # its key under ``response:`` ("": no settings of its own)
    # the keys of its ``response:`` section (gpuguard.config.schema); each fills the field it
    # names of ``settings``, the action's own frozen dataclass, where its default is declared
    options: tuple[Key, ...] = ()
    settings: type | None = None  # its options' model; the context hands it an instance
    default_on: tuple[str, ...] = ()  # the verdicts it answers when ``response.actions`` is unset
    blocks: tuple[BlockKind, ...] = ()  # the kinds of block it leaves behind
    start: Start | None = None  # (context, its live blocks): at start; restore after a restart
    sweep: Sweep | None = None  # (context, its live blocks, now) -> outcomes: housekeeping
    lifted: Lifted | None = None  # (context, block): the responder lifted one of its blocks
    # the touch (gpu-open, connect, exec) of an outcome that reports a kill the kernel made, or
    # None: the agent counts those in gpuguard_touch_kills_total{reason}
    touch_kill: Callable[[ActionOutcome], str | None] | None = None
    # the capabilities its options add to its kind's (e.g. host-wide nftables: CAP_NET_ADMIN)
    extra_capabilities: Callable[[Any], tuple[str, ...]] | None = None
    what: str = ""  # what happens, one Markdown paragraph (docs/respond.md's action table)
    undone_by: str = "—"  # what lifts it (the same table)

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def acts(self) -> bool:
        """It does something to the offender or the host (the alert itself only logs)."""
        return self.run is not None

    def capabilities(self, options: Any) -> tuple[str, ...]:
        """The capabilities it needs to act with ``options`` (its settings instance)."""
        extra = self.extra_capabilities(options) if self.extra_capabilities else ()
        return (*self.kind.capabilities, *extra)


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


def cgroup_programs(ctx: ActionContext) -> CgroupBlocker:
    """The cgroup programs quarantine and block-egress share (a part of the responder's life)."""
    bpf_pins.ensure_pin_root(str(ctx.pin_root))
    return CgroupBlocker(ctx.pin_root, ctx.blocks, ctx.settings.quarantine_parent)


def load_cgroup_programs(ctx: ActionContext, live: list[Block]) -> None:
    """Compile the cgroup programs at start (~0.3 s), so the first block is not slowed by it.

    Once per responder: quarantine and block_egress both start with it, and a compile that
    failed for one is not tried again for the other.  A failure here is reported by the action
    that needs the programs (which tries again then).
    """
    if ctx.loaded(cgroup_programs) is not None:
        return
    try:
        ctx.part(cgroup_programs).load()
    except Exception:  # noqa: BLE001 - reported by the action that needs it
        pass
