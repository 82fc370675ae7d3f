"""kill-on-touch: the offender's executable and pids go into pinned kernel maps; a match dies at its touch.

probes/respond_touch.bpf.c does the killing (see its header); this module
fills its maps and reads its reports.  An entry names the executable three
ways: the exec'd path (hashed in the kernel, so a respawn from the same path
is blocked at exec), and device+inode and sha256 (checked here on each exec
report, so a renamed or re-downloaded copy is found: it is put in the map and
killed through its pidfd at once).  The offender's pid and its live
descendants go in too; forks of blocked processes are added by the kernel.
Entries carry a deadline and expire in the kernel.  The programs are attached
only while this module is loaded; the maps (and so the entries) are pinned.
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

import psutil

from gpuguard.detect.allowlist import sha256_of_file
from gpuguard.escape import decode_c_string
from gpuguard.events.abi import DEFINES, TouchReason
from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, new_block_id

PROGRAM_SOURCE = "respond_touch.bpf.c"
PATH_LEN = DEFINES["GG_PATH_LEN"]
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def path_hash(path: str) -> int:
    """The kernel's FNV-1a over the exec'd path (as many bytes as it reads: GG_PATH_LEN - 1)."""
    value = FNV_OFFSET
    for byte in os.fsencode(path)[: PATH_LEN - 1]:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


class TouchBlocker:
    """The loaded kill-on-touch program, its pinned maps and the identities matched in user space."""

    def __init__(self, root: Path, on_kill: Callable[[dict], None]) -> None:
        self.root = root
        self.on_kill = on_kill
        self._bpf = bpf_pins.compile_program(PROGRAM_SOURCE, root)
        self._paths = self._bpf[b"touch_paths"]
        self._tgids = self._bpf[b"touch_tgids"]
        self._settings = self._bpf[b"touch_settings"]
        self._event_type = ct.POINTER(self._bpf[b"schema_touch_event"].Leaf)
        self.drop_recycled()
        # (st_dev, st_ino) -> (block number, deadline); size -> sha256 -> (number, deadline)
        self._inodes: dict[tuple[int, int], tuple[int, int]] = {}
        self._hashes: dict[int, dict[str, tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bpf[b"touch_events"].open_ring_buffer(self._on_event)
        self._thread = threading.Thread(target=self._poll, name="gpuguard-touch", daemon=True)
        self._thread.start()

    # -- placing ---------------------------------------------------------------------------------
    def _entry(self, number: int, deadline: int):
        value = self._paths.Leaf()
        value.expires_ns = deadline
        value.added_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        value.block = number
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
        return dropped

    def add(
        self,
        pid: int,
        exe: str,
        identity: tuple[int, int, int, int] | None,
        sha256: str | None,
        ttl_s: float,
        reason: str,
        *,
        block_executable: bool = True,
    ) -> Block:
        """Block ``pid`` and its descendants; with ``block_executable``, every process of its executable too."""
        number = secrets.randbits(31) + 1
        deadline = time.monotonic_ns() + int(ttl_s * 1e9) if ttl_s else 0
        entry = self._entry(number, deadline)
        if not block_executable:
            exe, identity, sha256 = "", None, None
        path_key = self._paths.Key(path_hash(exe)) if exe else None
        if path_key is not None:
            self._paths[path_key] = entry
        tgids = [pid]
        try:
            tgids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
        for tgid in tgids:
            self._tgids[self._tgids.Key(tgid)] = entry
        size = identity[2] if identity else None
        if sha256 is None and exe:
            sha256 = sha256_of_file(f"/proc/{pid}/exe")
            if size is None:
                try:
                    size = os.stat(f"/proc/{pid}/exe").st_size
                except OSError:
                    size = None
        self.remember(number, deadline, identity, size, sha256)
        now = time.time()
        return Block(
            new_block_id("kill-on-touch"),
            "kill-on-touch",
            now,
            now + ttl_s if ttl_s else None,
            reason,
            pid,
            exe=exe,
            detail={
                "number": number,
                "deadline_ns": deadline,
                "path_key": bytes(path_key).hex() if path_key is not None else None,
                "tgids": tgids,
                "identity": list(identity) if identity else None,
                # touch_tgids' key size, value size and the value's block offset, from bcc's view of
                # gpuguard.h, so `gpuguard unblock` finds this block's entries without compiling.
                "tgid_layout": [
                    ct.sizeof(self._tgids.Key),
                    ct.sizeof(self._tgids.Leaf),
                    self._tgids.Leaf.block.offset,
                ],
                "size": size,
                "sha256": sha256,
            },
        )

    def remember(
        self, number: int, deadline: int, identity, size: int | None, sha256: str | None
    ) -> None:
        """Identities matched on exec reports (also used to restore blocks after a restart)."""
        with self._lock:
            if identity:
                self._inodes[(identity[0], identity[1])] = (number, deadline)
            if sha256 and size is not None:
                self._hashes.setdefault(size, {})[sha256] = (number, deadline)
            self._settings[ct.c_int(0)] = ct.c_uint(1 if (self._inodes or self._hashes) else 0)

    def forget(self, number: int) -> None:
        with self._lock:
            self._inodes = {k: v for k, v in self._inodes.items() if v[0] != number}
            self._hashes = {
                s: kept
                for s, h in self._hashes.items()
                if (kept := {d: v for d, v in h.items() if v[0] != number})
            }
            self._settings[ct.c_int(0)] = ct.c_uint(1 if (self._inodes or self._hashes) else 0)

    # -- reports ---------------------------------------------------------------------------------
    def _poll(self) -> None:
        while not self._stop.is_set():
            self._bpf.ring_buffer_poll(100)

    def _on_event(self, _ctx, data, _size) -> None:
        event = ct.cast(data, self._event_type).contents
        try:
            reason = (
                TouchReason(event.reason).name.lower().replace("_", "-")
            )  # "gpu-open", "connect", "exec"
        except ValueError:
            reason = str(event.reason)
        report = {
            "tgid": event.tgid,
            "reason": reason,
            "number": event.block,
            "comm": decode_c_string(bytes(event.comm)),
            "path": decode_c_string(bytes(event.path)),
        }
        if reason == "exec":
            if event.block == 0:
                self._check_exec(report)
            return
        self.on_kill(report)

    def _check_exec(self, report: dict) -> None:
        """A renamed or re-downloaded copy: same inode, or same size and sha256 as a blocked executable."""
        tgid = report["tgid"]
        try:
            st = os.stat(f"/proc/{tgid}/exe")
        except OSError:
            return
        now = time.monotonic_ns()
        with self._lock:
            match = self._inodes.get((st.st_dev, st.st_ino))
            by_size = self._hashes.get(st.st_size)
        if match is None and by_size:
            digest = sha256_of_file(f"/proc/{tgid}/exe")
            match = by_size.get(digest) if digest else None
        if match is None or (match[1] and now >= match[1]):
            return
        self._tgids[self._tgids.Key(tgid)] = self._entry(*match)
        try:
            pidfd = os.pidfd_open(tgid)
        except OSError:
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            return
        finally:
            os.close(pidfd)
        self.on_kill({**report, "number": match[0]})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._bpf.cleanup()


def lift_touch_block(block: Block, root: Path) -> str:
    """Delete the block's path entry and every pid entry carrying its number."""
    number = block.detail.get("number")
    removed = 0
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
