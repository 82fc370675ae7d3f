"""suspend: SIGSTOP the offender and keep it stopped for forensics until `gpuguard unblock`."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import SUSPEND, UNBLOCK
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action
from gpuguard.respond.blocks import Block, BlockKind, new_block_id
from gpuguard.respond.process_control import RecycledPid, open_process

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext


def run(
    ctx: ActionContext, verdict: Verdict, state: ProcessState, base: dict[str, Any]
) -> ActionOutcome:
    if ctx.dry_run:
        return ctx.would(
            f"send SIGSTOP to pid {verdict.pid} and keep it stopped", {"signal": "SIGSTOP"}, base
        )
    with ctx.open_offender(verdict, state) as handle:
        handle.send(signal.SIGSTOP)
    block = Block(
        new_block_id(SUSPEND_BLOCK),
        SUSPEND_BLOCK.name,
        time.time(),
        None,
        "stopped for forensics",
        verdict.pid,
        verdict.key.start_time,
        verdict.comm,
        verdict.exe,
    )
    return ctx.placed(block, "SIGSTOP sent; stays stopped until `gpuguard unblock`", base)


def lift_suspend_block(block: Block, root: Path, others: list[Block]) -> str:
    """SIGCONT the stopped process, when it is still the one stopped."""
    try:
        with open_process(block.pid, block.start_time) as handle:
            handle.send(signal.SIGCONT)
        return f"sent SIGCONT to pid {block.pid}"
    except RecycledPid as exc:
        return f"nothing to resume: {exc}"


def suspend_in_place(block: Block, root: Path) -> str:
    """Whether the process is still stopped."""
    letter = _state_letter(block.pid)
    if letter is None:
        return "process gone"
    return "stopped" if letter in ("T", "t") else "running again"


def keep_stopped(ctx: ActionContext, live: list[Block], now: float) -> list[ActionOutcome]:
    """Stop again a suspended process something has resumed: only `unblock` may undo a suspend."""
    outcomes = []
    for block in live:
        if _state_letter(block.pid) in ("T", "t"):
            continue
        common = dict(
            time=now,
            pid=block.pid,
            start_time=block.start_time,
            comm=block.comm,
            exe=block.exe,
            block_id=block.id,
        )
        try:
            with open_process(block.pid, block.start_time) as handle:
                handle.send(signal.SIGSTOP)
        except (RecycledPid, ProcessLookupError):
            ctx.blocks.remove(block.id)
            outcomes.append(
                ActionOutcome(
                    action=UNBLOCK.name,
                    status="done",
                    reason="the suspended process has exited",
                    **common,
                )
            )
            continue
        outcomes.append(
            ActionOutcome(
                action=ctx.name,
                status="done",
                reason="it had been resumed by something else: stopped again",
                detail={"signal": "SIGSTOP"},
                **common,
            )
        )
    return outcomes


def _state_letter(pid: int) -> str | None:
    """The process's state letter from /proc (T: stopped), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


SUSPEND_BLOCK = BlockKind("suspend", "s", lift_suspend_block, suspend_in_place)


ACTION = Action(
    SUSPEND,
    run,
    blocks=(SUSPEND_BLOCK,),
    sweep=keep_stopped,
    what="SIGSTOP; the process stays stopped for forensics (a SIGCONT from elsewhere is undone "
    "at the agent's next sweep)",
    undone_by="`gpuguard unblock ID` (SIGCONT)",
)
