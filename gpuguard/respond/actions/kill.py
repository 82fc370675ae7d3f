"""kill: SIGTERM the offender (its process group, or its container's cgroup), SIGKILL after a grace."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.events.action_kinds import KILL
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions.action import Action, Option
from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.respond.process_control import (
    RecycledPid,
    open_process,
    process_group_members,
    start_time_of,
)

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.responder import Responder


def run(r: Responder, verdict: Verdict, state: ProcessState, base: dict[str, Any]) -> ActionOutcome:
    grace = r.settings.kill_grace_s
    target = r.settings.kill_target
    facts = state.facts
    if target == "cgroup" and not (facts and facts.container_id):
        target = "process"  # only a container's cgroup is ever killed whole
    detail = {"signal": "SIGTERM", "sigkill_after_s": grace, "target": target}
    if target == "cgroup":
        cgroup_dir = os.path.join(cgroup2_mount(), cgroup2_of(verdict.pid).lstrip("/"))
        detail.update(signal="cgroup.kill", cgroup=cgroup_dir)
        if r.dry_run:
            return ActionOutcome(
                action=KILL.name,
                status="dry-run",
                reason=f"would write 1 to {cgroup_dir}/cgroup.kill",
                detail=detail,
                **base,
            )
        with r.open_offender(verdict, state):
            Path(cgroup_dir, "cgroup.kill").write_text("1")
        return ActionOutcome(
            action=KILL.name,
            status="done",
            reason="killed every process of the container's cgroup",
            detail=detail,
            **base,
        )
    pids = [verdict.pid]
    if target == "group":
        pgid = os.getpgid(verdict.pid)
        detail["pgid"] = pgid
        pids += [
            p
            for p in process_group_members(pgid)
            if p != verdict.pid and not r.guard.refusal(p, facts)
        ]
    if r.dry_run:
        return ActionOutcome(
            action=KILL.name,
            status="dry-run",
            detail=detail,
            **base,
            reason=f"would send SIGTERM to pid(s) {pids} (start time checked), SIGKILL after {grace:g} s",
        )
    handle = r.open_offender(verdict, state)
    handle.send(signal.SIGTERM)
    others = []
    for pid in pids[1:]:
        try:
            other = open_process(pid, start_time_of(pid))
            other.send(signal.SIGTERM)
            others.append(other)
        except (RecycledPid, OSError):
            continue
    r.background(finish_kill, r, [handle, *others], grace, base)
    return ActionOutcome(
        action=KILL.name,
        status="done",
        detail=detail,
        **base,
        reason=f"SIGTERM sent; SIGKILL after {grace:g} s unless it exits",
    )


def finish_kill(r: Responder, handles: list, grace: float, base: dict[str, Any]) -> None:
    deadline = time.monotonic() + grace
    for handle in handles:
        try:
            if not handle.wait_exit(deadline - time.monotonic()):
                handle.send(signal.SIGKILL)
                handle.wait_exit(1.0)
                r.emit(
                    ActionOutcome(
                        **{**base, "time": time.time()},
                        action=KILL.name,
                        status="done",
                        reason=f"pid {handle.pid} ignored SIGTERM for {grace:g} s: SIGKILL sent",
                        detail={"signal": "SIGKILL"},
                    )
                )
        except ProcessLookupError:
            pass
        finally:
            handle.close()


ACTION = Action(
    KILL,
    run,
    section="kill",
    options=(
        Option("grace_s", "kill_grace_s", "number"),
        Option("target", "kill_target", "choice", ("process", "group", "cgroup")),
    ),
    default_on=("malicious",),
)
