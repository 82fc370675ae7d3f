"""kill-on-touch: the kernel kills the offender's executable or pids at a GPU open, connect or exec.

The action places blocks, turns the program's reports into outcomes and keeps the program
for the responder's life: loaded at the first block, or at start when blocks survived a
restart (their entries are pinned); its scope refreshed at each sweep when it follows the
containers; a lifted block forgotten.  Its parts: :mod:`gpuguard.respond.touch`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuguard.config.schema import Key
from gpuguard.events.action_kinds import KILL_ON_TOUCH
from gpuguard.events.agent_events import ActionOutcome
from gpuguard.respond import bpf_pins
from gpuguard.respond.actions.action import Action, name_block
from gpuguard.respond.blocks import Block
from gpuguard.respond.touch.blocker import TouchBlocker
from gpuguard.respond.touch.breaker import BREAKER_WINDOW_S
from gpuguard.respond.touch.maps import TOUCH_BLOCK
from gpuguard.respond.touch.target import block_target, descendants
from gpuguard.sources.proc.identity import read_while_alive

if TYPE_CHECKING:
    from gpuguard.correlate.state import ProcessState
    from gpuguard.detect.scoring.score import Verdict
    from gpuguard.respond.context import ActionContext

SHARED_EXE_PREFIXES = (
    "/usr/",
    "/bin/",
    "/sbin/",
    "/lib/",
    "/lib64/",
    "/opt/",
    "/snap/",
    "/nix/store/",
)


@dataclass(frozen=True, slots=True)
class TouchSettings:
    """``response.kill_on_touch``: how long entries live, what is shared, the breaker's limit."""

    touch_ttl_s: float = 86400.0  # kill-on-touch entries expire (0: never)
    # Executables under these prefixes are shared (interpreters, system tools): kill-on-touch
    # blocks only the offender's pids for them, never every process running the same file.
    shared_exe_prefixes: tuple[str, ...] = SHARED_EXE_PREFIXES
    # A block that kills more than this many processes a minute outside the offender's own
    # tree suspends itself (its circuit breaker): a block that wide is hitting the innocent.
    breaker_victims_per_minute: int = 3


def touch_program(ctx: ActionContext) -> TouchBlocker:
    """The loaded program (a part of the responder's life): its syscall tracepoints tax every
    process on the host, so it is loaded at the first block, never before."""
    bpf_pins.ensure_pin_root(str(ctx.pin_root))
    touch = TouchBlocker(
        ctx.pin_root,
        lambda report: on_touch_kill(ctx, report),
        in_scope=ctx.in_scope,
        breaker_limit=ctx.options.breaker_victims_per_minute,
    )
    touch.set_scope(ctx.scope_ids())
    return touch


def run(
    ctx: ActionContext, verdict: Verdict, state: ProcessState, base: dict[str, Any]
) -> ActionOutcome:
    ttl = ctx.options.touch_ttl_s
    prefixes = ctx.options.shared_exe_prefixes
    with ctx.open_offender(verdict, state) as handle:
        # What the block may name, read while the verified process is alive: never an
        # interpreter, never a file others run (gpuguard.respond.touch.target).
        target = read_while_alive(handle.pidfd, lambda: block_target(verdict.pid, prefixes))
        tree = read_while_alive(handle.pidfd, lambda: descendants(verdict.pid))
        detail = {
            "target": target.kind,
            "exe": target.exe,
            "interpreter": target.interpreter,
            "script": target.script.path if target.script else None,
        }
        if ctx.dry_run:
            return ctx.would(f"block for {ttl:g} s: {target.why}", detail, base)
        touch = ctx.part(touch_program)
        touch.set_scope(ctx.scope_ids())
        block = touch.add(
            verdict.pid,
            target,
            tree,
            ttl,
            reason=f"{verdict.verdict} verdict",
            pidfd=handle.pidfd,
        )
    name_block(block, verdict)
    return ctx.placed(block, target.why, base)


def restore(ctx: ActionContext, live: list[Block]) -> None:
    """After a restart: load the program again for the blocks still live (their entries are
    pinned), and match their identities again."""
    if not live:
        return
    try:
        touch = ctx.part(touch_program)
    except Exception as exc:  # noqa: BLE001 - reported, the agent keeps running
        _later(ctx, "failed", f"cannot restore kill-on-touch blocks: {getattr(exc, 'cause', exc)}")
        return
    for block in live:
        touch.restore(block)


def refresh_scope(ctx: ActionContext, live: list[Block], now: float) -> list[ActionOutcome]:
    """Containers started since the last sweep are in the kernel's scope now."""
    touch = ctx.loaded(touch_program)
    if touch is not None and ctx.scope_changes:
        touch.set_scope(ctx.scope_ids())
    return []


def forget(ctx: ActionContext, block: Block) -> None:
    """A lifted block's identities are no longer matched in user space."""
    touch = ctx.loaded(touch_program)
    if touch is not None:
        touch.forget(block.detail.get("number", 0))


def touch_of_kill(outcome: ActionOutcome) -> str | None:
    """The touch (gpu-open, connect, exec) of a kill record; None for a placement or the rest."""
    if outcome.status == "done" and "touch" in outcome.detail:
        return str(outcome.detail["touch"])
    return None


def on_touch_kill(ctx: ActionContext, report: dict[str, Any]) -> None:
    """One record for each kill the kernel (or the exec match) made, and for a breaker trip."""
    block = next(
        (
            b
            for b in ctx.blocks.load()
            if b.kind == TOUCH_BLOCK.name and b.detail.get("number") == report.get("number")
        ),
        None,
    )
    kind = report.get("kind", "kill")
    if kind == "lost":
        _later(
            ctx,
            "lost",
            f"{report['count']} kill-on-touch {report['what']} found no room in "
            "the kernel's ring buffer: the kernel acted, this log has no record of it",
            detail={"lost": report["count"], "what": report["what"]},
        )
        return
    if kind == "error":
        _later(ctx, "failed", f"a kill-on-touch report could not be handled: {report['error']}")
        return
    if kind == "breaker":
        victims = report["victims"]
        if block is not None:
            block.detail["suspended"] = True
            ctx.blocks.save(block)
        _later(
            ctx,
            "suspended",
            f"circuit breaker: the block killed {len(victims)} processes that are not "
            f"the offender's own within {BREAKER_WINDOW_S:g} s (more than "
            f"{ctx.options.breaker_victims_per_minute}); it is suspended in the "
            "kernel and kills nothing until `gpuguard unblock`",
            pid=block.pid if block else 0,
            comm=block.comm if block else "",
            exe=block.exe if block else "",
            block_id=block.id if block else None,
            detail={"victims": victims, "number": report["number"]},
        )
        return
    what = {
        "gpu-open": f"at its GPU open of {report['path']}",
        "connect": "at its connect",
        "exec": f"at exec: {report.get('matched') or report['path']}",
    }.get(report["reason"], report["reason"])
    _later(
        ctx,
        "done",
        f"killed {what}"
        + (
            ""
            if report.get("tree")
            else " (not the offender's own tree or an exact copy: counted by the breaker)"
        ),
        pid=report["tgid"],
        comm=report["comm"],
        exe=report.get("exe") or (block.exe if block else ""),
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


def _later(ctx: ActionContext, status: str, reason: str, **fields: Any) -> None:
    """Report an outcome of this action that came later (from the program's thread)."""
    ctx.report(
        ActionOutcome(
            time=time.time(), action=KILL_ON_TOUCH.name, status=status, reason=reason, **fields
        )
    )


ACTION = Action(
    KILL_ON_TOUCH,
    run,
    section="kill_on_touch",
    options=(
        Key(
            "ttl_s",
            "number",
            "entries expire after this long (0: never)",
            field="touch_ttl_s",
            low=0,
        ),
        Key(
            "shared_exe_prefixes",
            "texts",
            "executables under these are shared: only the offender's pids are blocked for them",
        ),
        Key(
            "breaker_victims_per_minute",
            "count",
            "a block killing more than this many others a minute suspends itself",
            low=0,
        ),
    ),
    settings=TouchSettings,
    default_on=("malicious",),
    blocks=(TOUCH_BLOCK,),
    start=restore,
    sweep=refresh_scope,
    lifted=forget,
    touch_kill=touch_of_kill,
    what="what is the offender's own goes into pinned kernel maps, and a matching process is "
    "killed (SIGKILL from the kernel, `bpf_send_signal`) at its first GPU open or IPv4/IPv6 "
    "connect, before the syscall returns, or at exec when user space matches it. What the "
    "block names is decided from the verified process (see *What a block names* below): a "
    "native executable (exec'd path, device+inode, size+sha256), the script an interpreter "
    "runs (never the interpreter), or only the offender's own tree. Forks of blocked "
    "processes inherit the block; an exiting pid leaves the map, and after a restart entries "
    "whose process started after the entry was added are dropped. Entries expire after "
    "`kill_on_touch.ttl_s` (1 day)",
    undone_by="expiry, `unblock`",
)
