"""Files that start programs at boot, on a schedule or at login: the places miners persist.

Data flow: a filesystem root (``--root``, default ``/``) -> the bounded list of
autostart files below -> :class:`AutostartFile` (path, kind, owner, text).
``gpuguard.detect.host_checks`` decides which lines launch a miner; this
module only reads.

Bounds, because the tree may be hostile: at most ``MAX_FILE_BYTES`` of each
file, ``MAX_FILES_PER_DIR`` entries per directory, regular files only (a
symlink is read only when it resolves inside ``root``: a unit linked to
/dev/zero or a FIFO must not hang the scan).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

MAX_FILE_BYTES = 256 * 1024
MAX_FILES_PER_DIR = 2000
MAX_HOMES = 1000

SYSTEMD_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system",
                "run/systemd/system", "etc/systemd/user", "usr/lib/systemd/user")
SYSTEMD_SUFFIXES = (".service", ".timer", ".socket", ".path")
# Subdirectories of a unit directory that also start things: enablement links
# and drop-ins (an override.conf can replace a unit's ExecStart=).
SYSTEMD_SUBDIR_SUFFIXES = (".wants", ".requires", ".d")
SYSTEMD_DROPIN_SUFFIXES = SYSTEMD_SUFFIXES + (".conf",)
CRON_FILES = ("etc/crontab", "etc/anacrontab")
CRON_DIRS = ("etc/cron.d", "etc/cron.hourly", "etc/cron.daily", "etc/cron.weekly",
             "etc/cron.monthly", "var/spool/cron/crontabs", "var/spool/cron")
PROFILE_FILES = ("etc/profile", "etc/bash.bashrc", "etc/bashrc", "etc/environment")
PROFILE_DIRS = ("etc/profile.d",)
RC_FILES = ("etc/rc.local", "etc/rc.d/rc.local")
HOME_PROFILE_FILES = (".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc")
HOME_SYSTEMD_DIR = ".config/systemd/user"


@dataclass(slots=True)
class AutostartFile:
    path: str          # as the host sees it (``root`` removed), e.g. "/etc/cron.d/job"
    kind: str          # "systemd-unit" | "cron" | "shell-profile" | "rc-local"
    text: str
    owner_uid: int
    mode: int
    truncated: bool = False


@dataclass(slots=True)
class AutostartScan:
    files: list[AutostartFile] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)   # host paths that exist but could not be read


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
            target = os.path.realpath(real)
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
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError:
            self.scan.unreadable.append(self.host_path(real))
            return
        self.scan.files.append(AutostartFile(
            path=self.host_path(real), kind=kind,
            text=raw[:MAX_FILE_BYTES].decode("utf-8", "surrogateescape"),
            owner_uid=st.st_uid, mode=stat.S_IMODE(st.st_mode),
            truncated=len(raw) > MAX_FILE_BYTES))

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
                subdirs = [e.path for i, e in enumerate(entries)
                           if i < MAX_FILES_PER_DIR and e.name.endswith(SYSTEMD_SUBDIR_SUFFIXES)
                           and e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for subdir in sorted(subdirs):
            self.read_dir(subdir, "systemd-unit", SYSTEMD_DROPIN_SUFFIXES)


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
