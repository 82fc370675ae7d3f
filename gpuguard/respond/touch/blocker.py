"""kill-on-touch: the offender's program and tree go into pinned kernel maps; a match dies on touch.

:class:`TouchBlocker` is the loaded program (its maps: :mod:`~gpuguard.respond.touch.maps`)
with what user space adds: it places a block (what it names: :mod:`.target`), matches exec
reports against the blocks (:mod:`.match`), turns each kill report into one record naming the
victim, the block and the reason (:mod:`.names`), and suspends a block that kills too many
processes not its own (:mod:`.breaker`).  With a scope the kernel acts only inside it.
Entries expire in the kernel; the maps are pinned, the programs attached while loaded.
What a block names, the breaker and its limits: docs/respond.md.
"""

from __future__ import annotations

import ctypes as ct
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuguard.escape import decode_c_string, escape_text
from gpuguard.events.abi import TouchReason
from gpuguard.respond.blocks import Block, new_block_id
from gpuguard.respond.touch.breaker import Breaker
from gpuguard.respond.touch.maps import (
    FLAG_SUSPENDED,
    FLAG_TREE,
    PROC_ARGS_LEN,
    TOUCH_BLOCK,
    TouchMaps,
)
from gpuguard.respond.touch.match import ExactCopies, ExecIdentities
from gpuguard.respond.touch.names import KnownProcesses, args_text, cmdline_of, exe_of
from gpuguard.respond.touch.target import BlockTarget, read_process
from gpuguard.sources.proc.identity import OffenderExited, open_verified


class TouchBlocker(TouchMaps):
    """The loaded kill-on-touch program, its pinned maps and the identities matched in user space."""

    def __init__(
        self,
        root: Path,
        on_kill: Callable[[dict], None],
        *,
        in_scope: Callable[[int], bool] | None = None,
        breaker_limit: int = 3,
    ) -> None:
        super().__init__(root)
        self.on_kill = on_kill
        self.in_scope = in_scope or (lambda pid: True)
        self._event_type = ct.POINTER(self._bpf[b"schema_touch_event"].Leaf)
        self.identities = ExecIdentities()
        self.copies = ExactCopies()
        self.names = KnownProcesses()
        self.breaker = Breaker(breaker_limit, self.armed)
        self._stop = threading.Event()
        self._bpf[b"touch_events"].open_ring_buffer(self._on_event)
        self._bpf[b"touch_kills"].open_ring_buffer(self._on_event)
        self._lost = self._bpf[b"touch_lost"]
        self._lost_seen = [0, 0]
        self._thread = threading.Thread(target=self._poll, name="gpuguard-touch", daemon=True)
        self._thread.start()

    # -- placing ---------------------------------------------------------------------------------
    def add(
        self,
        pid: int,
        target: BlockTarget,
        tree: set[int],
        ttl_s: float,
        reason: str,
        *,
        pidfd: int | None = None,
    ) -> Block:
        """Block the offender ``pid`` (``pidfd``: its verified pidfd) and its ``tree``, and what
        ``target`` names beyond them."""
        number = secrets.randbits(31) + 1
        deadline = time.monotonic_ns() + int(ttl_s * 1e9) if ttl_s else 0
        blocked_path = ""
        if target.kind == "executable":
            blocked_path = target.exe
        elif target.kind == "script" and target.script and target.script.kind == "file":
            blocked_path = target.script.path  # a script exec'd directly (#!) by its path
        self._set_state(number, 0)  # armed: its entries act from now on
        path_key = self._put_path(number, deadline, blocked_path) if blocked_path else None
        offender_cmdline = cmdline_of(pid)
        self.names.offender(number, target.exe, offender_cmdline)
        if target.kind == "executable":
            self.copies.add(number, target.identity, target.sha256)
        tgids = sorted(tree | {pid})
        for tgid in tgids:
            cmdline = offender_cmdline if tgid == pid else cmdline_of(tgid)
            self.names.remember(tgid, target.exe, cmdline)
        tgids = [
            tgid
            for tgid in tgids
            if self._insert_live(
                tgid,
                self._entry(number, deadline, FLAG_TREE),
                pidfd if tgid == pid else None,
                None if tgid == pid else set(tgids),
            )
        ]
        for tgid in tgids:  # what they run, for the kill reports of their forks too
            self._keep_proc(tgid, target.exe if tgid == pid else exe_of(tgid))
        self.identities.add(number, deadline, target)
        self._report_execs(bool(self.identities))
        now = time.time()
        script = target.script
        return Block(
            new_block_id(TOUCH_BLOCK),
            TOUCH_BLOCK.name,
            now,
            now + ttl_s if ttl_s else None,
            reason,
            pid,
            exe=target.exe,
            detail={
                "number": number,
                "deadline_ns": deadline,
                "path_key": bytes(path_key).hex() if path_key is not None else None,
                "blocked_path": blocked_path or None,
                "tgids": tgids,
                "identity": list(target.identity) if target.identity else None,
                "tgid_layout": self._tgid_layout(),
                "size": target.identity[2] if target.identity else None,
                "sha256": target.sha256,
                "target": {
                    "kind": target.kind,
                    "interpreter": target.interpreter,
                    "script": {"kind": script.kind, "path": script.path, "sha256": script.sha256}
                    if script
                    else None,
                    "why": target.why,
                    "users_outside": target.users_outside,
                },
            },
        )

    def restore(self, block: Block) -> None:
        """Match a block's identities again after a restart (its kernel entries are pinned)."""
        d = block.detail
        # The record says whether it is armed (`unblock --rearm` may have changed it while the agent
        # was down); blocks placed before the kernel kept a state get one here.
        self._set_state(d["number"], FLAG_SUSPENDED if d.get("suspended") else 0)
        self.identities.restore(d["number"], d["deadline_ns"], {**d, "exe": block.exe})
        self.names.offender(d["number"], block.exe, "")
        self.copies.add(d["number"], d.get("identity"), d.get("sha256"))
        self._report_execs(bool(self.identities))

    def forget(self, number: int) -> None:
        """Stop matching a lifted block's identities (its kernel state is gone with the lift)."""
        self.identities.forget(number)
        self.names.forget(number)
        self.copies.forget(number)
        self.breaker.reset(number)
        self._report_execs(bool(self.identities))

    # -- reports ---------------------------------------------------------------------------------
    def _poll(self) -> None:
        while not self._stop.is_set():
            self._bpf.ring_buffer_poll(100)
            self._check_lost()

    def _check_lost(self) -> None:
        """Reports the kernel had no room for: counted and said, never silent."""
        for index, what in ((0, "kill reports"), (1, "exec reports")):
            count = int(self._lost[ct.c_int(index)].value)
            if count > self._lost_seen[index]:
                self.on_kill(
                    {"kind": "lost", "what": what, "count": count - self._lost_seen[index]}
                )
                self._lost_seen[index] = count

    def _on_event(self, _ctx, data, _size) -> None:
        try:
            self._handle(ct.cast(data, self._event_type).contents)
        except Exception as exc:  # noqa: BLE001 - a ctypes callback must not raise; reported instead
            self.on_kill({"kind": "error", "error": f"{type(exc).__name__}: {exc}"})

    def _handle(self, event) -> None:
        try:
            reason = (
                TouchReason(event.reason).name.lower().replace("_", "-")
            )  # gpu-open, connect, exec
        except ValueError:
            reason = str(event.reason)
        report = {
            "tgid": event.tgid,
            "reason": reason,
            "number": event.block,
            "comm": decode_c_string(bytes(event.comm)),
            "path": decode_c_string(bytes(event.path)),
            "tree": bool(event.flags & FLAG_TREE),
        }
        # What the kernel kept of the process (read at its exec, while it was alive for sure).
        proc = event.proc
        exec_path = decode_c_string(bytes(proc.exe))
        kept_exe = escape_text(exec_path)
        kept_args = ct.string_at(  # not proc.args: ctypes cuts a char array at its first NUL
            ct.addressof(proc) + type(proc).args.offset, min(proc.args_len, PROC_ARGS_LEN)
        )
        kept_cmdline = args_text(kept_args, bool(proc.cut)) if kept_args else ""
        if reason == "exec":
            if event.block == 0:
                self._check_exec(report, event.exit_gen)
            else:  # a block's process runs something new: remember what, for its kill record
                self.names.remember(
                    event.tgid,
                    kept_exe or report["path"],
                    kept_cmdline or cmdline_of(event.tgid),
                )
                if not report["tree"]:
                    self._mark_exact_copy(event.tgid, report["path"], event.block)
            return
        self._killed(report, kept_exe, kept_cmdline, exec_path)

    def _killed(
        self, report: dict, kept_exe: str = "", kept_cmdline: str = "", exec_path: str = ""
    ) -> None:
        """One record per kill, with the victim named; the breaker counts victims outside the tree.

        The victim is named from what the kernel kept (``kept_*``), else what was learnt at its
        exec report or the block's placement; the offender's exe is the last resort.
        """
        number = report["number"]
        exe, cmdline = self.names.victim(report["tgid"], number, kept_exe, kept_cmdline)
        report.update(kind="kill", exe=exe, cmdline=cmdline)
        if not report["tree"] and exec_path:
            # its exec report travels on the other ring and may come second: decide it here too
            self._mark_exact_copy(report["tgid"], exec_path, number)
        report["tree"] = report["tree"] or self.copies.is_own(report["tgid"])
        self.on_kill(report)
        if report["tree"]:
            return
        victims = self.breaker.count(
            number, report["tgid"], exe or report["comm"], time.monotonic()
        )
        if victims is not None:
            self.suspend(number)
            self.on_kill({"kind": "breaker", "number": number, "victims": victims})

    def _mark_exact_copy(self, tgid: int, path: str, number: int) -> None:
        """A process blocked by path that runs the offender's very file (or bytes) is the offender's own."""
        if self.copies.check(tgid, path, number):
            self._mark_tree(tgid)

    def _check_exec(self, report: dict, exit_gen: int) -> None:
        """A renamed copy, or a blocked script under any interpreter: killed through a verified pidfd."""
        tgid = report["tgid"]
        try:
            pidfd = open_verified(tgid, exit_gen, self.generations)
        except OffenderExited:
            return
        try:
            if not self.in_scope(tgid):
                return
            try:
                match = self.identities.match(tgid, time.monotonic_ns())
            except OSError:
                return
            if match is None or not self.armed(match[0]):
                return  # suspended, or lifted by `gpuguard unblock` while this agent runs
            number, what = match
            if self.generations.of(tgid) != exit_gen:
                return  # it exited while being read: what was read may be another process's
            exe, _, _ = read_process(tgid)
            cmdline = cmdline_of(tgid)
            entry = self._entry(number, 0, FLAG_TREE)  # an exact copy: the offender's own
            if not self._insert_live(tgid, entry, pidfd):
                return  # it exited meanwhile: nothing to kill, and no entry left behind
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                return
        except OSError:
            return
        finally:
            os.close(pidfd)
        self.names.remember(tgid, exe, cmdline)
        self._killed({**report, "number": number, "matched": what, "tree": True})

    def close(self) -> None:
        """Detach, then hand on the reports still in the rings (a kill made just before is logged)."""
        self._stop.set()
        self._thread.join(timeout=30)
        for tracepoint in list(self._bpf.tracepoint_fds):
            self._bpf.detach_tracepoint(tracepoint)
        if not self._thread.is_alive():  # never free the rings under a thread still reading them
            self._bpf.ring_buffer_consume()
            self._check_lost()
            self._bpf.cleanup()
