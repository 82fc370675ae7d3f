"""YARA results of executables from earlier runs, kept on disk so a repeated scan skips them.

The file (``/var/cache/gpuguard/yara-exe-cache.json``) holds plain ``(rules, tags)`` per
executable identity under one rule-set digest; the detect layer's ``PersistentYaraScanner``
answers file scans from it.  This module reads and writes the file only, and uses it only
when it is root's alone (otherwise "no cache", with a note).  ``GPUGUARD_YARA_CACHE`` names
another directory, or ``off``.  Key, digest and safety rules: docs/scan.md, "The YARA cache".
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from gpuguard.config.cache_file import read_cache_file, write_cache_file

DEFAULT_CACHE_DIR = Path("/var/cache/gpuguard")
ENV = "GPUGUARD_YARA_CACHE"  # a directory, or "off"
CACHE_NAME = "yara-exe-cache.json"
CACHE_FORMAT = 1
MAX_ENTRIES = 65536
MAX_CACHE_BYTES = 32 << 20


def yara_cache_dir() -> Path | None:
    """Where the file is kept: ``GPUGUARD_YARA_CACHE`` (None for ``off``), else the default."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() == "off":
        return None
    return Path(chosen) if chosen else DEFAULT_CACHE_DIR


def rules_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(Path(path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


class YaraExeCache:
    """The on-disk results of one rule set's executable scans (see module docstring)."""

    def __init__(self, digest: str, cache_dir: Path | None = DEFAULT_CACHE_DIR) -> None:
        self.digest = digest
        self.cache_dir = cache_dir
        self.note: str | None = None
        self._disk: dict[str, list[list[str]]] = {}
        self._dirty = False

    @staticmethod
    def identity_key(path: str) -> str | None:
        """The cache key of the file behind ``path`` (None when it cannot be stat'ed)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def lookup(self, key: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """``(rules, tags)`` stored for ``key``, or None."""
        cached = self._disk.get(key)
        return (tuple(cached[0]), tuple(cached[1])) if cached is not None else None

    def store(self, key: str, rules: tuple[str, ...], tags: tuple[str, ...]) -> None:
        self._disk[key] = [list(rules), list(tags)]
        self._dirty = True

    # -- disk -------------------------------------------------------------

    @property
    def cache_path(self) -> Path | None:
        return self.cache_dir / CACHE_NAME if self.cache_dir is not None else None

    def load(self) -> None:
        path = self.cache_path
        if path is None:
            return
        if os.geteuid() != 0:
            self.note = "YARA results are not cached across runs when not running as root"
            self.cache_dir = None
            return
        found = read_cache_file(self.cache_dir, CACHE_NAME, MAX_CACHE_BYTES, "YARA cache")
        self.note = found.note
        if not found.folder_usable:
            self.cache_dir = None
        if found.content is None:
            return
        try:
            data = json.loads(found.content)
        except ValueError:
            data = None
        if (
            not isinstance(data, dict)
            or data.get("format") != CACHE_FORMAT
            or not isinstance(data.get("entries"), dict)
        ):
            self.note = (
                f"YARA cache {path} is damaged or from another version; it will be rewritten"
            )
            return
        if data.get("rules") != self.digest:
            return  # other rules: every result must be recomputed
        self._disk = {
            k: v
            for k, v in data["entries"].items()
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) for x in v)
        }

    def save(self) -> None:
        """Write the cache back (atomically) when this run added results."""
        if self.cache_dir is None or not self._dirty or os.geteuid() != 0:
            return
        entries = dict(list(self._disk.items())[-MAX_ENTRIES:])
        data = {"format": CACHE_FORMAT, "rules": self.digest, "entries": entries}
        note = write_cache_file(self.cache_dir, CACHE_NAME, json.dumps(data).encode(), "YARA cache")
        if note:
            self.note = note
