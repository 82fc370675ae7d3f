"""The Responder: a verdict in, the planned actions done (or described, or refused), every outcome out.

``respond(verdict, state, now)`` plans the steps (the ``response.actions``
entry for the verdict, a stronger action named by the rules file's
``actions:``, and ``response.rule_actions`` for each matched rule), checks the
safety guard and the per-minute action budget, then runs them in a fixed
order (kernel blocks first, then signals).  Every outcome is an
:class:`ActionOutcome`: ``respond`` (and ``sweep``, ``lift``) return the ones
known at once, for the caller to log; what happens later (SIGKILL after the
grace period, hook results, kill-on-touch kills, a failed restore) is passed
to ``emit``, from a background thread.  Monitor mode
never acts: it emits one alert naming what enforce mode would do.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.scoring.score import Verdict
from gpuguard.errors import GpuguardError
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import bpf_pins
from gpuguard.respond.actions import BY_NAME, STEPS
from gpuguard.respond.actions.kill_on_touch import on_touch_kill
from gpuguard.respond.blocks import Block, BlockStore
from gpuguard.respond.cgroup_blocks import CgroupBlocker
from gpuguard.respond.hooks import run_hook
from gpuguard.respond.lift import lift_block
from gpuguard.respond.process_control import (
    Guard,
    ProcessHandle,
    RecycledPid,
    open_process,
)
from gpuguard.respond.settings import ResponseSettings
from gpuguard.respond.touch import TouchBlocker, scope_cgroup_ids
from gpuguard.sources.proc.identity import (
    ExitGenerations,
    OffenderExited,
    open_verified,
    pidfd_alive,
)

MODES = ("monitor", "enforce")


class Responder:
    def __init__(
        self,
        settings: ResponseSettings,
        *,
        mode: str = "monitor",
        dry_run: bool = False,
        emit: Callable[[ActionOutcome], None] | None = None,
        generations: ExitGenerations | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.settings = settings
        self.mode = mode
        self.dry_run = dry_run
        self.emit = emit or (lambda outcome: None)
        self.generations = generations  # the sensor's exit generations (exact identities)
        self.guard = Guard(
            scope=settings.scope, cgroups=settings.cgroups, protect_exes=settings.protect_exes
        )
        self.store = BlockStore(settings.state_dir)
        self.root = Path(settings.pin_root)
        self._recent: deque[float] = deque()
        self._workers: list[threading.Thread] = []
        self._touch: TouchBlocker | None = None
        self._cgroups: CgroupBlocker | None = None
        self._lock = threading.Lock()
        if self.acting:
            self._restore()
            self._prepare()

    @property
    def acting(self) -> bool:
        return self.mode == "enforce" and not self.dry_run

    # -- planning --------------------------------------------------------------------------------
    def plan(self, verdict: Verdict) -> list[str]:
        steps = set(self.settings.actions.get(verdict.verdict, ()))
        if verdict.action in STEPS:
            steps.add(verdict.action)
        for evidence in verdict.evidence:
            steps.update(self.settings.rule_actions.get(evidence.rule_id, ()))
        if verdict.allowlisted:
            steps &= {"alert"}
        return [s for s in STEPS if s in steps]

    # -- responding ------------------------------------------------------------------------------
    def respond(self, verdict: Verdict, state: ProcessState, now: float) -> list[ActionOutcome]:
        steps = self.plan(verdict)
        if not steps:
            return []
        facts = state.facts
        base = dict(
            time=now,
            pid=verdict.pid,
            start_time=verdict.key.start_time,
            comm=verdict.comm,
            exe=verdict.exe,
            verdict=verdict.verdict,
            score=verdict.score,
            rule_ids=[e.rule_id for e in verdict.evidence],
        )
        acts = [s for s in steps if s != "alert"]
        if self.mode == "monitor" or not acts:
            would = f"; enforce mode would: {', '.join(acts)}" if acts else ""
            outcomes = [
                ActionOutcome(
                    action="alert",
                    status="done",
                    reason=f"{verdict.verdict} verdict{would}",
                    detail={"planned": steps},
                    **base,
                )
            ]
            if self.mode == "enforce":
                outcomes += self._hooks(verdict, state, steps, base)
            return outcomes
        refusal = self.guard.refusal(verdict.pid, facts, allowlisted=verdict.allowlisted)
        if refusal:
            return [ActionOutcome(action=s, status="refused", reason=refusal, **base) for s in acts]
        if not self.dry_run and not self._spend(now):
            return [
                ActionOutcome(
                    action="alert",
                    status="rate-limited",
                    detail={"planned": steps},
                    reason=f"action budget of {self.settings.max_actions_per_minute}/min spent: degraded to an alert",
                    **base,
                )
            ]
        outcomes = [
            ActionOutcome(
                action="alert", status="done", reason=f"{verdict.verdict} verdict", **base
            )
        ]
        for step in acts:
            outcomes.append(self._step(step, verdict, state, base))
        outcomes += self._hooks(verdict, state, steps, base)
        return outcomes

    def __call__(self, verdict: Verdict, state: ProcessState, now: float) -> list[ActionOutcome]:
        """The agent's action interface is a callable ``(verdict, state, now)``: the same as :meth:`respond`."""
        return self.respond(verdict, state, now)

    def _spend(self, now: float) -> bool:
        while self._recent and now - self._recent[0] >= 60.0:
            self._recent.popleft()
        if len(self._recent) >= self.settings.max_actions_per_minute:
            return False
        self._recent.append(now)
        return True

    def _step(
        self, step: str, verdict: Verdict, state: ProcessState, base: dict[str, Any]
    ) -> ActionOutcome:
        run = BY_NAME[step].run
        try:
            return run(self, verdict, state, base)
        except (RecycledPid, OffenderExited) as exc:
            return ActionOutcome(
                action=step,
                status="skipped",
                reason=f"offender exited: {exc}; nothing was sent to whoever has the pid now",
                **base,
            )
        except ProcessLookupError:
            return ActionOutcome(
                action=step,
                status="skipped",
                reason="the process exited before it was reached",
                **base,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is reported as an outcome, never raised into the agent
            if isinstance(exc, GpuguardError):
                text = f"{exc.cause} (fix: {exc.fix})" if exc.fix else exc.cause
            else:
                text = str(exc) or type(exc).__name__
            return ActionOutcome(action=step, status="failed", reason=text, **base)

    def open_offender(self, verdict: Verdict, state: ProcessState) -> ProcessHandle:
        """A pidfd for exactly the process the verdict is about (raises OffenderExited/RecycledPid).

        The pidfd the correlator opened at its exec (proven then by the exit generation), or
        one opened now and proven by the generation (gpuguard.sources.proc.identity); a process seen
        only through /proc falls back to the start-time check of :func:`open_process`.
        """
        if state.pidfd is not None:  # opened at its exec, proven then by the generation
            try:
                handle = ProcessHandle(verdict.pid, os.dup(state.pidfd))
            except OSError:
                handle = None
            if handle is not None:
                if pidfd_alive(handle.pidfd):
                    return handle
                handle.close()
                raise OffenderExited(f"pid {verdict.pid} has exited")
        if self.generations is not None and state.exit_gen is not None:
            return ProcessHandle(
                verdict.pid, open_verified(verdict.pid, state.exit_gen, self.generations)
            )
        return open_process(verdict.pid, verdict.key.start_time)

    # -- the actions -----------------------------------------------------------------------------
    def scope_ids(self) -> set[int] | None:
        """The cgroup ids the kernel may act in (with their descendants); None: everywhere."""
        return scope_cgroup_ids(self.settings.scope, self.settings.cgroups)

    def placed(self, block: Block, action: str, reason: str, base: dict[str, Any]) -> ActionOutcome:
        self.store.save(block)
        return ActionOutcome(
            action=action,
            status="done",
            reason=reason,
            block_id=block.id,
            expires=block.expires,
            detail=dict(block.detail),
            **base,
        )

    # -- hooks and background work ---------------------------------------------------------------
    def _hooks(
        self, verdict: Verdict, state: ProcessState, steps: list[str], base: dict[str, Any]
    ) -> list[ActionOutcome]:
        """Start the hooks for this verdict (results come through ``emit``); in a dry run, describe them."""
        hooks = [h for h in self.settings.hooks if verdict.verdict in h.on]
        if not hooks:
            return []
        finding = {
            "verdict": verdict.to_json(),
            "actions": steps,
            "process": state.facts.to_record() if state.facts else {"pid": verdict.pid},
            "connections": [{"address": a, "port": p} for (a, p) in state.connections],
        }
        described = []
        for hook in hooks:
            if self.dry_run:
                described.append(
                    ActionOutcome(
                        action="hook",
                        status="dry-run",
                        detail={"hook": hook.name, "argv": list(hook.argv)},
                        reason=f"would run {hook.name} with the finding on stdin",
                        **base,
                    )
                )
                continue
            self.background(self._run_hook, hook, finding, base)
        return described

    def _run_hook(self, hook, finding: dict[str, Any], base: dict[str, Any]) -> None:
        detail = run_hook(hook, finding)
        self.emit(
            ActionOutcome(
                **{**base, "time": time.time()},
                action="hook",
                status="done" if detail["ok"] else "failed",
                reason=detail.get("error", f"exit {detail.get('exit_code')}"),
                detail=detail,
            )
        )

    def background(self, target: Callable, *args: Any) -> None:
        worker = threading.Thread(target=target, args=args, daemon=True, name="gpuguard-respond")
        worker.start()
        with self._lock:
            self._workers = [w for w in self._workers if w.is_alive()] + [worker]

    def wait(self, timeout_s: float = 30.0) -> None:
        """Let delayed kills and hooks finish (the agent calls this at shutdown)."""
        deadline = time.monotonic() + timeout_s
        for worker in list(self._workers):
            worker.join(max(0.0, deadline - time.monotonic()))

    # -- kernel parts ----------------------------------------------------------------------------
    def touch_blocker(self) -> TouchBlocker:
        if self._touch is None:
            bpf_pins.ensure_pin_root(str(self.root))
            self._touch = TouchBlocker(
                self.root,
                lambda report: on_touch_kill(self, report),
                in_scope=lambda pid: self.guard.outside_scope(pid) is None,
                breaker_limit=self.settings.breaker_victims_per_minute,
            )
            self._touch.set_scope(self.scope_ids())
        return self._touch

    def cgroup_blocker(self) -> CgroupBlocker:
        if self._cgroups is None:
            bpf_pins.ensure_pin_root(str(self.root))
            self._cgroups = CgroupBlocker(self.root, self.store, self.settings.quarantine_parent)
        return self._cgroups

    def _prepare(self) -> None:
        """Compile the cgroup programs now (~0.3 s) so the first quarantine is not slowed by it.

        kill-on-touch stays unloaded until the first block: its syscall tracepoints tax every
        process on the host.  A failure here is reported when an action needs the programs.
        """
        try:
            self.cgroup_blocker().load()
        except Exception:  # noqa: BLE001 - reported by the action that needs it
            self._cgroups = None

    def _restore(self) -> None:
        """After a restart: re-attach kill-on-touch for live blocks (their map entries are pinned)."""
        now = time.time()
        live = [b for b in self.store.load() if b.kind == "kill-on-touch" and not b.expired(now)]
        if not live:
            return
        try:
            touch = self.touch_blocker()
        except Exception as exc:  # noqa: BLE001 - reported, the agent keeps running
            self.emit(
                ActionOutcome(
                    time=now,
                    action="kill-on-touch",
                    status="failed",
                    reason=f"cannot restore kill-on-touch blocks: {getattr(exc, 'cause', exc)}",
                )
            )
            return
        for block in live:
            touch.restore(block)

    def sweep(self, now: float) -> list[ActionOutcome]:
        """Lift expired blocks, and stop again a suspended process something has resumed.

        The kernel already ignores expired map entries; this removes them and their records.
        A SIGCONT from the offender's parent must not undo a suspend: only `unblock` does.
        """
        outcomes = []
        if self._touch is not None and self.settings.scope == "containers":
            self._touch.set_scope(self.scope_ids())  # containers started since are in scope now
        for block in self.store.load():
            if block.expired(now):
                outcomes.append(self.lift(block, now, reason="expired"))
            elif block.kind == "suspend" and self.acting:
                outcome = self._keep_stopped(block, now)
                if outcome is not None:
                    outcomes.append(outcome)
        return outcomes

    def _keep_stopped(self, block: Block, now: float) -> ActionOutcome | None:
        try:
            with open(f"/proc/{block.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("T", "t"):
            return None
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
            self.store.remove(block.id)
            return ActionOutcome(
                action="unblock", status="done", reason="the suspended process has exited", **common
            )
        return ActionOutcome(
            action="suspend",
            status="done",
            reason="it had been resumed by something else: stopped again",
            detail={"signal": "SIGSTOP"},
            **common,
        )

    def lift(self, block: Block, now: float, reason: str = "unblocked") -> ActionOutcome:
        try:
            said = lift_block(block, self.store, self.root)
            status = "done"
        except OSError as exc:
            said, status = str(exc), "failed"
        if self._touch is not None and block.kind == "kill-on-touch":
            self._touch.forget(block.detail.get("number", 0))
        return ActionOutcome(
            time=now,
            action="unblock",
            status=status,
            pid=block.pid,
            comm=block.comm,
            exe=block.exe,
            reason=f"{reason}: {said}",
            block_id=block.id,
        )

    def close(self) -> None:
        self.wait(timeout_s=self.settings.kill_grace_s + 2.0)
        if self._touch is not None:
            self._touch.close()
            self._touch = None
        if self._cgroups is not None:
            self._cgroups.close()
            self._cgroups = None
