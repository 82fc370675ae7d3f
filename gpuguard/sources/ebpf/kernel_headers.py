"""Which kernel headers bcc compiles the probes against: the host's, the kernel's own, or ours.

Chosen once a process, in this order: ``BCC_KERNEL_SOURCE`` set by the operator; the host's
``/lib/modules/$(uname -r)/build``; the kernel's ``/sys/kernel/kheaders.tar.xz``; the set
gpuguard carries (``probes/headers``, made by packaging/bundle_headers.py).  The probes read
only tracepoint arguments, user memory, UAPI structs and BTF offsets, so any of them compiles
the same programs.  An archive is unpacked under gpuguard's runtime directory, used through
``BCC_KERNEL_SOURCE`` (bcc reads it at each compile) and removed at exit; a directory left
by a process that died is removed by the next one (each holds a lock on its own).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpuguard.errors import GpuguardError
from gpuguard.events.abi import probe_dir

KHEADERS = Path("/sys/kernel/kheaders.tar.xz")
MODULES = Path("/lib/modules")
RUNTIME_DIR = Path("/run/gpuguard/headers")
# What bcc reads before any probe text: a tree without it is no kernel tree to bcc.
KCONFIG = "include/linux/kconfig.h"
# The headers the probes and bcc's helpers name themselves (the rest follow from these).
NEEDED = (
    KCONFIG,
    "include/generated/autoconf.h",
    "include/uapi/linux/ptrace.h",
    "include/uapi/linux/bpf.h",
)
_LOCK = ".lock"
# The probes' own includes (probes/*.c), compiled alone to try a tree made for another kernel.
HEADER_TEST = """
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf.h>
#include <asm/unistd.h>
int gg_header_test(void *ctx) { return 0; }
"""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class HeaderSource:
    """Where bcc's kernel headers come from, and why that one."""

    kind: str  # "env", "host", "kheaders", "bundled" or "none"
    path: str  # the tree bcc reads ("" for none)
    why: str

    def line(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"{self.kind}{where}: {self.why}"


def _missing(roots: list[Path]) -> list[str]:
    return [rel for rel in NEEDED if not any((root / rel).is_file() for root in roots)]


def host_tree(release: str | None = None, modules: Path | None = None) -> tuple[Path | None, str]:
    """The host's header tree when it holds what the probes need, else (None, what is wrong)."""
    release = release or os.uname().release
    modules = modules or MODULES
    build = modules / release / "build"
    source = modules / release / "source"  # Debian and SUSE split the tree in two
    if not (build / "include").is_dir() and not (source / "include").is_dir():
        return None, f"no kernel headers at {build}"
    missing = _missing([build, source])
    if missing:
        return None, f"the headers at {build} lack {', '.join(missing)}"
    made_for = _made_for(build)
    if made_for and made_for != release:
        return build, f"the host's headers, made for {made_for} (not this kernel: tried first)"
    return build, f"the host's headers for {release}"


def bundled_archive() -> tuple[Path | None, dict, str]:
    """gpuguard's own header set for this CPU: (archive, manifest, why not when absent)."""
    folder = probe_dir() / "headers"
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return None, {}, f"gpuguard's header set is missing ({folder}/manifest.json: {exc})"
    machine = os.uname().machine
    if manifest.get("arch") != machine:
        return (
            None,
            manifest,
            f"gpuguard carries headers for {manifest.get('arch')} only, not {machine}",
        )
    return folder / manifest["tarball"], manifest, ""


def plan(release: str | None = None) -> list[HeaderSource]:
    """Every source this host offers, best first, without unpacking anything (``doctor``)."""
    offered = []
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        offered.append(HeaderSource("env", env, "BCC_KERNEL_SOURCE is set"))
    tree, why = host_tree(release)
    if tree is not None:
        offered.append(HeaderSource("host", str(tree), why))
    if KHEADERS.is_file():
        offered.append(
            HeaderSource("kheaders", str(KHEADERS), "the kernel's own (CONFIG_IKHEADERS)")
        )
    archive, manifest, not_here = bundled_archive()
    if archive is not None:
        version = manifest.get("debian_version", "?")
        offered.append(
            HeaderSource(
                "bundled", str(archive), f"gpuguard's set (Linux {version}, UAPI and bcc's)"
            )
        )
    if not offered:
        reasons = [why, f"no {KHEADERS}", not_here]
        offered.append(HeaderSource("none", "", "; ".join(reasons)))
    return offered


def _unpack(data: bytes, into: Path, arch: str) -> None:
    """Regular files and directories only, each inside ``into`` (the archive is read as data)."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data)), mode="r:") as tar:
        for member in tar:
            name = os.path.normpath(member.name.removeprefix("./") or ".")
            if name.startswith("..") or os.path.isabs(name):
                continue
            if name.startswith("arch/") and not name.startswith(f"arch/{arch}/"):
                continue  # the kernel's archive holds one arch; ours too, but say so here
            if member.isfile():
                dest = into / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)


def _made_for(build: Path) -> str:
    """The kernel release a header tree was made for ("" when it does not say)."""
    try:
        text = (build / "include" / "generated" / "utsrelease.h").read_text()
    except OSError:
        return ""
    match = re.search(r'UTS_RELEASE\s+"([^"]+)"', text)
    return match.group(1) if match else ""


def _host_problem(build: Path) -> str:
    """Why the host's tree cannot be trusted, or "".  A tree made for this very kernel is
    trusted; another (a distribution's closest headers linked in, a leftover) must first
    compile a program holding the probes' includes: bcc 0.26 can crash the process when the
    probes themselves fail to compile, so a broken tree is found with a small one."""
    if _made_for(build) == os.uname().release:
        return ""
    try:
        import bcc
    except ImportError:
        return ""  # preflight says so
    saved = os.dup(2)  # clang writes its diagnostics to fd 2: the reason is said in one line
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        bcc.BPF(text=HEADER_TEST.encode()).cleanup()
    except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"the host headers at {build} are for another kernel and do not compile ({first})"
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return ""


def _arch_dir(machine: str) -> str:
    return {"x86_64": "x86", "i686": "x86", "aarch64": "arm64"}.get(machine, machine)


def _sweep_stale(base: Path) -> None:
    """Remove trees whose process is gone (its lock is free)."""
    for old in base.glob("tree-*"):
        try:
            fd = os.open(old / _LOCK, os.O_RDONLY)
        except OSError:
            shutil.rmtree(old, ignore_errors=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live process holds it
        finally:
            os.close(fd)
        shutil.rmtree(old, ignore_errors=True)


class Headers:
    """This process's header source: chosen at the first compile, kept until exit."""

    def __init__(self, runtime_dir: Path = RUNTIME_DIR) -> None:
        self.runtime_dir = runtime_dir
        self.source: HeaderSource | None = None
        self._tree: Path | None = None  # a tree we unpacked (removed by close)
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self._fell_back = False
        self._offered: HeaderSource | None = None  # the best this host offered, before any choice

    def use(self) -> HeaderSource:
        """Choose (once) and point bcc at it; raises GpuguardError when no source exists."""
        with self._mutex:
            if self.source is None:
                offered = plan()
                self._offered = self._offered or offered[0]
                self.source = self._choose(offered)
            return self.source

    def first_offered(self) -> HeaderSource:
        """The best source this host offered before this process chose one (a tree we unpack
        is named by ``BCC_KERNEL_SOURCE`` afterwards, so a later :func:`plan` says "env")."""
        with self._mutex:
            if self._offered is None:
                self._offered = plan()[0]
            return self._offered

    def _choose(self, offered: list[HeaderSource], after: str = "") -> HeaderSource:
        """The first of ``offered`` that works, its ``why`` saying why the ones before did not
        (``after``: why the source in use before this choice failed)."""
        problems = [after] if after else []
        host_offered = any(s.kind == "host" for s in offered)
        for source in offered:
            if source.kind == "none":
                break
            if source.kind == "env":
                return source
            if source.kind == "host":
                # bcc finds the host's tree itself, the split build/ and source/ of Debian too
                os.environ.pop("BCC_KERNEL_SOURCE", None)
                problem = _host_problem(Path(source.path))
                if not problem:
                    return source
                problems.append(problem)
                continue
            try:
                tree = self._unpacked(Path(source.path), source.kind)
            except (OSError, ValueError, lzma.LZMAError, tarfile.TarError) as exc:
                problems.append(f"the {source.kind} headers are unusable ({exc})")
                continue
            os.environ["BCC_KERNEL_SOURCE"] = str(tree)
            if not problems and not host_offered:
                problems.append(host_tree()[1])  # why not the host's
            why = "; ".join([f"{source.why} from {source.path}", *problems])
            return HeaderSource(source.kind, str(tree), why)
        reasons = [s.why for s in offered if s.kind == "none"] + problems
        raise GpuguardError(
            f"no kernel headers for bcc to compile the probes ({'; '.join(reasons)})",
            "install the kernel's headers (linux-headers-$(uname -r)), load the kheaders module, "
            "or reinstall gpuguard (its own header set is missing); `gpuguard doctor` lists what is there",
        )

    def _unpacked(self, archive: Path, kind: str) -> Path:
        data = archive.read_bytes()
        if kind == "bundled":
            expected = bundled_archive()[1].get("tarball_sha256")
            if hashlib.sha256(data).hexdigest() != expected:
                raise ValueError(f"{archive} does not match its manifest's sha256")
        tree = self._new_tree()
        lock = os.open(tree / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        self._tree, self._lock_fd = tree, lock
        atexit.register(self.close)
        _unpack(data, tree, _arch_dir(os.uname().machine))
        if not (tree / KCONFIG).is_file():
            raise ValueError(f"{archive} holds no {KCONFIG}")
        return tree

    def _new_tree(self) -> Path:
        """A fresh directory under the runtime dir, or under the temporary dir where the runtime
        dir cannot be written (a read-only root without /run/gpuguard mounted)."""
        problems = []
        for base in (self.runtime_dir, Path(tempfile.gettempdir()) / "gpuguard-headers"):
            try:
                base.mkdir(mode=0o700, parents=True, exist_ok=True)
                _sweep_stale(base)
                return Path(tempfile.mkdtemp(prefix="tree-", dir=base))
            except OSError as exc:
                problems.append(f"{base}: {exc.strerror or exc}")
        raise OSError(f"nowhere to unpack them ({'; '.join(problems)})")

    def fall_back(self, exc: BaseException) -> HeaderSource | None:
        """After a compile failed with the host's headers: the next source, once; else None."""
        with self._mutex:
            source = self.source
            if self._fell_back or source is None or source.kind not in ("env", "host"):
                return None
            if "compile" not in str(exc).lower():
                return None  # a load or attach error: other headers would not help
            self._fell_back = True
            rest = [s for s in plan() if s.kind not in ("env", "host", "none")]
            if not rest:
                return None
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            after = (
                f"the {source.kind} headers at {source.path} did not compile the probes ({first})"
            )
            self.source = self._choose(rest, after)
            return self.source

    def close(self) -> None:
        """Remove the tree we unpacked (nothing is left behind)."""
        with self._mutex:
            tree, self._tree = self._tree, None
            if tree is not None:
                if os.environ.get("BCC_KERNEL_SOURCE") == str(tree):
                    del os.environ["BCC_KERNEL_SOURCE"]
                shutil.rmtree(tree, ignore_errors=True)
                with contextlib.suppress(OSError):  # the folder too, when no other tree is in it
                    tree.parent.rmdir()
                self.source = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


# One per process: bcc reads the environment at every compile, and the tree must outlive them.
HEADERS = Headers()


def compile_with_headers(compile_once: Callable[[], T]) -> T:
    """``compile_once()`` with bcc pointed at the chosen headers; when the host's headers fail
    to compile the probes, once more with the next source (the reason is kept in the source)."""
    HEADERS.use()
    try:
        return compile_once()
    except Exception as exc:  # bcc raises bare Exception for compile errors
        if HEADERS.fall_back(exc) is None:
            raise
    return compile_once()
