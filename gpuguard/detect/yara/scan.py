"""YARA: compile the rule files once, scan executables, command lines, environments and memory.

Each YARA rule says where it applies with a meta ``scope`` (comma-separated:
``file`` — the default —, ``cmdline``, ``environ``, ``memory``); matches outside
a rule's scope are dropped.  Memory rules must not demand an ELF header
(``uint32(0) == 0x464c457f``): memory regions start anywhere.

Details: docs/internals.md, "yara_scan".
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yara

from gpuguard.sources.proc.process import ENVIRON_HEAD

SCOPES = ("file", "cmdline", "environ", "memory")
ENVIRON_BYTES = ENVIRON_HEAD  # the environ bytes matched (its head: where LD_* and pools sit)
CHUNK = 4 << 20
OVERLAP = 4096
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)$")
_SKIP_REGIONS = ("[vvar]", "[vsyscall]", "[vdso]", "[vvar_vclock]")
_COMPILED: dict[tuple, yara.Rules] = {}


@dataclass(frozen=True, slots=True)
class YaraResult:
    rules: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rules)


def _file_key(paths: Iterable[Path]) -> tuple:
    key = []
    for path in paths:
        st = os.stat(path)
        key.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(key)


def compile_files(paths: list[Path]) -> yara.Rules:
    """Compile the YARA files (one namespace each); cached while the files are unchanged."""
    key = _file_key(paths)
    rules = _COMPILED.get(key)
    if rules is None:
        rules = _COMPILED[key] = yara.compile(
            filepaths={f"ns{i}": str(p) for i, p in enumerate(paths)}
        )
    return rules


_ERROR = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<message>.*)$")


def yara_problems(paths: list[Path]) -> list[tuple[str, int, str]]:
    """``(file, line, message)`` for each file that does not compile, or has a bad ``scope``.

    One file without problems is kept compiled as :func:`compile_files` would compile it (its
    one namespace), so a scan loading the rules does not compile it a second time."""
    problems = []
    for path in paths:
        try:
            key = _file_key([path]) if len(paths) == 1 else None  # taken first, as compile_files
        except OSError:
            key = None
        try:
            rules = yara.compile(filepaths={"ns0": str(path)})
        except yara.SyntaxError as exc:
            match = _ERROR.match(str(exc))
            if match:
                problems.append((match["file"], int(match["line"]), f"YARA: {match['message']}"))
            else:
                problems.append((str(path), 1, f"YARA: {exc}"))
            continue
        except yara.Error as exc:
            problems.append((str(path), 1, f"YARA: {exc}"))
            continue
        for rule in rules:
            scopes = _scopes(rule.meta)
            if scopes is None:
                problems.append(
                    (
                        str(path),
                        1,
                        f"YARA rule {rule.identifier}: meta scope {rule.meta.get('scope')!r} "
                        f"must list some of {', '.join(SCOPES)}",
                    )
                )
        if key is not None and not problems:
            _COMPILED[key] = rules
    return problems


def _scopes(meta: dict) -> frozenset[str] | None:
    raw = meta.get("scope", "file")
    if not isinstance(raw, str):
        return None
    scopes = frozenset(s.strip() for s in raw.split(",") if s.strip())
    return scopes if scopes and scopes <= set(SCOPES) else None


class YaraScanner:
    """Scans processes with one compiled rule set; see the module docstring."""

    def __init__(
        self,
        rules: yara.Rules,
        *,
        memory_bytes: int = 64 << 20,
        region_bytes: int = 16 << 20,
        time_budget_s: float = 2.0,
        cache_size: int = 1024,
    ) -> None:
        self.rules = rules
        self.memory_bytes = memory_bytes
        self.region_bytes = region_bytes
        self.time_budget_s = time_budget_s
        self.cache_size = cache_size
        self._scopes = {r.identifier: _scopes(r.meta) or frozenset({"file"}) for r in rules}
        self.wants_memory = any("memory" in s for s in self._scopes.values())
        self._file_cache: OrderedDict[tuple, YaraResult] = OrderedDict()
        self._data_cache: OrderedDict[tuple[str, bytes], YaraResult] = OrderedDict()
        # {(pid, start time): the first ENVIRON_BYTES of its environ} read with its facts just
        # before (scan: gpuguard.sources.host.observation), so it is not read a second time
        self.environ_read: dict[tuple[int, float], bytes] = {}
        self.stats = {
            "file_scans": 0,
            "file_cache_hits": 0,
            "data_cache_hits": 0,
            "memory_scans": 0,
            "memory_bytes": 0,
            "errors": 0,
        }

    @classmethod
    def from_files(cls, paths: list[Path], **options) -> YaraScanner:
        return cls(compile_files(list(paths)), **options)

    # -- targets --------------------------------------------------------------

    def _keep(self, matches, scope: str, into: dict[str, tuple[str, ...]]) -> None:
        for match in matches:
            if scope in self._scopes.get(match.rule, ()):
                into[match.rule] = tuple(match.tags)

    def _match(self, timeout: float, **target) -> list:
        try:
            return self.rules.match(timeout=max(1, int(timeout + 0.999)), **target)
        except yara.TimeoutError:
            self.stats["errors"] += 1
            return []
        except yara.Error:
            self.stats["errors"] += 1
            return []

    def scan_file(self, path: str, identity: tuple | None = None) -> YaraResult:
        """File-scope matches for one file, cached by ``identity`` when given."""
        if identity is not None:
            cached = self._file_cache.get(identity)
            if cached is not None:
                self._file_cache.move_to_end(identity)
                self.stats["file_cache_hits"] += 1
                return cached
        self.stats["file_scans"] += 1
        found: dict[str, tuple[str, ...]] = {}
        self._keep(self._match(self.time_budget_s, filepath=path), "file", found)
        result = _result(found)
        if identity is not None:
            self._file_cache[identity] = result
            if len(self._file_cache) > self.cache_size:
                self._file_cache.popitem(last=False)
        return result

    def scan_data(self, data: bytes, scope: str) -> YaraResult:
        """``scope`` matches in ``data``, once per distinct content (see the module docstring)."""
        key = (scope, hashlib.blake2b(data, digest_size=16).digest())
        cached = self._data_cache.get(key)
        if cached is not None:
            self._data_cache.move_to_end(key)
            self.stats["data_cache_hits"] += 1
            return cached
        errors = self.stats["errors"]
        found: dict[str, tuple[str, ...]] = {}
        self._keep(self._match(self.time_budget_s, data=data), scope, found)
        result = _result(found)
        if self.stats["errors"] == errors:  # a timed-out or failed match is tried again
            self._data_cache[key] = result
            if len(self._data_cache) > self.cache_size:
                self._data_cache.popitem(last=False)
        return result

    def scan_memory(self, pid: int, proc_root: str = "/proc") -> YaraResult:
        """Memory-scope matches in the anonymous and executable mappings (capped; see module docstring)."""
        found: dict[str, tuple[str, ...]] = {}
        deadline = time.monotonic() + self.time_budget_s
        budget = self.memory_bytes
        try:
            with open(f"{proc_root}/{pid}/maps") as maps:
                regions = [m for m in (_MAPS_LINE.match(line) for line in maps) if m]
            fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.stats["errors"] += 1
            return YaraResult()
        self.stats["memory_scans"] += 1
        try:
            for region in regions:
                start, end, perms, name = (
                    int(region[1], 16),
                    int(region[2], 16),
                    region[3],
                    region[4].strip(),
                )
                anonymous = (
                    not name
                    or name.startswith(("[heap]", "[stack]", "[anon"))
                    or name.startswith("/memfd:")
                )
                if perms[0] != "r" or name in _SKIP_REGIONS or not (anonymous or "x" in perms):
                    continue
                offset, region_end = start, min(end, start + self.region_bytes)
                while offset < region_end and budget > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return _result(found)
                    size = min(CHUNK, region_end - offset, budget)
                    try:
                        chunk = os.pread(fd, size, offset)
                    except OSError:
                        break
                    if not chunk:
                        break
                    budget -= len(chunk)
                    self.stats["memory_bytes"] += len(chunk)
                    self._keep(self._match(remaining, data=chunk), "memory", found)
                    if offset + len(chunk) >= region_end:
                        break
                    offset += len(chunk) - OVERLAP  # strings across chunk borders still match
                if budget <= 0:
                    break
        finally:
            os.close(fd)
        return _result(found)

    def scan_process(self, facts, proc_root: str = "/proc") -> YaraResult:
        """Executable (cached), command line, environment and — if any rule asks — memory."""
        found: dict[str, tuple[str, ...]] = {}
        pid = facts.pid
        if facts.exe:
            identity = tuple(facts.exe_identity) if facts.exe_identity else None
            result = self.scan_file(f"{proc_root}/{pid}/exe", identity)
            found.update(zip(result.rules, [()] * len(result.rules), strict=False))
            tags = set(result.tags)
        else:
            tags = set()
        if facts.cmdline:
            cmd = self.scan_data(
                "\0".join(facts.cmdline).encode("utf-8", "surrogateescape")[:65536], "cmdline"
            )
            found.update(dict.fromkeys(cmd.rules, ()))
            tags |= set(cmd.tags)
        env = self.environ_read.pop((pid, facts.start_time), None)
        if env is None:
            try:
                with open(f"{proc_root}/{pid}/environ", "rb") as handle:
                    env = handle.read(ENVIRON_BYTES)
            except OSError:
                env = b""
        if env:
            result = self.scan_data(env, "environ")
            found.update(dict.fromkeys(result.rules, ()))
            tags |= set(result.tags)
        if self.wants_memory:
            result = self.scan_memory(pid, proc_root)
            found.update(dict.fromkeys(result.rules, ()))
            tags |= set(result.tags)
        return YaraResult(tuple(sorted(found)), tuple(sorted(tags)))


def _result(found: dict[str, tuple[str, ...]]) -> YaraResult:
    tags = sorted({t for ts in found.values() for t in ts})
    return YaraResult(tuple(sorted(found)), tuple(tags))
