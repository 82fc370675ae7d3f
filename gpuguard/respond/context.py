"""What an action may ask of the response it runs in; an action never sees the responder itself.

One :class:`ActionContext` per action and responder.  Its capabilities: the action's own
options and the dry-run switch; the offender's identity (a proven pidfd) and the guard
(who may be acted on, the scope in user space and as cgroup ids for the kernel); the block
registry (records that outlive the agent, and the outcome of a block placed); kernel parts
an action keeps loaded for the responder's life (:class:`Parts`); and the outcome reporter
for what happens later, from any thread, with a way to run such work in the background.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuguard.events.agent_events import ActionOutcome
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.respond.blocks import Block, BlockStore
from gpuguard.respond.process_control import Guard, ProcessHandle, open_process
from gpuguard.respond.scope import scope_cgroup_ids
from gpuguard.sources.proc.identity import (
    ExitGenerations,
    OffenderExited,
    open_verified,
    pidfd_alive,
)

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict

Part = TypeVar("Part")


class Parts:
    """What actions keep loaded for one responder's life (kernel programs), each made once.

    A part is keyed by the function that makes it, so two actions sharing one (quarantine and
    block-egress share the cgroup programs) name the same maker.  Closed with the responder.
    """

    def __init__(self) -> None:
        self._made: dict[Callable, Any] = {}

    def get(self, make: Callable[[ActionContext], Part], ctx: ActionContext) -> Part:
        if make not in self._made:
            self._made[make] = make(ctx)
        return self._made[make]

    def loaded(self, make: Callable[[ActionContext], Part]) -> Part | None:
        return self._made.get(make)

    def close(self) -> None:
        """Close each part, in the order they were made (their pinned blocks stay)."""
        made, self._made = self._made, {}
        for part in made.values():
            part.close()


class ActionContext:
    """One action's view of the response (see the module docstring)."""

    def __init__(
        self,
        name: str,
        options: Any,
        settings: Any,
        *,
        dry_run: bool,
        blocks: BlockStore,
        guard: Guard,
        generations: ExitGenerations | None,
        report: Callable[[ActionOutcome], None],
        later: Callable[..., None],
        parts: Parts,
    ) -> None:
        self.name = name  # the action's name: its outcomes carry it
        self.options = options  # its own settings (its Action.settings model), or None
        # the whole ``response:`` section, read-only, for a part two actions share: the
        # cgroups gpuguard makes (quarantine.cgroup_parent) serve quarantine and block-egress
        self.settings = settings
        self.dry_run = dry_run
        self.blocks = blocks  # the block registry: records that outlive the agent
        self.pin_root = Path(settings.pin_root)  # where kernel objects are pinned
        self.report = report  # an outcome known later (any thread): logged by the agent
        # later(target, *args, within_s=S): work in a thread; closing waits S seconds for it
        self.later = later
        self._guard = guard
        self._generations = generations
        self._parts = parts

    # -- identity and the guard ------------------------------------------------------------------
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
        if self._generations is not None and state.exit_gen is not None:
            return ProcessHandle(
                verdict.pid, open_verified(verdict.pid, state.exit_gen, self._generations)
            )
        return open_process(verdict.pid, verdict.key.start_time)

    def refusal(self, pid: int, facts: ProcessFacts | None) -> str | None:
        """Why ``pid`` must not be touched (pid 1, gpuguard, protected, out of scope), or None."""
        return self._guard.refusal(pid, facts)

    def in_scope(self, pid: int) -> bool:
        """Whether ``pid`` is inside ``response.cgroups`` / ``scope: containers`` now."""
        return self._guard.outside_scope(pid) is None

    def scope_ids(self) -> set[int] | None:
        """The cgroup ids the kernel may act in (with their descendants); None: everywhere."""
        guard = self._guard
        namespaced = bool(guard.never_namespaces or guard.only_namespaces)
        return scope_cgroup_ids(
            self.settings.scope,
            self.settings.cgroups,
            guard.namespace_refusal if namespaced else None,
        )

    @property
    def scope_changes(self) -> bool:
        """The scope is the containers running now (``scope: containers``, or namespaces):
        refresh ``scope_ids`` as they come and go."""
        return self.settings.scope == "containers" or bool(
            self.settings.never_act_namespaces or self.settings.only_act_namespaces
        )

    def would(self, doing: str, detail: dict[str, Any], base: dict[str, Any]) -> ActionOutcome:
        """What this action would do, in a dry run (:func:`would`)."""
        return would(self.name, doing, detail, base)

    # -- blocks ----------------------------------------------------------------------------------
    def placed(self, block: Block, reason: str, base: dict[str, Any]) -> ActionOutcome:
        """Record ``block`` (it outlives the agent); the outcome that names it."""
        self.blocks.save(block)
        return ActionOutcome(
            action=self.name,
            status="done",
            reason=reason,
            block_id=block.id,
            expires=block.expires,
            detail=dict(block.detail),
            **base,
        )

    # -- kernel parts ----------------------------------------------------------------------------
    def part(self, make: Callable[[ActionContext], Part]) -> Part:
        """The part ``make`` makes, made now on first use (an error is the action's outcome)."""
        return self._parts.get(make, self)

    def loaded(self, make: Callable[[ActionContext], Part]) -> Part | None:
        """The part ``make`` made, or None when nothing has needed it yet."""
        return self._parts.loaded(make)


def would(action: str, doing: str, detail: dict[str, Any], base: dict[str, Any]) -> ActionOutcome:
    """The one dry-run outcome: ``action`` "would <doing>", with what it would have used."""
    return ActionOutcome(
        action=action, status="dry-run", detail=detail, reason=f"would {doing}", **base
    )
