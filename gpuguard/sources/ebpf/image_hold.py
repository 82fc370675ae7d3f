"""Execs of an image already judged clean, held in user space as the kernel holds plain execs.

The exec filter sends up in full every exec from a directory the rules list (``/tmp``,
``/dev/shm``...), and each costs the agent its whole path (facts, YARA, exe hash, scoring:
milliseconds), even the 400th start of the same unchanged file.  Once a process of an image
was judged clean, a later exec of the same image is held here the way the kernel holds any
plain exec (docs/agent.md, "The exec filter"): dropped with its exit when the process ends
first, sent up before any other event of the process (a connect, a GPU open, huge pages...)
and when it is still alive after the filter's age.  The image is /proc/PID/exe's
(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a replaced, rewritten or touched file
is a new image (ctime cannot be set back), and gets the whole path again.  A process already
gone when its exec is read (a few-ms run on a loaded host) has nothing left to evaluate; the
file its absolute path names now stands for its image.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

from gpuguard.events.model import Exec
from gpuguard.sources.ebpf.exec_filter import PROMOTE_AGE_S

ImageId = tuple[int, int, int, int, int]
JUDGED_MAX = 4096  # images judged clean, least recently started dropped first
SEEN_MAX = 8192  # execs sent up whose verdict is awaited


def image_of(pid: int, proc_root: str = "/proc") -> ImageId | None:
    """The identity of the process's executable (None once it is gone)."""
    try:
        st = os.stat(f"{proc_root}/{pid}/exe")  # follows the link: deleted files and memfds too
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _path_image(path: str) -> ImageId | None:
    if not path.startswith("/"):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ImageHold:
    """Judged images, and the execs of them held (see the module docstring)."""

    def __init__(self, age_s: float = PROMOTE_AGE_S) -> None:
        self.age_s = age_s
        self.judged: OrderedDict[ImageId, None] = OrderedDict()
        self._seen: dict[int, ImageId] = {}  # pid -> the image of its exec sent up
        self.held: dict[int, tuple[float, Exec]] = {}  # pid -> (monotonic time held, exec)
        self.counts = {"held": 0, "dropped": 0, "released": 0, "judged": 0}

    def hold(self, event: Exec) -> bool:
        """True when ``event`` is of a judged image and is now held; else it goes up (and its
        image waits for a verdict)."""
        image = image_of(event.pid)
        if image is None:
            # already gone (a few-ms process read late): nothing of it is left to evaluate but
            # the record, so the file its path names now stands for it
            image = _path_image(event.filename)
            if image is None or image not in self.judged:
                return False
        if image in self.judged:
            self.judged.move_to_end(image)
            self.held[event.pid] = (time.monotonic(), event)
            self.counts["held"] += 1
            return True
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()  # verdicts never given (exited unread): start over
        self._seen[event.pid] = image
        return False

    def judge(self, pid: int, exe_identity: tuple) -> None:
        """``pid``'s image was judged clean (from its facts' ``exe_identity``, which must still
        be the image its exec had: a re-exec or a replaced file in between judges nothing)."""
        image = self._seen.pop(pid, None)
        if image is None or image[:4] != tuple(exe_identity):
            return
        self.judged[image] = None
        self.judged.move_to_end(image)
        if len(self.judged) > JUDGED_MAX:
            self.judged.popitem(last=False)
        self.counts["judged"] += 1

    def exited(self, pid: int) -> bool:
        """The process ended: True when its exec was held (both are dropped).  Its image stays
        in ``_seen``: a short process's verdict comes after its exit."""
        if self.held.pop(pid, None) is None:
            return False
        self.counts["dropped"] += 1
        return True

    def release(self, pid: int) -> Exec | None:
        """The held exec of ``pid``, to go up now (None when none is held)."""
        kept = self.held.pop(pid, None)
        if kept is None:
            return None
        self.counts["released"] += 1
        return kept[1]

    def take_old(self, now: float) -> list[Exec]:
        """Held execs of processes alive past the age, oldest first, to go up now."""
        limit = now - self.age_s
        old = [pid for pid, (since, _) in self.held.items() if since <= limit]
        return [e for e in map(self.release, old) if e is not None]

    @property
    def next_due(self) -> float:
        """When the oldest held exec is due (infinity with none held)."""
        return min((since for since, _ in self.held.values()), default=float("inf")) + self.age_s
