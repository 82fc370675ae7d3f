"""kill-on-touch: the kernel kills the offender's executable or pids at a GPU open, connect or exec."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import KILL_ON_TOUCH
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action, Option, name_block
from gpuguard.respond.exec_match import block_target, descendants
from gpuguard.respond.touch import BREAKER_WINDOW_S, TOUCH_BLOCK
from gpuguard.sources.proc.identity import read_while_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
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


def on_touch_kill(r: Responder, report: dict[str, Any]) -> None:
    """One record for each kill the kernel (or the exec match) made, and for a breaker trip."""
    block = next(
        (
            b
            for b in r.store.load()
            if b.kind == TOUCH_BLOCK.name and b.detail.get("number") == report.get("number")
        ),
        None,
    )
    kind = report.get("kind", "kill")
    if kind == "lost":
        r.emit(
            ActionOutcome(
                time=time.time(),
                action=KILL_ON_TOUCH.name,
                status="lost",
                reason=f"{report['count']} kill-on-touch {report['what']} found no room in "
                "the kernel's ring buffer: the kernel acted, this log has no record of it",
                detail={"lost": report["count"], "what": report["what"]},
            )
        )
        return
    if kind == "error":
        r.emit(
            ActionOutcome(
                time=time.time(),
                action=KILL_ON_TOUCH.name,
                status="failed",
                reason=f"a kill-on-touch report could not be handled: {report['error']}",
            )
        )
        return
    if kind == "breaker":
        victims = report["victims"]
        if block is not None:
            block.detail["suspended"] = True
            r.store.save(block)
        r.emit(
            ActionOutcome(
                time=time.time(),
                action=KILL_ON_TOUCH.name,
                status="suspended",
                pid=block.pid if block else 0,
                comm=block.comm if block else "",
                exe=block.exe if block else "",
                block_id=block.id if block else None,
                reason=(
                    f"circuit breaker: the block killed {len(victims)} processes that are not "
                    f"the offender's own within {BREAKER_WINDOW_S:g} s (more than "
                    f"{r.settings.breaker_victims_per_minute}); it is suspended in the "
                    "kernel and kills nothing until `gpuguard unblock`"
                ),
                detail={"victims": victims, "number": report["number"]},
            )
        )
        return
    what = {
        "gpu-open": f"at its GPU open of {report['path']}",
        "connect": "at its connect",
        "exec": f"at exec: {report.get('matched') or report['path']}",
    }.get(report["reason"], report["reason"])
    r.emit(
        ActionOutcome(
            time=time.time(),
            action=KILL_ON_TOUCH.name,
            status="done",
            pid=report["tgid"],
            comm=report["comm"],
            exe=report.get("exe") or (block.exe if block else ""),
            reason=f"killed {what}"
            + (
                ""
                if report.get("tree")
                else " (not the offender's own tree or an exact copy: counted by the breaker)"
            ),
            block_id=block.id if block else None,
            detail={
                "victim": {
                    "pid": report["tgid"],
                    "exe": report.get("exe", ""),
                    "cmdline": report.get("cmdline", ""),
                },
                "touch": report["reason"],
                "number": report["number"],
                "offenders_own": report.get("tree", False),
                "path": report["path"],
            },
        )
    )


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
