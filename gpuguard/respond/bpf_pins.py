"""The BPF side of blocks: bpffs pins, pinned maps read and written by fd, cgroup attach/detach.

Blocks live in the kernel, pinned under the block root (``/sys/fs/bpf/gpuguard``
by default), so they outlive the agent: ``maps/`` holds the maps the respond
programs share (created by bcc's BPF_TABLE_PINNED on first load), and
``blocks/<id>/`` the programs a block attached, so ``gpuguard unblock`` can
detach exactly them without compiling anything.  bcc is imported only when
something is compiled or a map is touched.
"""

from __future__ import annotations

import ctypes as ct
import os
import shutil
import subprocess
from pathlib import Path

from gpuguard.errors import GpuguardError
from gpuguard.events.abi import probe_dir
from gpuguard.sources.ebpf.exit_gens import identity_cflags
from gpuguard.sources.ebpf.kernel_headers import compile_with_headers

BPF_FS_MAGIC = 0xCAFE4A11
BPF_F_ALLOW_MULTI = 2


def _bcc():
    try:
        import bcc
        from bcc.libbcc import lib
    except ImportError:
        raise GpuguardError(
            "bcc is not importable, so kernel blocks cannot be placed or lifted",
            "apt-get install python3-bpfcc (bash packaging/setup-host.sh setup)",
        ) from None
    return bcc, lib


def ensure_pin_root(root: str) -> Path:
    """Make ``root`` (and its maps/ and blocks/ folders) on a bpffs, mounting /sys/fs/bpf if nothing is there."""
    path = Path(root)
    mount_point = path.parent
    if (
        mount_point.is_dir()
        and _fs_type(mount_point) != BPF_FS_MAGIC
        and str(mount_point) == "/sys/fs/bpf"
    ):
        # What systemd does at boot; some hosts (and containers) skip it.
        subprocess.run(
            ["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], check=False, capture_output=True
        )
    try:
        for sub in ("maps", "blocks"):
            (path / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuguardError(
            f"cannot create the block root {root}: {exc.strerror}",
            "mount a bpf filesystem there (mount -t bpf bpf /sys/fs/bpf) or set response.pin_root",
        ) from None
    if _fs_type(path) != BPF_FS_MAGIC:
        raise GpuguardError(
            f"the block root {root} is not on a bpf filesystem",
            "mount -t bpf bpf /sys/fs/bpf, or set response.pin_root to a path on one",
        )
    return path


def _fs_type(path: Path) -> int:
    class StatFs(ct.Structure):
        _fields_ = [("f_type", ct.c_long), ("rest", ct.c_byte * 120)]

    buf = StatFs()
    libc = ct.CDLL(None, use_errno=True)
    if libc.statfs(str(path).encode(), ct.byref(buf)) != 0:
        return 0
    return buf.f_type & 0xFFFFFFFF


def compile_program(source_name: str, root: Path):
    """Compile ``probes/<source_name>`` with its maps pinned under ``root``/maps (tracepoints attach at once)."""
    bcc, _ = _bcc()
    probes = probe_dir()
    cflags = [f"-I{probes}", f'-DGG_PIN_ROOT="{root}"', *identity_cflags(), "-Wno-comment"]
    try:
        return compile_with_headers(
            lambda: bcc.BPF(src_file=str(probes / source_name).encode(), cflags=cflags)
        )
    except GpuguardError:
        raise
    except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile/load errors
        raise GpuguardError(
            f"the response probe {source_name} failed to compile or load: {str(exc).splitlines()[0]}",
            "check kernel headers (bash packaging/setup-host.sh setup) and that BPF is allowed",
        ) from None


def pin(fd: int, path: Path) -> None:
    _, lib = _bcc()
    if lib.bpf_obj_pin(fd, str(path).encode()) != 0:
        raise OSError(ct.get_errno(), f"cannot pin {path}")


def open_pinned(path: Path) -> int:
    _, lib = _bcc()
    fd = lib.bpf_obj_get(str(path).encode())
    if fd < 0:
        raise FileNotFoundError(f"no pinned object at {path}")
    return fd


def attach_to_cgroup(prog_fd: int, cgroup_dir: str, attach_type: int) -> None:
    _, lib = _bcc()
    cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if lib.bpf_prog_attach(prog_fd, cgroup_fd, attach_type, BPF_F_ALLOW_MULTI) != 0:
            err = ct.get_errno()
            raise OSError(
                err,
                f"attach to {cgroup_dir}: {os.strerror(err)} (a program attached without "
                "BPF_F_ALLOW_MULTI forbids others)",
            )
    finally:
        os.close(cgroup_fd)


def detach_from_cgroup(prog_fd: int, cgroup_dir: str, attach_type: int) -> bool:
    """Detach; False when the cgroup or the attachment is already gone."""
    _, lib = _bcc()
    try:
        cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return False
    try:
        return lib.bpf_prog_detach2(prog_fd, cgroup_fd, attach_type) == 0
    finally:
        os.close(cgroup_fd)


def remove_pins(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _map_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("map_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def map_holders(map_ids: set[int]) -> set[int]:
    """Pids of the processes holding an fd on one of ``map_ids`` (a running agent does)."""
    holders: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry.name}/fd/{fd}") != "anon_inode:bpf-map":
                    continue
                with open(f"/proc/{entry.name}/fdinfo/{fd}") as f:
                    ids = {int(line.split()[1]) for line in f if line.startswith("map_id:")}
            except (OSError, ValueError, IndexError):
                continue
            if ids & map_ids:
                holders.add(int(entry.name))
                break
    return holders


def remove_block_root(root: Path) -> str:
    """Remove what gpuguard pinned under ``root`` once every block is lifted; a sentence saying what.

    The shared maps under ``maps/`` go unless a running process (the agent) still holds one: then
    they stay, since new blocks would land in maps no `gpuguard unblock` could reach.  A
    ``blocks/<id>/`` folder left (its record was lost) is kept: its programs may still be
    attached.  The root itself goes when nothing else is in it.
    """
    if not root.is_dir():
        return "nothing pinned"
    maps_dir, blocks_dir = root / "maps", root / "blocks"
    said = []
    pinned = sorted(maps_dir.iterdir()) if maps_dir.is_dir() else []
    ids = set()
    for path in pinned:
        try:
            fd = open_pinned(path)
        except (FileNotFoundError, GpuguardError):
            continue
        try:
            found = _map_id(fd)
        finally:
            os.close(fd)
        if found is not None:
            ids.add(found)
    holders = map_holders(ids) if ids else set()
    if holders:
        said.append(
            f"kept {len(pinned)} pinned map(s): held by pid {', '.join(map(str, sorted(holders)))}"
            " (stop the agent, then unblock --all again)"
        )
    else:
        for path in pinned:
            path.unlink(missing_ok=True)
        if pinned:
            said.append(f"removed {len(pinned)} pinned map(s)")
    left = sorted(p.name for p in blocks_dir.iterdir()) if blocks_dir.is_dir() else []
    if left:
        said.append(f"kept program pins without a record: blocks/{', blocks/'.join(left)}")
    for sub in (maps_dir, blocks_dir, root):
        try:
            sub.rmdir()
        except OSError:
            pass
    if not root.exists():
        said.append(f"removed {root}")
    return "; ".join(said) or "nothing pinned"


class PinnedMap:
    """A pinned map used by fd with raw key/value bytes.

    The bytes come from bcc's ctypes classes of the structs in gpuguard.h
    (the Responder compiles the program) and are kept in the block record, so
    ``gpuguard unblock`` deletes exactly those keys without a struct mirror.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_pinned(path)

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        """Write ``key``; ``flags`` as bpf(2) takes them (0 any, 1 BPF_NOEXIST, 2 BPF_EXIST)."""
        _, lib = _bcc()
        kbuf, vbuf = (
            ct.create_string_buffer(key, len(key)),
            ct.create_string_buffer(value, len(value)),
        )
        if lib.bpf_update_elem(self.fd, kbuf, vbuf, flags) != 0:
            raise OSError(ct.get_errno(), f"cannot update the pinned map {self.path.name}")

    def delete(self, key: bytes) -> bool:
        _, lib = _bcc()
        return lib.bpf_delete_elem(self.fd, ct.create_string_buffer(key, len(key))) == 0

    def items(self, key_size: int, value_size: int) -> list[tuple[bytes, bytes]]:
        _, lib = _bcc()
        out = []
        key, nxt, value = (
            ct.create_string_buffer(key_size),
            ct.create_string_buffer(key_size),
            ct.create_string_buffer(value_size),
        )
        first = True
        while lib.bpf_get_next_key(self.fd, None if first else key, nxt) == 0:
            first = False
            ct.memmove(key, nxt, key_size)
            if lib.bpf_lookup_elem(self.fd, key, value) == 0:
                out.append((key.raw, value.raw))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PinnedMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
