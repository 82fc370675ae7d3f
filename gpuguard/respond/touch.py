"""kill-on-touch: the offender's program and tree go into pinned kernel maps; a match dies on touch.

probes/respond_touch.bpf.c does the killing (see its header); this module fills its maps
(what a block names comes from :mod:`gpuguard.respond.exec_match`) and reads its reports:
each kill becomes one record naming the victim, the block and the reason, and a block that
kills too many processes not its own trips its circuit breaker (suspended in the kernel
until lifted or re-armed).  With a scope the kernel acts only inside it (``set_scope``).
Entries expire in the kernel; the maps are pinned, the programs attached while loaded.
What a block names, the breaker and its limits: docs/respond.md ("What a block names",
"Safety").
"""

from __future__ import annotations

import ctypes as ct
import os
import secrets
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from gpuguard.detect.scoring.allowlist import sha256_of_file
from gpuguard.escape import decode_c_string, escape_text
from gpuguard.events.abi import DEFINES, TouchReason
from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, BlockKind, new_block_id
from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of
from gpuguard.respond.exec_match import BlockTarget, ExecIdentities, read_process
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path
from gpuguard.sources.proc.identity import (
    ExitGenerations,
    OffenderExited,
    open_verified,
    pidfd_exited,
)

PROGRAM_SOURCE = "respond_touch.bpf.c"
PATH_LEN = DEFINES["GG_PATH_LEN"]
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
FLAG_TREE = 1  # enum gg_touch_flag
FLAG_SUSPENDED = 2  # also a block's state in touch_blocks
BREAKER_WINDOW_S = 60.0
MAX_KNOWN = 8192  # victims' exe/cmdline remembered (the blocks' processes)
CMDLINE_CAP = 4096  # bytes of a victim's command line kept in its kill record
PROC_ARGS_LEN = DEFINES["GG_ARGS_LEN"]  # bytes of argv the kernel keeps for a blocked process


def path_hash(path: str) -> int:
    """The kernel's FNV-1a over the exec'd path (as many bytes as it reads: GG_PATH_LEN - 1)."""
    value = FNV_OFFSET
    for byte in os.fsencode(path)[: PATH_LEN - 1]:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


def _args_text(raw: bytes, cut: bool) -> str:
    """A NUL-separated argv (as /proc/PID/cmdline holds it) as one escaped line."""
    text = escape_text(raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace"))
    return text + (" [truncated]" if cut else "")


def _raw_cmdline(pid: int, cap: int = CMDLINE_CAP) -> tuple[bytes, bool]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(cap + 1)
    except OSError:
        return b"", False
    return raw[:cap], len(raw) > cap


def _cmdline_of(pid: int) -> str:
    return _args_text(*_raw_cmdline(pid))


class TouchBlocker:
    """The loaded kill-on-touch program, its pinned maps and the identities matched in user space."""

    def __init__(
        self,
        root: Path,
        on_kill: Callable[[dict], None],
        *,
        in_scope: Callable[[int], bool] | None = None,
        breaker_limit: int = 3,
    ) -> None:
        self.root = root
        self.on_kill = on_kill
        self.in_scope = in_scope or (lambda pid: True)
        self.breaker_limit = breaker_limit
        self._bpf = bpf_pins.compile_program(PROGRAM_SOURCE, root)
        self._paths = self._bpf[b"touch_paths"]
        self._tgids = self._bpf[b"touch_tgids"]
        self._settings = self._bpf[b"touch_settings"]
        self._scope = self._bpf[b"touch_scope"]
        self._blocks = self._bpf[b"touch_blocks"]
        self._procs = self._bpf[b"touch_procs"]
        self.generations = ExitGenerations(self._bpf[b"touch_exit_gens"])
        self._event_type = ct.POINTER(self._bpf[b"schema_touch_event"].Leaf)
        self.drop_recycled()
        self.identities = ExecIdentities()
        self._known: OrderedDict[int, tuple[str, str]] = OrderedDict()  # tgid -> (exe, cmdline)
        self._offenders: dict[int, tuple[str, str]] = {}  # block number -> the offender's
        self._files: dict[int, tuple[tuple, str | None]] = {}  # number -> (identity, sha256)
        self._own: OrderedDict[int, None] = OrderedDict()  # tgids found to be exact copies
        self._victims: dict[int, deque] = {}  # block number -> recent kills outside its tree
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bpf[b"touch_events"].open_ring_buffer(self._on_event)
        self._bpf[b"touch_kills"].open_ring_buffer(self._on_event)
        self._lost = self._bpf[b"touch_lost"]
        self._lost_seen = [0, 0]
        self._thread = threading.Thread(target=self._poll, name="gpuguard-touch", daemon=True)
        self._thread.start()

    # -- scope -----------------------------------------------------------------------------------
    def set_scope(self, cgroup_ids: set[int] | None) -> None:
        """Act only in these cgroups (and their descendants); None: everywhere.

        Changed in place (new ids in first, then gone ones out, the switch last when scoping),
        so a refresh never leaves the kernel a moment with an empty scope or none.
        """
        if cgroup_ids is not None:
            for cgroup_id in cgroup_ids:
                self._scope[self._scope.Key(cgroup_id)] = ct.c_uint8(1)
            self._settings[ct.c_int(1)] = ct.c_uint(1)
        else:
            self._settings[ct.c_int(1)] = ct.c_uint(0)
        for key in list(self._scope.keys()):
            if cgroup_ids is None or key.value not in cgroup_ids:
                del self._scope[key]

    # -- block state -----------------------------------------------------------------------------
    def state_of(self, number: int) -> int | None:
        """The block's kernel state (0 armed, FLAG_SUSPENDED); None: lifted or never placed."""
        try:
            return int(self._blocks[self._blocks.Key(number)].value)
        except KeyError:
            return None

    def armed(self, number: int) -> bool:
        return self.state_of(number) == 0

    def _set_state(self, number: int, state: int) -> None:
        self._blocks[self._blocks.Key(number)] = self._blocks.Leaf(state)

    # -- placing ---------------------------------------------------------------------------------
    def _entry(self, number: int, deadline: int, flags: int = 0):
        value = self._paths.Leaf()
        value.expires_ns = deadline
        value.added_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        value.block = number
        value.flags = flags
        return value

    def drop_recycled(self) -> int:
        """Delete pid entries whose process is gone or started after the entry was added.

        While the program is attached, exits clear entries themselves; this covers the time
        the agent was down (run at start, before anything can be killed).
        """
        dropped = 0
        tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        for key, value in list(self._tgids.items()):
            try:
                with open(f"/proc/{key.value}/stat") as f:
                    started_ns = int(f.read().rsplit(")", 1)[1].split()[19]) * tick_ns
            except (OSError, ValueError, IndexError):
                started_ns = None
            if started_ns is None or started_ns > value.added_ns + tick_ns:
                del self._tgids[key]
                dropped += 1
        # what a pid ran is kept only for the blocked: left without an entry, it could name the
        # pid's next owner in a kill report
        blocked = {key.value for key in self._tgids.keys()}
        for key in list(self._procs.keys()):
            if key.value not in blocked:
                try:
                    del self._procs[key]
                except KeyError:
                    pass
        return dropped

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
        path_key = self._paths.Key(path_hash(blocked_path)) if blocked_path else None
        self._set_state(number, 0)  # armed: its entries act from now on
        if path_key is not None:
            self._paths[path_key] = self._entry(number, deadline)
        offender = (target.exe, _cmdline_of(pid))
        tgids = sorted(tree | {pid})
        with self._lock:
            self._offenders[number] = offender
            if target.kind == "executable" and target.identity:
                self._files[number] = (tuple(target.identity), target.sha256)
            for tgid in tgids:
                self._remember(tgid, offender if tgid == pid else (target.exe, _cmdline_of(tgid)))
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
            self._keep_proc(tgid, target.exe if tgid == pid else _exe_of(tgid))
        self.identities.add(number, deadline, target)
        self._report_execs()
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
                # touch_tgids' key size, value size and the value's block offset, from bcc's view of
                # gpuguard.h, so `gpuguard unblock` finds this block's entries without compiling.
                "tgid_layout": [
                    ct.sizeof(self._tgids.Key),
                    ct.sizeof(self._tgids.Leaf),
                    self._tgids.Leaf.block.offset,
                ],
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
        with self._lock:
            self._offenders[d["number"]] = (block.exe, "")
            if d.get("identity"):
                self._files[d["number"]] = (tuple(d["identity"]), d.get("sha256"))
        self._report_execs()

    def forget(self, number: int) -> None:
        """Stop matching a lifted block's identities (its kernel state is gone with the lift)."""
        self.identities.forget(number)
        with self._lock:
            self._offenders.pop(number, None)
            self._files.pop(number, None)
            self._victims.pop(number, None)
        self._report_execs()

    def _report_execs(self) -> None:
        self._settings[ct.c_int(0)] = ct.c_uint(1 if self.identities else 0)
        # the kernel reads argv at execve entry for blocked paths only while any path is blocked
        has_paths = next(iter(self._paths.keys()), None) is not None
        self._settings[ct.c_int(2)] = ct.c_uint(1 if has_paths else 0)

    def _keep_proc(self, tgid: int, exe: str) -> None:
        """Tell the kernel what ``tgid`` runs (its forks inherit it): named in kill reports."""
        raw, cut = _raw_cmdline(tgid, PROC_ARGS_LEN)
        proc = self._procs.Leaf()
        proc.args_len = len(raw)
        proc.cut = 1 if cut else 0
        proc.exe = os.fsencode(exe)[: PATH_LEN - 1]
        # (proc.args would be a copy: ctypes hands char arrays out as bytes)
        ct.memmove(ct.addressof(proc) + type(proc).args.offset, raw, len(raw))
        self._procs[self._procs.Key(tgid)] = proc

    def _insert_live(
        self, tgid: int, entry, pidfd: int | None = None, parents: set[int] | None = None
    ) -> bool:
        """Put ``tgid`` in the kernel map only while it is the process meant; never leave an entry
        for a pid that exited (its next owner would inherit the block).

        The kernel deletes an exiting pid's entry; an insert that lands after that exit would
        stay.  So the entry goes in, and is taken out again unless the process (``pidfd``, or one
        opened now whose parent is in ``parents``: a recycled pid has another) has not exited.
        """
        own = pidfd is None
        if own:
            try:
                pidfd = os.pidfd_open(tgid)
            except OSError:
                return False
        try:
            if parents is not None:
                try:
                    with open(f"/proc/{tgid}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    return False
                if ppid not in parents or pidfd_exited(pidfd):
                    return False
            key = self._tgids.Key(tgid)
            self._tgids[key] = entry
            if pidfd_exited(pidfd):
                try:
                    del self._tgids[key]
                except KeyError:
                    pass
                return False
            return True
        finally:
            if own:
                os.close(pidfd)

    def _remember(self, tgid: int, what: tuple[str, str]) -> None:
        self._known[tgid] = what
        self._known.move_to_end(tgid)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)

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
        kept_cmdline = _args_text(kept_args, bool(proc.cut)) if kept_args else ""
        if reason == "exec":
            if event.block == 0:
                self._check_exec(report, event.exit_gen)
            else:  # a block's process runs something new: remember what, for its kill record
                with self._lock:
                    self._remember(
                        event.tgid,
                        (
                            kept_exe or report["path"],
                            kept_cmdline or _cmdline_of(event.tgid),
                        ),
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
        with self._lock:
            known = self._known.get(report["tgid"])
            offender = self._offenders.get(number, ("", ""))
        exe = kept_exe or (known[0] if known else "") or offender[0]
        cmdline = kept_cmdline or (known[1] if known else "") or _cmdline_of(report["tgid"])
        report.update(kind="kill", exe=exe, cmdline=cmdline)
        if not report["tree"] and exec_path:
            # its exec report travels on the other ring and may come second: decide it here too
            self._mark_exact_copy(report["tgid"], exec_path, number)
        with self._lock:
            report["tree"] = report["tree"] or report["tgid"] in self._own
        self.on_kill(report)
        if report["tree"]:
            return
        now = time.monotonic()
        with self._lock:
            recent = self._victims.setdefault(number, deque())
            recent.append((now, report["tgid"], exe or report["comm"]))
            while recent and now - recent[0][0] > BREAKER_WINDOW_S:
                recent.popleft()
            trip = len(recent) > self.breaker_limit and self.armed(number)
            victims = list(recent)
            if trip:
                recent.clear()  # a re-armed block counts afresh
        if trip:
            self.suspend(number)
            self.on_kill(
                {
                    "kind": "breaker",
                    "number": number,
                    "victims": [{"pid": pid, "exe": exe} for _, pid, exe in victims],
                }
            )

    def _mark_exact_copy(self, tgid: int, path: str, number: int) -> None:
        """A process blocked by path that runs the offender's very file (or bytes) is the offender's own.

        Decided from the file at the exec'd path (the kernel's report comes before any kill of
        that process, which may already be dead when this runs) and kept for its kill report.
        """
        with self._lock:
            blocked = self._files.get(number)
        if blocked is None:
            return
        identity, sha256 = blocked
        try:
            st = os.stat(path)
        except OSError:
            return
        exact = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == identity or (
            st.st_size == identity[2] and sha256 is not None and sha256_of_file(path) == sha256
        )
        if not exact:
            return
        with self._lock:
            self._own[tgid] = None
            while len(self._own) > MAX_KNOWN:
                self._own.popitem(last=False)
        try:
            key = self._tgids.Key(tgid)
            entry = self._tgids[key]
        except KeyError:
            return  # it has exited already
        entry.flags |= FLAG_TREE  # and what it forks
        _update_existing(self._tgids, key, entry)

    def suspend(self, number: int) -> None:
        """The block's circuit breaker: nothing more is killed for it, in the kernel or here.

        One write to the block's kernel state: every entry of the block checks it before acting,
        including entries a fork copies while this runs.  A lifted block stays lifted.
        """
        if self.state_of(number) is not None:
            _update_existing(
                self._blocks, self._blocks.Key(number), self._blocks.Leaf(FLAG_SUSPENDED)
            )

    def rearm(self, number: int) -> bool:
        """Arm a suspended block again (its breaker counts afresh); False if it is not placed."""
        with self._lock:
            self._victims.pop(number, None)
        return _update_existing(self._blocks, self._blocks.Key(number), self._blocks.Leaf(0))

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
            cmdline = _cmdline_of(tgid)
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
        with self._lock:
            self._remember(tgid, (exe, cmdline))
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


def _exe_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _update_existing(table, key, value) -> bool:
    """Rewrite an entry only if it is still there (BPF_EXIST): a read-modify-write must never bring
    back an entry the kernel deleted when its process exited (the pid's next owner would get it)."""
    from bcc.libbcc import lib

    return lib.bpf_update_elem(table.map_fd, ct.byref(key), ct.byref(value), 2) == 0  # BPF_EXIST


def scope_cgroup_ids(scope: str, cgroups: tuple[str, ...]) -> set[int] | None:
    """The cgroup ids kill-on-touch may act in (descendants included), or None for everywhere.

    ``response.cgroups``: those cgroups.  ``scope: containers``: the cgroup of every container
    running now (each container's own cgroup, found from its processes; one started later is
    outside until the next refresh: the scope errs towards not acting), within ``cgroups``
    when both are set.  A listed cgroup that does not exist adds nothing.
    """
    if scope == "all" and not cgroups:
        return None
    mount = cgroup2_mount()
    listed = tuple(c.rstrip("/") or "/" for c in cgroups)
    if scope == "containers":
        paths = {
            p
            for p in container_cgroups()
            if not listed
            or any(p == c or p.startswith(c.rstrip("/") + "/") or c == "/" for c in listed)
        }
    else:
        paths = set(listed)
    ids = set()
    for path in paths:
        try:
            ids.add(os.stat(os.path.join(mount, path.lstrip("/"))).st_ino)
        except OSError:
            continue
    return ids


def container_cgroups(proc_root: str = "/proc") -> set[str]:
    """The cgroup v2 paths of the containers running now (from each process's cgroup)."""
    found = set()
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if not container_from_cgroup(read_cgroup_path(pid, proc_root)).container_id:
            continue
        try:
            found.add(cgroup2_of(pid))  # the v2 path the kernel checks (hybrid hosts differ)
        except OSError:
            continue
    return found


def lift_touch_block(block: Block, root: Path) -> str:
    """Delete the block's state (its entries stop at once), its path entry and every pid entry
    carrying its number."""
    number = block.detail.get("number")
    removed = 0
    try:
        with bpf_pins.PinnedMap(root / "maps" / "touch_blocks") as blocks:
            blocks.delete(int(number).to_bytes(4, "little"))
    except FileNotFoundError:
        pass  # placed before the kernel kept block states
    try:
        with bpf_pins.PinnedMap(root / "maps" / "touch_paths") as paths:
            if block.detail.get("path_key"):
                removed += paths.delete(bytes.fromhex(block.detail["path_key"]))
        key_size, value_size, offset = block.detail["tgid_layout"]
        with bpf_pins.PinnedMap(root / "maps" / "touch_tgids") as tgids:
            for key, value in tgids.items(key_size, value_size):
                if int.from_bytes(value[offset : offset + 4], "little") == number:
                    removed += tgids.delete(key)
    except FileNotFoundError:
        pass
    return f"removed {removed} kernel entr{'y' if removed == 1 else 'ies'}"


def rearm_touch_block(block: Block, store, root: Path) -> str:
    """Arm a kill-on-touch block its circuit breaker suspended: in the kernel and in its record."""
    if block.kind != "kill-on-touch":
        return f"not re-armed: a {block.kind} block has no circuit breaker"
    if not block.detail.get("suspended"):
        return "not re-armed: it is not suspended"
    try:
        with bpf_pins.PinnedMap(root / "maps" / "touch_blocks") as blocks:
            blocks.update(int(block.detail["number"]).to_bytes(4, "little"), bytes(4))
    except FileNotFoundError:
        return "failed: the kill-on-touch maps are not pinned (was the block root removed?)"
    block.detail["suspended"] = False
    store.save(block)
    return "re-armed: it kills again (its breaker counts afresh)"


def touch_block_in_place(block: Block, root: Path) -> str:
    """Whether the block's kernel map is there, and whether its breaker suspended it."""
    if not (root / "maps" / "touch_paths").exists():
        return "map missing"
    return "suspended (breaker)" if block.detail.get("suspended") else "in kernel map"


TOUCH_BLOCK = BlockKind(
    "kill-on-touch",
    "t",
    lambda block, root, _others: lift_touch_block(block, root),
    touch_block_in_place,
)
