"""suspend: SIGSTOP the offender and keep it stopped for forensics until `gpuguard unblock`."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import SUSPEND
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action
from gpuguard.respond.blocks import Block, BlockKind, new_block_id

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.score import Verdict
    from gpuguard.respond.responder import Responder


SUSPEND_BLOCK = BlockKind("suspend", "s")


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


ACTION = Action(SUSPEND, run, blocks=(SUSPEND_BLOCK,))
