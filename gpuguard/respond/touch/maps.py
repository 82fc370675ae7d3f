"""The kernel-map side of kill-on-touch: the program's pinned maps, filled and read from user space.

probes/respond_touch.bpf.c does the killing (see its header).  :class:`TouchMaps` compiles it
and owns its maps: the blocked path and pid entries (never one left for a pid that exited),
each block's state (armed or suspended), the scope of cgroup ids, what each blocked process
runs (for its kill record) and the switches that say what the kernel must report.  The
functions after it reach the same maps through their pins, without the program: lifting a
block, re-arming it and checking it for `gpuguard unblock` and `gpuguard blocks`.
"""

from __future__ import annotations

import ctypes as ct
import os
import time
from pathlib import Path

from gpuguard.events.abi import DEFINES
from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, BlockKind, BlockStore
from gpuguard.respond.touch.names import raw_cmdline
from gpuguard.sources.ebpf.exit_gens import ExitGenTable
from gpuguard.sources.proc.identity import pidfd_exited

PROGRAM_SOURCE = "respond_touch.bpf.c"
PATH_LEN = DEFINES["GG_PATH_LEN"]
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
FLAG_TREE = 1  # enum gg_touch_flag
FLAG_SUSPENDED = 2  # also a block's state in touch_blocks
PROC_ARGS_LEN = DEFINES["GG_ARGS_LEN"]  # bytes of argv the kernel keeps for a blocked process


def path_hash(path: str) -> int:
    """The kernel's FNV-1a over the exec'd path (as many bytes as it reads: GG_PATH_LEN - 1)."""
    value = FNV_OFFSET
    for byte in os.fsencode(path)[: PATH_LEN - 1]:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


class TouchMaps:
    """The compiled kill-on-touch program and its maps (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bpf = bpf_pins.compile_program(PROGRAM_SOURCE, root)
        self._paths = self._bpf[b"touch_paths"]
        self._tgids = self._bpf[b"touch_tgids"]
        self._settings = self._bpf[b"touch_settings"]
        self._scope = self._bpf[b"touch_scope"]
        self._blocks = self._bpf[b"touch_blocks"]
        self._procs = self._bpf[b"touch_procs"]
        self.generations = ExitGenTable(self._bpf[b"touch_exit_gens"])
        self.drop_recycled()

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

    def suspend(self, number: int) -> None:
        """The block's circuit breaker: nothing more is killed for it, in the kernel or here.

        One write to the block's kernel state: every entry of the block checks it before acting,
        including entries a fork copies while this runs.  A lifted block stays lifted.
        """
        if self.state_of(number) is not None:
            update_existing(
                self._blocks, self._blocks.Key(number), self._blocks.Leaf(FLAG_SUSPENDED)
            )

    # -- entries ---------------------------------------------------------------------------------
    def _entry(self, number: int, deadline: int, flags: int = 0):
        value = self._paths.Leaf()
        value.expires_ns = deadline
        value.added_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        value.block = number
        value.flags = flags
        return value

    def _put_path(self, number: int, deadline: int, path: str):
        """The kernel's entry for an exec'd path; its key."""
        key = self._paths.Key(path_hash(path))
        self._paths[key] = self._entry(number, deadline)
        return key

    def _tgid_layout(self) -> list[int]:
        """touch_tgids' key size, value size and the value's block offset, from bcc's view of
        gpuguard.h, so `gpuguard unblock` finds a block's entries without compiling."""
        return [
            ct.sizeof(self._tgids.Key),
            ct.sizeof(self._tgids.Leaf),
            self._tgids.Leaf.block.offset,
        ]

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

    def _report_execs(self, matching: bool) -> None:
        """Tell the kernel which execs to report: every one in scope while user space matches."""
        self._settings[ct.c_int(0)] = ct.c_uint(1 if matching else 0)
        # the kernel reads argv at execve entry for blocked paths only while any path is blocked
        has_paths = next(iter(self._paths.keys()), None) is not None
        self._settings[ct.c_int(2)] = ct.c_uint(1 if has_paths else 0)

    def _keep_proc(self, tgid: int, exe: str) -> None:
        """Tell the kernel what ``tgid`` runs (its forks inherit it): named in kill reports."""
        raw, cut = raw_cmdline(tgid, PROC_ARGS_LEN)
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

    def _mark_tree(self, tgid: int) -> None:
        """The offender's own: its entry (and what it forks) carries the tree flag."""
        try:
            key = self._tgids.Key(tgid)
            entry = self._tgids[key]
        except KeyError:
            return  # it has exited already
        entry.flags |= FLAG_TREE
        update_existing(self._tgids, key, entry)


def update_existing(table, key, value) -> bool:
    """Rewrite an entry only if it is still there (BPF_EXIST): a read-modify-write must never bring
    back an entry the kernel deleted when its process exited (the pid's next owner would get it)."""
    from bcc.libbcc import lib

    return lib.bpf_update_elem(table.map_fd, ct.byref(key), ct.byref(value), 2) == 0  # BPF_EXIST


# -- through the pins, without the program -------------------------------------------------------


def lift_touch_block(block: Block, root: Path, others: list[Block]) -> str:
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


def rearm_touch_block(block: Block, store: BlockStore, root: Path) -> str:
    """Arm a kill-on-touch block its circuit breaker suspended: in the kernel and in its record."""
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
    "kill-on-touch", "t", lift_touch_block, touch_block_in_place, rearm=rearm_touch_block
)
