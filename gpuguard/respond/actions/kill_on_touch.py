"""kill-on-touch: the kernel kills the offender's executable or pids at a GPU open, connect or exec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import KILL_ON_TOUCH
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action, Option, name_block
from gpuguard.respond.exec_match import block_target, descendants
from gpuguard.respond.touch import TOUCH_BLOCK
from gpuguard.sources.identity import read_while_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.score import Verdict
    from gpuguard.respond.responder import Responder


def run(r: Responder, verdict: Verdict, state: ProcessState, base: dict[str, Any]) -> ActionOutcome:
    ttl = r.settings.touch_ttl_s
    prefixes = r.settings.shared_exe_prefixes
    with r.open_offender(verdict, state) as handle:
        # What the block may name, read while the verified process is alive: never an
        # interpreter, never a file others run (gpuguard.respond.exec_match).
        target = read_while_alive(handle.pidfd, lambda: block_target(verdict.pid, prefixes))
        tree = read_while_alive(handle.pidfd, lambda: descendants(verdict.pid))
        detail = {
            "target": target.kind,
            "exe": target.exe,
            "interpreter": target.interpreter,
            "script": target.script.path if target.script else None,
        }
        if r.dry_run:
            return ActionOutcome(
                action=KILL_ON_TOUCH.name,
                status="dry-run",
                **base,
                detail=detail,
                reason=f"would block for {ttl:g} s: {target.why}",
            )
        touch = r.touch_blocker()
        touch.set_scope(r.scope_ids())
        block = touch.add(
            verdict.pid,
            target,
            tree,
            ttl,
            reason=f"{verdict.verdict} verdict",
            pidfd=handle.pidfd,
        )
    name_block(block, verdict)
    return r.placed(block, KILL_ON_TOUCH.name, target.why, base)


ACTION = Action(
    KILL_ON_TOUCH,
    run,
    section="kill_on_touch",
    options=(
        Option("ttl_s", "touch_ttl_s", "number"),
        Option("shared_exe_prefixes", "shared_exe_prefixes", "texts"),
        Option("breaker_victims_per_minute", "breaker_victims_per_minute", "count"),
    ),
    default_on=("malicious",),
    blocks=(TOUCH_BLOCK,),
)
