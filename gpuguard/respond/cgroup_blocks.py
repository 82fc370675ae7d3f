"""Quarantine and the cgroup egress block: BPF programs on an offender's cgroup v2.

quarantine attaches ``deny_gpu_devices`` (probes/respond_cgroup.bpf.c) to the
offender's container cgroup, or to a cgroup gpuguard creates and moves it
into: opening a GPU node (NVIDIA 195, DRM 226, and the dynamic majors of
nvidia-uvm, nvidia-caps and kfd from /proc/devices) fails with EPERM while the
process keeps running.  GPU fds it already holds stay open; the outcome says
how many.  block-egress puts the pool addresses in the pinned
``pool_addresses`` map (with a deadline) and attaches the connect4/connect6
programs to the offender's current cgroup.  Each attachment's program is
pinned under ``blocks/<id>/`` so it can be detached after a restart.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from pathlib import Path
from typing import Any

from gpuguard.respond import bpf_pins
from gpuguard.respond.blocks import Block, BlockKind, BlockStore, new_block_id
from gpuguard.sources.proc.gpu_fds import list_gpu_fds

STATIC_GPU_MAJORS = {195: "nvidia", 226: "drm"}
DYNAMIC_GPU_DEVICES = (
    "nvidia-uvm",
    "nvidia-caps",
    "nvidia-caps-imex-channels",
    "nvidia-nvlink",
    "nvidia-nvswitch",
    "kfd",
)
PROGRAM_SOURCE = "respond_cgroup.bpf.c"


def gpu_majors(proc_devices: str = "/proc/devices") -> dict[int, str]:
    """Character majors of the GPU device classes: the fixed ones and those /proc/devices lists."""
    majors = dict(STATIC_GPU_MAJORS)
    try:
        text = Path(proc_devices).read_text()
    except OSError:
        return majors
    section = text.split("Block devices:")[0]
    for line in section.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1] in DYNAMIC_GPU_DEVICES:
            majors[int(parts[0])] = parts[1]
    return majors


def cgroup2_mount() -> str:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return left.split()[4]
    raise OSError("cgroup v2 is not mounted")


def cgroup2_of(pid: int) -> str:
    """The process's cgroup v2 path (relative to the mount), from /proc/PID/cgroup's 0:: line."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    raise OSError(f"pid {pid} has no cgroup v2 membership")


def gpu_fds_open(pid: int) -> int:
    """How many GPU device fds the process holds now (quarantine does not close them)."""
    try:
        return len(list_gpu_fds(pid))
    except (OSError, ValueError):
        return 0


class CgroupBlocker:
    """Loads the cgroup programs once and places or lifts quarantine and egress blocks."""

    def __init__(self, root: Path, store: BlockStore, quarantine_parent: str = "") -> None:
        self.root = root
        self.store = store
        self.mount = cgroup2_mount()
        self.quarantine_parent = quarantine_parent or os.path.join(self.mount, "gpuguard")
        self._bpf = None
        self._progs: dict[str, tuple[int, int]] = {}  # name -> (prog fd, attach type)

    def load(self) -> None:
        if self._bpf is not None:
            return
        bpf = bpf_pins.compile_program(PROGRAM_SOURCE, self.root)
        from bcc import BPF, BPFAttachType

        self._progs = {
            "device": (
                bpf.load_func(b"deny_gpu_devices", BPF.CGROUP_DEVICE).fd,
                int(BPFAttachType.CGROUP_DEVICE),
            ),
            "connect4": (
                bpf.load_func(
                    b"refuse_pool_connect4",
                    BPF.CGROUP_SOCK_ADDR,
                    attach_type=BPFAttachType.CGROUP_INET4_CONNECT,
                ).fd,
                int(BPFAttachType.CGROUP_INET4_CONNECT),
            ),
            "connect6": (
                bpf.load_func(
                    b"refuse_pool_connect6",
                    BPF.CGROUP_SOCK_ADDR,
                    attach_type=BPFAttachType.CGROUP_INET6_CONNECT,
                ).fd,
                int(BPFAttachType.CGROUP_INET6_CONNECT),
            ),
        }
        majors = bpf[b"denied_majors"]
        for major in gpu_majors():
            majors[majors.Key(major)] = majors.Leaf(1)
        self._bpf = bpf

    def close(self) -> None:
        """Unload the programs; attachments and pins stay (they are the blocks)."""
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def _attach(
        self, block_id: str, names: tuple[str, ...], cgroup_dir: str
    ) -> list[dict[str, Any]]:
        pins = self.root / "blocks" / block_id
        pins.mkdir(parents=True, exist_ok=True)
        attached = []
        try:
            for name in names:
                fd, attach_type = self._progs[name]
                bpf_pins.attach_to_cgroup(fd, cgroup_dir, attach_type)
                attached.append(
                    {"program": name, "attach_type": attach_type, "pin": str(pins / name)}
                )
                bpf_pins.pin(fd, pins / name)
        except OSError:
            _detach(attached, cgroup_dir)
            bpf_pins.remove_pins(pins)
            raise
        return attached

    def quarantine(self, pid: int, container: bool, ttl_s: float, reason: str) -> Block:
        self.load()
        block_id = new_block_id(QUARANTINE_BLOCK)
        place = self._offender_cgroup(pid, container, block_id)
        now = time.time()
        existing = self._live_block(QUARANTINE_BLOCK.name, place["cgroup"], now)
        if (
            existing is not None
        ):  # already quarantined (e.g. a second verdict): one program per cgroup
            existing.detail["open_gpu_fds"] = gpu_fds_open(pid)
            return existing
        attached = self._attach(block_id, ("device",), place["cgroup"])
        return Block(
            block_id,
            QUARANTINE_BLOCK.name,
            now,
            now + ttl_s if ttl_s else None,
            reason,
            pid,
            detail={
                **place,
                "programs": attached,
                "majors": {str(k): v for k, v in sorted(gpu_majors().items())},
                "open_gpu_fds": gpu_fds_open(pid),
            },
        )

    def _live_block(self, kind: str, cgroup_dir: str, now: float) -> Block | None:
        return next(
            (
                b
                for b in self.store.load()
                if b.kind == kind and b.detail.get("cgroup") == cgroup_dir and not b.expired(now)
            ),
            None,
        )

    def _offender_cgroup(self, pid: int, container: bool, block_id: str) -> dict[str, Any]:
        """The container's cgroup, the gpuguard cgroup it is already in, or a new one it is moved into.

        Programs are never attached to a shared cgroup (the root, a user's session): only the
        offender's own container, or a cgroup holding the offender alone.
        """
        current = os.path.join(self.mount, cgroup2_of(pid).lstrip("/"))
        if container:
            return {"cgroup": current, "created_cgroup": False, "original_cgroup": current}
        parent = self.quarantine_parent.rstrip("/") + "/"
        if current.startswith(parent):
            original = next(
                (
                    b.detail.get("original_cgroup", "")
                    for b in self.store.load()
                    if b.detail.get("cgroup") == current
                ),
                "",
            )
            return {"cgroup": current, "created_cgroup": True, "original_cgroup": original}
        cgroup_dir = os.path.join(self.quarantine_parent, block_id)
        os.makedirs(cgroup_dir, exist_ok=True)
        Path(cgroup_dir, "cgroup.procs").write_text(str(pid))
        return {"cgroup": cgroup_dir, "created_cgroup": True, "original_cgroup": current}

    def block_egress(
        self, pid: int, container: bool, addresses: list[str], ttl_s: float, reason: str
    ) -> Block:
        self.load()
        block_id = new_block_id(EGRESS_BLOCK)
        place = self._offender_cgroup(pid, container, block_id)
        cgroup_dir = place["cgroup"]
        table = self._bpf[b"pool_addresses"]
        deadline = time.monotonic_ns() + int(ttl_s * 1e9) if ttl_s else 0
        keys = []
        for address in addresses:
            ip = ipaddress.ip_address(address)
            key = table.Key()
            key.family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            for i, byte in enumerate(ip.packed):
                key.addr[i] = byte
            value = table.Leaf()
            value.expires_ns = deadline
            table[key] = value
            keys.append(bytes(key).hex())
        now = time.time()
        existing = self._live_block(EGRESS_BLOCK.name, cgroup_dir, now)
        if (
            existing is not None
        ):  # the cgroup already carries the programs: add the addresses to that block
            d = existing.detail
            d["addresses"] = sorted(set(d["addresses"]) | set(addresses))
            d["map_keys"] = sorted(set(d["map_keys"]) | set(keys))
            if existing.expires is not None:
                existing.expires = now + ttl_s if ttl_s else None
            return existing
        attached = self._attach(block_id, ("connect4", "connect6"), cgroup_dir)
        return Block(
            block_id,
            EGRESS_BLOCK.name,
            now,
            now + ttl_s if ttl_s else None,
            reason,
            pid,
            detail={
                **place,
                "addresses": addresses,
                "map_keys": keys,
                "programs": attached,
            },
        )


def _detach(attached: list[dict[str, Any]], cgroup_dir: str) -> int:
    done = 0
    for entry in attached:
        try:
            fd = bpf_pins.open_pinned(Path(entry["pin"]))
        except FileNotFoundError:
            continue
        try:
            done += bpf_pins.detach_from_cgroup(fd, cgroup_dir, entry["attach_type"])
        finally:
            os.close(fd)
    return done


def lift_quarantine_block(block: Block, root: Path, others: list[Block]) -> str:
    """Detach the block's programs; release the cgroup gpuguard made when no other block uses it."""
    detached = _detach(block.detail.get("programs", []), block.detail.get("cgroup", ""))
    return _release(block, root, others, detached)


def lift_egress_block(block: Block, root: Path, others: list[Block]) -> str:
    """Detach the block's programs and delete its addresses no other egress block holds."""
    detail = block.detail
    detached = _detach(detail.get("programs", []), detail.get("cgroup", ""))
    held = {k for b in others if b.kind == block.kind for k in b.detail.get("map_keys", [])}
    try:
        with bpf_pins.PinnedMap(root / "maps" / "pool_addresses") as table:
            for key in detail.get("map_keys", []):
                if key not in held:
                    table.delete(bytes.fromhex(key))
    except FileNotFoundError:
        pass
    return _release(block, root, others, detached)


def _release(block: Block, root: Path, others: list[Block], detached: int) -> str:
    cgroup_dir = block.detail.get("cgroup", "")
    if block.detail.get("created_cgroup") and not any(
        b.detail.get("cgroup") == cgroup_dir for b in others
    ):
        _release_cgroup(cgroup_dir, block.detail.get("original_cgroup", ""))
    bpf_pins.remove_pins(root / "blocks" / block.id)
    return f"detached {detached} program(s) from {cgroup_dir}"


def _release_cgroup(cgroup_dir: str, original: str) -> None:
    """Move the processes back where they came from and remove the cgroup gpuguard made."""
    try:
        pids = Path(cgroup_dir, "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            Path(original, "cgroup.procs").write_text(pid)
        except OSError:
            pass
    try:
        os.rmdir(cgroup_dir)
    except OSError:
        pass


def cgroup_block_in_place(block: Block, root: Path) -> str:
    """Whether every program the block attached is still pinned."""
    pins = [Path(p["pin"]).exists() for p in block.detail.get("programs", [])]
    return "attached" if pins and all(pins) else "programs missing"


QUARANTINE_BLOCK = BlockKind("quarantine", "q", lift_quarantine_block, cgroup_block_in_place)
EGRESS_BLOCK = BlockKind("block-egress", "e", lift_egress_block, cgroup_block_in_place)
