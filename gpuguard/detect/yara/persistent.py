"""A YARA scanner whose executable results survive the process, for repeated ``gpuguard scan`` runs.

The results live in :class:`gpuguard.sources.host.yara_verdict_cache.YaraExeCache`
(plain data on disk, keyed by the executable's identity including ctime); this
scanner answers file scans from it and stores new ones.  Memory is never
scanned from :meth:`scan_process` here: a deep scan asks for it explicitly
(one process at a time, with progress shown).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpuguard.detect.yara.scan import YaraResult, YaraScanner, compile_files
from gpuguard.sources.host.yara_verdict_cache import (
    DEFAULT_CACHE_DIR,
    YaraExeCache,
    rules_digest,
    yara_cache_dir,
)


class PersistentYaraScanner(YaraScanner):
    """A :class:`YaraScanner` backed by the on-disk executable cache (see module docstring)."""

    def __init__(
        self, rules, digest: str, cache_dir: Path | None = DEFAULT_CACHE_DIR, **options
    ) -> None:
        super().__init__(rules, **options)
        self.memory_capable = self.wants_memory
        self.wants_memory = False
        self.cache = YaraExeCache(digest, cache_dir)
        self.stats["disk_cache_hits"] = 0

    @classmethod
    def for_files(
        cls, paths: list[Path], cache_dir: Path | None | Literal["env"] = "env"
    ) -> PersistentYaraScanner:
        """The scanner of ``paths`` with its cache loaded from ``cache_dir`` (by default
        where ``GPUGUARD_YARA_CACHE`` says, else /var/cache/gpuguard; None: no cache)."""
        paths = [Path(p) for p in paths]
        where = yara_cache_dir() if cache_dir == "env" else cache_dir
        scanner = cls(compile_files(paths), rules_digest(paths), where)
        scanner.cache.load()
        return scanner

    @property
    def note(self) -> str | None:
        return self.cache.note

    @property
    def cache_dir(self) -> Path | None:
        return self.cache.cache_dir

    def save(self) -> None:
        """Write the cache back (atomically) when this run added results."""
        self.cache.save()

    def scan_file(self, path: str, identity: tuple | None = None) -> YaraResult:
        if identity is not None and identity in self._file_cache:
            return super().scan_file(path, identity)  # seen in this run: no stat, no disk look-up
        key = YaraExeCache.identity_key(path) if identity is not None else None
        if key is not None:
            cached = self.cache.lookup(key)
            if cached is not None:
                self.stats["disk_cache_hits"] += 1
                result = YaraResult(*cached)
                self._file_cache[identity] = result  # the in-run cache, as a scan would fill it
                if len(self._file_cache) > self.cache_size:
                    self._file_cache.popitem(last=False)
                return result
        result = super().scan_file(path, identity)
        if key is not None:
            self.cache.store(key, result.rules, result.tags)
        return result
