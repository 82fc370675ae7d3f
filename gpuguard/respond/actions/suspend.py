"""suspend: SIGSTOP the offender and keep it stopped for forensics until `gpuguard unblock`."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import SUSPEND
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action
from gpuguard.respond.blocks import Block, BlockKind, new_block_id
from gpuguard.respond.process_control import RecycledPid, open_process

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.responder import Responder


def run(r: Responder, verdict: Verdict, state: ProcessState, base: dict[str, Any]) -> ActionOutcome:
    if r.dry_run:
        return ActionOutcome(
            action=SUSPEND.name,
            status="dry-run",
            detail={"signal": "SIGSTOP"},
            **base,
            reason=f"would send SIGSTOP to pid {verdict.pid} and keep it stopped",
        )
    with r.open_offender(verdict, state) as handle:
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
    return r.placed(
        block, SUSPEND.name, "SIGSTOP sent; stays stopped until `gpuguard unblock`", base
    )


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
    try:
        with open(f"/proc/{block.pid}/stat") as f:
            letter = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "process gone"
    return "stopped" if letter in ("T", "t") else "running again"


SUSPEND_BLOCK = BlockKind("suspend", "s", lift_suspend_block, suspend_in_place)


ACTION = Action(SUSPEND, run, blocks=(SUSPEND_BLOCK,))
