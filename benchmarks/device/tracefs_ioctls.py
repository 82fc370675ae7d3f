"""Every ioctl(2) on the host from the kernel's own syscall trace event, named by gpuguard's decoder.

No BPF (the GPU machine has no bcc): a tracefs instance of the check's own, so no other
tracing is touched, with ``syscalls:sys_enter_ioctl`` on and the monotonic clock.  What it
reads is written in the format of tests/traces/h100 (``comm-tid [cpu] flags time:
sys_ioctl(fd: F, cmd: C, arg: A)``, one line per ioctl).  Which file each fd was comes from
/proc/PID/fd, read every few milliseconds while the capture runs (:class:`FdWatch`): the fd's
path gives the device class, and gpuguard's ``ioctl_name`` the command's name.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from gpuguard.events.abi import DeviceClass, device_class_name
from gpuguard.events.devices import classify_device_path
from gpuguard.events.ioctl_names import ioctl_category, ioctl_name

TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
PREFIX = "gg-devcheck-"
LINE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<tid>\d+)\s+\[\d+\].*?\s(?P<ts>\d+\.\d+): "
    r"sys_ioctl\(fd: (?P<fd>\w+), cmd: (?P<cmd>\w+), arg: \w+\)"
)
# Names gpuguard's decoder gives numbers it does not know (ioctl_names._GENERIC_NAME's families).
GENERIC = ("IOCTL(", "NV_ESC(", "UVM_IOCTL(", "AMDKFD_IOC(", "DRM_IO")


def tracefs_root() -> Path:
    """The mounted tracefs with syscall events, mounting it if nothing is there yet."""
    for root in TRACEFS:
        if (root / "events" / "syscalls").is_dir():
            return root
    subprocess.run(
        ["mount", "-t", "tracefs", "nodev", str(TRACEFS[0])], capture_output=True, check=False
    )
    if (TRACEFS[0] / "events" / "syscalls").is_dir():
        return TRACEFS[0]
    raise OSError("no tracefs with syscall events (mount -t tracefs nodev /sys/kernel/tracing)")


class IoctlCapture:
    """One tracefs instance recording sys_enter_ioctl between :meth:`start` and :meth:`stop`."""

    def __init__(self, tag: str, buffer_kb: int = 4096) -> None:
        instances = tracefs_root() / "instances"
        for stale in instances.glob(PREFIX + "*"):  # left by a run that was killed
            if not Path(f"/proc/{stale.name.rsplit('-', 1)[-1]}").exists():
                _rmdir(stale)
        self.dir = instances / f"{PREFIX}{tag}-{os.getpid()}"
        if self.dir.exists():
            _rmdir(self.dir)
        self.dir.mkdir()
        (self.dir / "trace_clock").write_text("mono")  # time.monotonic()'s clock
        (self.dir / "buffer_size_kb").write_text(str(buffer_kb))
        self.enable = self.dir / "events" / "syscalls" / "sys_enter_ioctl" / "enable"

    def start(self) -> float:
        (self.dir / "trace").write_text("")
        self.enable.write_text("1")
        return time.monotonic()

    def stop(self) -> list[str]:
        self.enable.write_text("0")
        with open(self.dir / "trace") as f:
            lines = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]
        (self.dir / "trace").write_text("")
        return lines

    def close(self) -> None:
        try:
            self.enable.write_text("0")
        except OSError:
            pass
        _rmdir(self.dir)


def _rmdir(path: Path) -> None:
    for _ in range(20):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)  # busy while the kernel drains the instance


class FdWatch(threading.Thread):
    """Reads /proc/PID/fd and /proc/PID/task of the watched processes every ``interval`` s."""

    def __init__(self, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.pids: set[int] = set()
        self.tids: dict[int, int] = {}  # thread id -> process id
        self.paths: dict[tuple[int, int], list[tuple[float, str]]] = {}
        self.stop = threading.Event()

    def watch(self, pid: int) -> None:
        self.pids.add(pid)
        self.tids[pid] = pid
        self.look()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.look()

    def look(self) -> None:
        now = time.monotonic()
        for pid in list(self.pids):
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    self.tids[int(tid)] = pid
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    path = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                seen = self.paths.setdefault((pid, int(fd)), [])
                if not seen or seen[-1][1] != path:
                    seen.append((now, path))

    def path_at(self, pid: int, fd: int, when: float) -> str | None:
        """The file ``fd`` was at ``when``: the last reading before it, else the first after."""
        seen = self.paths.get((pid, fd))
        if not seen:
            return None
        before = [path for t, path in seen if t <= when]
        return before[-1] if before else seen[0][1]


def parse(line: str) -> tuple[str, int, float, int, int] | None:
    m = LINE.match(line)
    if m is None:
        return None
    return m["comm"], int(m["tid"]), float(m["ts"]), int(m["fd"], 0), int(m["cmd"], 0)


def decode(lines: list[str], watch: FdWatch, pids: set[int]) -> dict:
    """What the workload's ioctls were, by device class and gpuguard's name for each command."""
    counts = Counter({"host": 0, "workload": 0, "gpu": 0, "other_files": 0, "fd_unknown": 0})
    names: Counter = Counter()
    categories: Counter = Counter()
    undecoded: Counter = Counter()
    for line in lines:
        parsed = parse(line)
        if parsed is None:
            continue
        counts["host"] += 1
        _, tid, ts, fd, cmd = parsed
        pid = watch.tids.get(tid)
        if pid not in pids:
            continue
        counts["workload"] += 1
        path = watch.path_at(pid, fd, ts)
        if path is None:
            counts["fd_unknown"] += 1
            continue
        device_class = classify_device_path(path)
        if device_class == DeviceClass.NONE:
            counts["other_files"] += 1
            continue
        counts["gpu"] += 1
        cls = device_class_name(device_class)
        name = ioctl_name(cls, cmd)
        names[f"{cls} {name}"] += 1
        categories[ioctl_category(name)] += 1
        if name.startswith(GENERIC):
            undecoded[f"{cls} 0x{cmd:x}"] += 1
    decoded = counts["gpu"] - sum(undecoded.values())
    return {
        "ioctls": dict(counts),
        "decoded": decoded,
        "decoded_share": round(decoded / counts["gpu"], 4) if counts["gpu"] else None,
        "by_name": dict(names.most_common(40)),
        "by_category": dict(categories),
        "undecoded": dict(undecoded.most_common(20)),
    }


def write_trace(lines: list[str], path: Path) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(line + "\n" for line in lines)


def fds_listing(pid: int) -> str:
    """``ls -l /proc/PID/fd``'s GPU lines, each after the pid (the traces' ``.fds`` files)."""
    out = subprocess.run(
        ["ls", "-l", f"/proc/{pid}/fd"], capture_output=True, text=True, check=False
    ).stdout
    keep = [
        f"{pid} {line}"
        for line in out.splitlines()
        if " -> " in line and classify_device_path(line.rsplit(" -> ", 1)[1]) != DeviceClass.NONE
    ]
    return "".join(line + "\n" for line in keep)
