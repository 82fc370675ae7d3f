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

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.scoring.score import Verdict
from gpuguard.errors import GpuguardError
from gpuguard.events.action_kinds import ALERT, HOOK, UNBLOCK
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond.actions import ACTIONS, Action
from gpuguard.respond.blocks import Block, BlockStore
from gpuguard.respond.context import ActionContext, Parts, would
from gpuguard.respond.hooks import run_hook
from gpuguard.respond.intent import Intent, intent_of
from gpuguard.respond.lift import lift_block
from gpuguard.respond.process_control import Guard, RecycledPid
from gpuguard.respond.settings import ResponseSettings, options_of
from gpuguard.sources.proc.identity import ExitGenerations, OffenderExited
from gpuguard.sources.proc.pod_names import PodNames

MODES = ("monitor", "enforce")


class Responder:
    """Plans and runs the actions for a verdict; never branches on an action's name.

    Each action runs with its own :class:`ActionContext` (never this object), and its hooks
    (start, sweep, lifted) run here; ``actions`` is the registry (``ACTIONS`` unless a test
    brings its own).
    """

    def __init__(
        self,
        settings: ResponseSettings,
        *,
        mode: str = "monitor",
        dry_run: bool = False,
        emit: Callable[[ActionOutcome], None] | None = None,
        generations: ExitGenerations | None = None,
        actions: tuple[Action, ...] = ACTIONS,
        pod_names: PodNames | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.settings = settings
        self.mode = mode
        self.dry_run = dry_run
        self.emit = emit or (lambda outcome: None)
        self.actions = {action.name: action for action in actions}  # in the order they run
        self.kinds = {kind.name: kind for action in actions for kind in action.blocks}
        self._owners = {kind.name: action for action in actions for kind in action.blocks}
        self.guard = Guard(
            scope=settings.scope,
            cgroups=settings.cgroups,
            protect_exes=settings.protect_exes,
            never_namespaces=settings.never_act_namespaces,
            only_namespaces=settings.only_act_namespaces,
            pod_names=pod_names,
        )
        self.store = BlockStore(settings.state_dir)
        self.root = Path(settings.pin_root)
        self.parts = Parts()  # what the actions keep loaded (kernel programs)
        self._recent: deque[float] = deque()
        self._workers: list[threading.Thread] = []
        self._until = 0.0  # (monotonic) when the background work started so far should be done
        self._lock = threading.Lock()
        self._contexts = {
            action.name: ActionContext(
                action.name,
                options_of(action, settings),
                settings,
                dry_run=dry_run,
                blocks=self.store,
                guard=self.guard,
                generations=generations,
                report=lambda outcome: self.emit(outcome),
                later=self.background,
                parts=self.parts,
            )
            for action in actions
        }
        if self.acting:
            self._start()

    @property
    def acting(self) -> bool:
        return self.mode == "enforce" and not self.dry_run

    # -- planning --------------------------------------------------------------------------------
    def intent(self, verdict: Verdict) -> Intent:
        """What ``verdict`` plans rule by rule, what runs now and why not (respond.intent)."""
        acts = {name: action.acts for name, action in self.actions.items()}
        return intent_of(verdict, self.settings, tuple(self.actions), acts, self.mode)

    def plan(self, verdict: Verdict) -> list[str]:
        """Every step the verdict plans through any of its rules (what enforce would do)."""
        return list(self.intent(verdict).planned)

    # -- responding ------------------------------------------------------------------------------
    def respond(
        self, verdict: Verdict, state: ProcessState, now: float, finding: dict | None = None
    ) -> list[ActionOutcome]:
        intent = self.intent(verdict)
        steps = list(intent.planned)
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
        acts = [s for s in intent.steps if self.actions[s].acts]
        if self.mode == "monitor" or not acts:
            would = ""
            if intent.acting:
                would = f"; enforce mode would: {', '.join(intent.acting)}"
                if self.mode == "enforce":
                    would += f"; not acted: {intent.why_not}"
            detail: dict[str, Any] = {"planned": steps}
            if intent.acting:
                detail["response"] = intent.to_json()
            outcomes = [
                ActionOutcome(
                    action=ALERT.name,
                    status="done",
                    reason=f"{verdict.verdict} verdict{would}",
                    detail=detail,
                    **base,
                )
            ]
            if self.mode == "enforce":
                outcomes += self._hooks(verdict, state, steps, base, finding)
            return outcomes
        refusal = self.guard.refusal(verdict.pid, facts, allowlisted=verdict.allowlisted)
        if refusal:
            return [ActionOutcome(action=s, status="refused", reason=refusal, **base) for s in acts]
        if not self.dry_run and not self._spend(now):
            return [
                ActionOutcome(
                    action=ALERT.name,
                    status="rate-limited",
                    detail={"planned": steps},
                    reason=f"action budget of {self.settings.max_actions_per_minute}/min spent: degraded to an alert",
                    **base,
                )
            ]
        outcomes = [
            ActionOutcome(
                action=ALERT.name, status="done", reason=f"{verdict.verdict} verdict", **base
            )
        ]
        for step in acts:
            outcomes.append(self._step(step, verdict, state, base))
        outcomes += self._hooks(verdict, state, steps, base, finding)
        return outcomes

    def __call__(
        self, verdict: Verdict, state: ProcessState, now: float, finding: dict | None = None
    ) -> list[ActionOutcome]:
        """The agent's action interface is a callable ``(verdict, state, now[, finding])``: the same
        as :meth:`respond`; ``finding`` is the finding's plain JSON (outputs.finding_document)."""
        return self.respond(verdict, state, now, finding)

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
        run = self.actions[step].run
        try:
            return run(self._contexts[step], verdict, state, base)
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

    # -- hooks and background work ---------------------------------------------------------------
    def _hooks(
        self,
        verdict: Verdict,
        state: ProcessState,
        steps: list[str],
        base: dict[str, Any],
        finding_json: dict | None = None,
    ) -> list[ActionOutcome]:
        """Start the hooks for this verdict (results come through ``emit``); in a dry run, describe them.

        The document: the finding as the log has it (``finding``, when the agent gave it), and
        the keys hooks had before it (``verdict``, ``actions``, ``process``, ``connections``)."""
        hooks = [h for h in self.settings.hooks if verdict.verdict in h.on]
        if not hooks:
            return []
        finding = {
            "verdict": verdict.to_json(),
            "actions": steps,
            "process": state.facts.to_record() if state.facts else {"pid": verdict.pid},
            "connections": [{"address": a, "port": p} for (a, p) in state.connections],
        }
        if finding_json is not None:
            finding["finding"] = finding_json
        described = []
        for hook in hooks:
            if self.dry_run:
                described.append(
                    would(
                        HOOK.name,
                        f"run {hook.name} with the finding on stdin",
                        {"hook": hook.name, "argv": list(hook.argv)},
                        base,
                    )
                )
                continue
            self.background(self._run_hook, hook, finding, base, within_s=hook.timeout_s)
        return described

    def _run_hook(self, hook, finding: dict[str, Any], base: dict[str, Any]) -> None:
        detail = run_hook(hook, finding)
        self.emit(
            ActionOutcome(
                **{**base, "time": time.time()},
                action=HOOK.name,
                status="done" if detail["ok"] else "failed",
                reason=detail.get("error", f"exit {detail.get('exit_code')}"),
                detail=detail,
            )
        )

    def background(self, target: Callable, *args: Any, within_s: float = 0.0) -> None:
        """Run ``target(*args)`` in a thread that ends within ``within_s`` (close waits that long)."""
        worker = threading.Thread(target=target, args=args, daemon=True, name="gpuguard-respond")
        worker.start()
        with self._lock:
            self._workers = [w for w in self._workers if w.is_alive()] + [worker]
            self._until = max(self._until, time.monotonic() + within_s)

    def wait(self, timeout_s: float = 30.0) -> None:
        """Let delayed kills and hooks finish (the agent calls this at shutdown)."""
        deadline = time.monotonic() + timeout_s
        for worker in list(self._workers):
            worker.join(max(0.0, deadline - time.monotonic()))

    # -- each action's start, sweep and lifted ----------------------------------------------------
    def _live(self, action: Action, blocks: list[Block], now: float) -> list[Block]:
        kinds = {kind.name for kind in action.blocks}
        return [b for b in blocks if b.kind in kinds and not b.expired(now)]

    def _start(self) -> None:
        """Each action's start hook, with its live blocks: a restart restores them here."""
        now = time.time()
        blocks = self.store.load()
        for action in self.actions.values():
            if action.start is not None:
                action.start(self._contexts[action.name], self._live(action, blocks, now))

    def sweep(self, now: float) -> list[ActionOutcome]:
        """Each action's sweep hook with its live blocks (an acting responder), then lift expired ones.

        The kernel already ignores expired map entries; this removes them and their records.
        """
        outcomes = []
        blocks = self.store.load()
        if self.acting:
            for action in self.actions.values():
                if action.sweep is not None:
                    live = self._live(action, blocks, now)
                    outcomes += action.sweep(self._contexts[action.name], live, now)
        for block in blocks:
            if block.expired(now):
                outcomes.append(self.lift(block, now, reason="expired"))
        return outcomes

    def lift(self, block: Block, now: float, reason: str = "unblocked") -> ActionOutcome:
        try:
            said = lift_block(block, self.store, self.root, self.kinds)
            status = "done"
        except OSError as exc:
            said, status = str(exc), "failed"
        owner = self._owners.get(block.kind)
        if owner is not None and owner.lifted is not None:
            owner.lifted(self._contexts[owner.name], block)
        return ActionOutcome(
            time=now,
            action=UNBLOCK.name,
            status=status,
            pid=block.pid,
            comm=block.comm,
            exe=block.exe,
            reason=f"{reason}: {said}",
            block_id=block.id,
        )

    def close(self) -> None:
        """Wait for delayed kills and hooks, then unload what the actions loaded (blocks stay)."""
        self.wait(timeout_s=max(0.0, self._until - time.monotonic()) + 2.0)
        self.parts.close()
