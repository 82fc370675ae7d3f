"""Files that start programs at boot, on a schedule or at login: the places miners persist.

Data flow: a filesystem root (``--root``, default ``/``) -> the bounded list of
autostart files below -> :class:`AutostartFile` (path, kind, owner, text).
``gpuguard.detect.host.checks`` decides which lines launch a miner; this
module only reads.

Details: docs/internals.md, "persistence".
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

MAX_FILE_BYTES = 64 << 20  # read per file; a larger autostart file is itself a red flag
MAX_KEPT_BYTES = 4 << 20  # meaningful (non-comment) lines kept per file
MAX_LINE_CHARS = 64 << 10  # of one line
MAX_FILES_PER_DIR = 2000
MAX_HOMES = 1000

SYSTEMD_DIRS = (
    "etc/systemd/system",
    "lib/systemd/system",
    "usr/lib/systemd/system",
    "run/systemd/system",
    "etc/systemd/user",
    "usr/lib/systemd/user",
)
SYSTEMD_SUFFIXES = (".service", ".timer", ".socket", ".path")
# Subdirectories of a unit directory that also start things: enablement links
# and drop-ins (an override.conf can replace a unit's ExecStart=).
SYSTEMD_SUBDIR_SUFFIXES = (".wants", ".requires", ".d")
SYSTEMD_DROPIN_SUFFIXES = SYSTEMD_SUFFIXES + (".conf",)
CRON_FILES = ("etc/crontab", "etc/anacrontab")
CRON_DIRS = (
    "etc/cron.d",
    "etc/cron.hourly",
    "etc/cron.daily",
    "etc/cron.weekly",
    "etc/cron.monthly",
    "var/spool/cron/crontabs",
    "var/spool/cron",
)
PROFILE_FILES = ("etc/profile", "etc/bash.bashrc", "etc/bashrc", "etc/environment")
PROFILE_DIRS = ("etc/profile.d",)
RC_FILES = ("etc/rc.local", "etc/rc.d/rc.local")
HOME_PROFILE_FILES = (".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc")
HOME_SYSTEMD_DIR = ".config/systemd/user"


def is_comment(line: str, kind: str) -> bool:
    """A blank line or a comment in an autostart file of ``kind`` (starts nothing)."""
    stripped = line.lstrip()
    return (
        not stripped
        or stripped.startswith("#")
        or (kind == "systemd-unit" and stripped.startswith(";"))
    )


@dataclass(slots=True)
class AutostartFile:
    path: str  # as the host sees it (``root`` removed), e.g. "/etc/cron.d/job"
    kind: str  # "systemd-unit" | "cron" | "shell-profile" | "rc-local"
    lines: list[tuple[int, str]]  # (line number, line) of every line that is not a comment
    owner_uid: int
    mode: int
    truncated: bool = False  # a bound stopped the reading; the path is in AutostartScan.partly_read


@dataclass(slots=True)
class AutostartScan:
    files: list[AutostartFile] = field(default_factory=list)
    unreadable: list[str] = field(
        default_factory=list
    )  # host paths that exist but could not be read
    partly_read: list[str] = field(default_factory=list)  # "path (why)" of files a bound stopped


class _Reader:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.scan = AutostartScan()
        self._seen: set[tuple[int, int, str]] = set()

    def host_path(self, real: str) -> str:
        rel = os.path.relpath(real, self.root)
        return "/" if rel == "." else "/" + rel

    def read(self, real: str, kind: str) -> None:
        try:
            st = os.lstat(real)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            # Every target is inside "/": the kernel follows the link (Python's realpath walks
            # it one component at a time, ~10 us a link).
            target = real if self.root == "/" else os.path.realpath(real)
            if os.path.commonpath([target, self.root]) != self.root:
                return
            try:
                st = os.stat(target)
            except OSError:
                return
        if not stat.S_ISREG(st.st_mode):
            return
        key = (st.st_dev, st.st_ino, kind)
        if key in self._seen:
            return
        self._seen.add(key)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            self.scan.unreadable.append(self.host_path(real))
            return
        try:
            with os.fdopen(fd, "rb") as f:
                lines, stopped = _meaningful_lines(f, kind)
        except OSError:
            self.scan.unreadable.append(self.host_path(real))
            return
        path = self.host_path(real)
        if stopped:
            self.scan.partly_read.append(f"{path} ({stopped})")
        self.scan.files.append(
            AutostartFile(
                path=path,
                kind=kind,
                lines=lines,
                owner_uid=st.st_uid,
                mode=stat.S_IMODE(st.st_mode),
                truncated=bool(stopped),
            )
        )

    def read_dir(self, real_dir: str, kind: str, suffixes: tuple[str, ...] = ()) -> None:
        try:
            with os.scandir(real_dir) as entries:
                names = []
                for i, entry in enumerate(entries):
                    if i >= MAX_FILES_PER_DIR:
                        break
                    names.append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError:
            self.scan.unreadable.append(self.host_path(real_dir))
            return
        for name in sorted(names):
            if suffixes and not name.endswith(suffixes):
                continue
            self.read(os.path.join(real_dir, name), kind)

    def read_unit_dir(self, real_dir: str) -> None:
        """A systemd unit directory, its enablement links and its drop-in directories."""
        self.read_dir(real_dir, "systemd-unit", SYSTEMD_SUFFIXES)
        try:
            with os.scandir(real_dir) as entries:
                subdirs = [
                    e.path
                    for i, e in enumerate(entries)
                    if i < MAX_FILES_PER_DIR
                    and e.name.endswith(SYSTEMD_SUBDIR_SUFFIXES)
                    and e.is_dir(follow_symlinks=False)
                ]
        except OSError:
            return
        for subdir in sorted(subdirs):
            self.read_dir(subdir, "systemd-unit", SYSTEMD_DROPIN_SUFFIXES)


def _meaningful_lines(f, kind: str) -> tuple[list[tuple[int, str]], str]:
    """(number, line) of the non-comment lines of ``f``, and why reading stopped early ("" if it did not)."""
    lines: list[tuple[int, str]] = []
    read = kept = 0
    number = 0
    while True:
        raw = f.readline(MAX_LINE_CHARS + 1)
        if not raw:
            return lines, ""
        number += 1
        read += len(raw)
        if len(raw) > MAX_LINE_CHARS and not raw.endswith(b"\n"):
            # An overlong line: keep its start, skip the rest of it (still counted, still bounded).
            while read <= MAX_FILE_BYTES:
                rest = f.readline(1 << 20)
                read += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
        line = raw[:MAX_LINE_CHARS].decode("utf-8", "surrogateescape").rstrip("\r\n")
        if not is_comment(line, kind):
            kept += len(line)
            if kept > MAX_KEPT_BYTES:
                return (
                    lines,
                    f"more than {MAX_KEPT_BYTES} bytes of non-comment lines; read to line {number - 1}",
                )
            lines.append((number, line))
        if read > MAX_FILE_BYTES:
            return lines, f"larger than {MAX_FILE_BYTES} bytes; read to line {number}"


def home_dirs(root: str) -> list[str]:
    """/root and every directory under /home, inside ``root`` (bounded)."""
    homes = [os.path.join(root, "root")]
    try:
        with os.scandir(os.path.join(root, "home")) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_HOMES:
                    break
                if entry.is_dir(follow_symlinks=False):
                    homes.append(entry.path)
    except OSError:
        pass
    return homes


def collect_autostart_files(root: str = "/") -> AutostartScan:
    """Read every systemd unit, cron table, shell profile and rc.local under ``root``."""
    reader = _Reader(root)
    join = lambda rel: os.path.join(reader.root, rel)  # noqa: E731
    for rel in SYSTEMD_DIRS:
        reader.read_unit_dir(join(rel))
    for rel in CRON_FILES:
        reader.read(join(rel), "cron")
    for rel in CRON_DIRS:
        reader.read_dir(join(rel), "cron")
    for rel in PROFILE_FILES:
        reader.read(join(rel), "shell-profile")
    for rel in PROFILE_DIRS:
        reader.read_dir(join(rel), "shell-profile")
    for rel in RC_FILES:
        reader.read(join(rel), "rc-local")
    for home in home_dirs(reader.root):
        for name in HOME_PROFILE_FILES:
            reader.read(os.path.join(home, name), "shell-profile")
        reader.read_unit_dir(os.path.join(home, HOME_SYSTEMD_DIR))
    return reader.scan
