"""What a kill-on-touch block keys on: the offender's own program, never an interpreter or shared file.

:func:`block_target` decides, for a verified offender, what its block may name: the script
an interpreter or shell runs (never the interpreter, known from the ELF, not its name),
the offender's tree only (a shared executable), or the executable (path, device+inode,
size+sha256).  :mod:`gpuguard.respond.touch.match` matches exec reports against them.
The table of cases: docs/respond.md, "What a block names".
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from dataclasses import dataclass, field

from gpuguard.detect.ruleset.allowlist import sha256_of_file

MAX_ELF_READ = 256 * 1024 * 1024  # an executable larger than this is never read whole
# Entry points an interpreter's executable defines or imports (ELF dynamic symbols).
INTERPRETER_SYMBOLS = {
    b"Py_BytesMain": "python",
    b"Py_Main": "python",
    b"perl_run": "perl",
    b"perl_parse": "perl",
    b"ruby_run_node": "ruby",
    b"ruby_options": "ruby",
    b"_ZN4node5StartEiPPc": "node",
    b"JLI_Launch": "java",
    b"JNI_CreateJavaVM": "java",
    b"php_execute_script": "php",
    b"lua_pcall": "lua",
    b"luaL_loadfilex": "lua",
    b"Tcl_Main": "tcl",
    b"parse_and_execute": "shell",
    b"evalstring": "shell",
}
# A shell without exported symbols (dash, busybox, mksh): its grammar's keywords as strings.
SHELL_WORDS = (b"\0esac\0", b"\0elif\0")
BUSYBOX_MARK = b"BusyBox v"
# Options that take the next argument, per family (the script is the first other operand).
_OPTION_ARGS = {
    "python": {"-W", "-X", "-Q"},
    "perl": {"-I", "-M", "-m", "-x"},
    "ruby": {"-I", "-r", "-C", "-E"},
    "node": {"-r", "--require", "--import", "--loader"},
    "java": {"-cp", "-classpath", "--class-path", "-p", "--module-path"},
    "php": {"-d", "-c", "-z"},
    "shell": {"-o", "+o", "-O", "+O"},
    "lua": {"-l"},
    "tcl": set(),
    "busybox": set(),
}
_INLINE = {
    "python": "-c",
    "perl": "-e",
    "ruby": "-e",
    "node": "-e",
    "php": "-r",
    "shell": "-c",
    "lua": "-e",
    "busybox": "-c",
}


@dataclass(frozen=True, slots=True)
class Script:
    """What an interpreter runs: a file (path as the process named it, resolved path, sha256) or inline code."""

    kind: str  # "file" | "inline" | "unknown"
    path: str = ""
    sha256: str | None = None


@dataclass(slots=True)
class BlockTarget:
    """What one block names (see the module docstring)."""

    kind: str  # "script" | "executable" | "tree-only"
    exe: str
    identity: tuple[int, int, int, int] | None = None  # (dev, ino, size, mtime_ns) of the exe
    sha256: str | None = None  # of the exe
    interpreter: str | None = None  # family, when the exe is an interpreter
    script: Script | None = None
    why: str = ""
    users_outside: list[int] = field(default_factory=list)


# -- the ELF ----------------------------------------------------------------------------------------

_CACHE: dict[tuple[int, int, int, int], str | None] = {}
_CACHE_LOCK = threading.Lock()


def interpreter_family(path: str) -> str | None:
    """The interpreter family of the ELF at ``path`` (python, perl, shell, ...), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    family = _family_of(path, st.st_size)
    with _CACHE_LOCK:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = family
    return family


def _family_of(path: str, size: int) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only (the hosts we run on)
                return None
            sections = _sections(f, head)
            for name, offset, length, _ in sections:
                if name == b".dynstr" and length < MAX_ELF_READ:
                    f.seek(offset)
                    strings = set(f.read(length).split(b"\0"))
                    for symbol, family in INTERPRETER_SYMBOLS.items():
                        if symbol in strings:
                            return family
            for name, offset, length, _ in sections:
                if name == b".rodata" and length < MAX_ELF_READ:
                    f.seek(offset)
                    data = f.read(length)
                    if BUSYBOX_MARK in data:
                        return "busybox"
                    if all(word in data for word in SHELL_WORDS):
                        return "shell"
    except (OSError, struct.error, ValueError):
        return None
    return None


def _sections(f, head: bytes) -> list[tuple[bytes, int, int, int]]:
    """(name, offset, size, type) of every section of a 64-bit little-endian ELF."""
    if head[5] != 1:
        return []
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if not shoff or shentsize < 64 or shnum == 0 or shnum > 4096 or shstrndx >= shnum:
        return []
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    entries = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", table, i * shentsize
        )
        entries.append((name, offset, size, kind))
    names_offset, names_size = entries[shstrndx][1], entries[shstrndx][2]
    f.seek(names_offset)
    names = f.read(min(names_size, 1 << 20))
    out = []
    for name, offset, size, kind in entries:
        end = names.find(b"\0", name)
        out.append((names[name:end] if end >= 0 else b"", offset, size, kind))
    return out


# -- the script an interpreter runs -----------------------------------------------------------------


def script_of(family: str, argv: list[str], root: str) -> Script:
    """The script in an interpreter's argv; ``root`` is /proc/PID so paths resolve as the process sees them."""
    inline = _INLINE.get(family)
    takes_arg = _OPTION_ARGS.get(family, set())
    args = argv[1:]
    if family == "busybox" and args and os.path.basename(argv[0]) == "busybox":
        args = args[1:]  # busybox sh script.sh
    i = 0
    while i < len(args):
        arg = args[i]
        if inline and (arg == inline or (arg.startswith(inline) and len(arg) > len(inline))):
            # The code and the arguments after it: a generic launcher (sh -c 'exec "$@"' ...)
            # with other arguments is another program, not the offender.
            rest = args[i + 2 :] if arg == inline else args[i + 1 :]
            code = args[i + 1] if arg == inline and i + 1 < len(args) else arg[len(inline) :]
            invocation = "\0".join([code, *rest])
            return Script("inline", "", hashlib.sha256(os.fsencode(invocation)).hexdigest())
        if family == "java" and arg == "-jar" and i + 1 < len(args):
            return _script_file(args[i + 1], root)
        if family == "python" and arg == "-m":
            return Script("unknown", args[i + 1] if i + 1 < len(args) else "")
        if arg == "--" and i + 1 < len(args):
            return _script_file(args[i + 1], root)
        if arg.startswith("-") or arg.startswith("+"):
            i += 2 if arg in takes_arg else 1
            continue
        if family == "java":
            return Script("unknown", arg)  # a class name: nothing on disk to key on
        return _script_file(arg, root)
    return Script("unknown")


def _script_file(path: str, root: str) -> Script:
    """A script file named in argv, read through the process's cwd and root."""
    inside = os.path.join(f"{root}/cwd", path) if not path.startswith("/") else f"{root}/root{path}"
    digest = sha256_of_file(inside)
    if digest is None:
        return Script("unknown", path)
    try:
        resolved = os.path.realpath(inside)
    except OSError:
        resolved = path
    return Script("file", _outside_view(resolved, root) or path, digest)


def _outside_view(resolved: str, root: str) -> str:
    """A path resolved through /proc/PID/cwd or root: what it is named as on the host."""
    return resolved if not resolved.startswith("/proc/") else ""


# -- who else runs a file ---------------------------------------------------------------------------


def users_of(dev_ino: tuple[int, int], exclude: set[int], proc_root: str = "/proc") -> list[int]:
    """Live processes (not in ``exclude``) whose executable is the file ``dev_ino``."""
    users = []
    for entry in os.listdir(proc_root):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            st = os.stat(f"{proc_root}/{entry}/exe")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == dev_ino:
            users.append(int(entry))
    return users


def descendants(pid: int, proc_root: str = "/proc") -> set[int]:
    """``pid`` and every live process below it (from each process's parent in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def read_process(pid: int) -> tuple[str, os.stat_result, list[str]]:
    """(exe path, exe stat, argv) of a live process, from /proc (the caller verifies its identity)."""
    exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    st = os.stat(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read(1 << 20)
    argv = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]]
    return exe, st, argv


def block_target(pid: int, shared_prefixes: tuple[str, ...]) -> BlockTarget:
    """What a block of the (already verified) process ``pid`` may name; raises OSError if it is gone."""
    exe, st, argv = read_process(pid)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    family = interpreter_family(f"/proc/{pid}/exe")
    if family is not None:
        script = script_of(family, argv, f"/proc/{pid}")
        target = BlockTarget("script", exe, identity, interpreter=family, script=script)
        if script.kind == "unknown":
            target.kind = "tree-only"
            target.why = (
                f"{exe} is an interpreter ({family}) and its argv names no script file or inline "
                "code to key on: only this process and its children are blocked"
            )
        else:
            target.why = (
                f"{exe} is an interpreter ({family}): the block keys on the "
                + (f"script {script.path}" if script.kind == "file" else "inline code")
                + " (path and sha256), never on the interpreter"
            )
        return target
    if exe.startswith(shared_prefixes):
        return BlockTarget(
            "tree-only",
            exe,
            identity,
            why=f"{exe} is a shared executable (response.kill_on_touch.shared_exe_prefixes): "
            "only this process and its children are blocked",
        )
    others = users_of((st.st_dev, st.st_ino), descendants(pid))
    if others:
        return BlockTarget(
            "tree-only",
            exe,
            identity,
            users_outside=others[:16],
            why=f"{exe} is also run by {len(others)} process(es) outside the offender's tree "
            f"(e.g. pid {others[0]}): only this process and its children are blocked",
        )
    return BlockTarget(
        "executable",
        exe,
        identity,
        sha256_of_file(f"/proc/{pid}/exe"),
        why="any process of this executable (same path, inode or bytes) dies at its first GPU "
        "open or connect",
    )
