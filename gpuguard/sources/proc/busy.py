"""Threads that hardly sleep, host-wide, cheaply: when the FPU rounding-mode probe has work.

The probe (probes/fpu.bpf.c) runs on every context switch of the host, yet only a thread that
hardly sleeps can show RandomX's pattern.  :meth:`SpinWatch.candidates` finds those in three
steps, each paid only when the one before found something: the host's CPU time (/proc/stat),
the processes that used :data:`MIN_SHARE` of a core since the previous look (/proc/PID/stat;
over its lifetime for one not seen before), and in those, threads that blocked at most
:data:`SLEEPS_PER_S` times a second and ran :data:`BUSY_SHARE` of a core, or were runnable (ran,
or waited for a CPU or their quota) as long as a spinning thread is (``cpu_usage.SPINNING``,
the bar the CPU-miner rules read): a miner held to a tenth of a core by a quota, or starved by
heavier work, runs little but is runnable all along; a pipe ping-pong blocks thousands of times
a second.  With more runnable threads than CPUs (/proc/loadavg) a nice-19 thread may run too
little to be picked out, so :attr:`SpinWatch.contended` says so and the probe runs meanwhile.
"""

from __future__ import annotations

import os

from gpuguard.sources.proc.cpu_usage import SPINNING

BUSY_SHARE = 0.2  # of one core: a thread that ran this much, or was runnable SPINNING ...
MIN_SHARE = 0.05  # ... having run this much of a core; a host or process that used less is
# not looked into
SLEEPS_PER_S = 20.0  # voluntary switches a second of a thread that "hardly sleeps"
MIN_AGE_S = 1.0  # a process or thread younger than this is judged at the next look
_TICKS = os.sysconf("SC_CLK_TCK")
_PF_KTHREAD = 0x00200000


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _host_busy_ticks(proc_root: str) -> int:
    """CPU time the host spent outside idle and iowait, in clock ticks (/proc/stat)."""
    fields = [int(x) for x in _read(f"{proc_root}/stat").split(b"\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def _runnable_now(proc_root: str) -> int:
    """Threads runnable on the host at this instant (/proc/loadavg's fourth field, R/T)."""
    return int(_read(f"{proc_root}/loadavg").split()[3].split(b"/")[0])


def _voluntary(task_dir: str) -> int | None:
    for line in _read(f"{task_dir}/status").splitlines():
        if line.startswith(b"voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return None


class SpinWatch:
    """Pids with a thread that hardly sleeps (see the module docstring)."""

    def __init__(self, proc_root: str = "/proc", cpus: int | None = None) -> None:
        self.proc_root = proc_root
        self.cpus = cpus or os.cpu_count() or 1
        self.contended = False  # more runnable threads than CPUs at the latest look
        self._host: tuple[float, int] | None = None  # (uptime, busy ticks) at the last look
        self._procs: dict[int, tuple[int, int, float]] = {}  # pid -> (start, CPU ticks, uptime)
        self._threads: dict[
            tuple[int, int], tuple[float, int, int, int]
        ] = {}  # -> (uptime, run ns, wait ns, sleeps)
        self.counts = {"looks": 0, "process_sweeps": 0, "thread_looks": 0, "contended": 0}

    def candidates(self, ignore: int = 0) -> list[int]:
        """Processes (not ``ignore``, not kernel threads) with a thread that hardly sleeps."""
        root = self.proc_root
        try:
            now = float(_read(f"{root}/uptime").split()[0])
            busy = _host_busy_ticks(root)
        except (OSError, ValueError, IndexError):
            return []
        self.counts["looks"] += 1
        self.contended = False
        last, self._host = self._host, (now, busy)
        if last is not None and (busy - last[1]) / _TICKS < MIN_SHARE * (now - last[0]):
            return []  # the whole host was quieter than one throttled thread
        try:  # the look itself is one of the runnable threads
            self.contended = _runnable_now(root) - 1 > self.cpus
        except (OSError, ValueError, IndexError):
            pass
        self.counts["contended"] += self.contended
        self.counts["process_sweeps"] += 1
        return [pid for pid in self._busy_processes(now, ignore) if self._sleepless(pid, now)]

    def _busy_processes(self, now: float, ignore: int) -> list[int]:
        root, last, seen, out = self.proc_root, self._procs, {}, []
        try:
            names = os.listdir(root)
        except OSError:
            return []
        for name in names:
            if not name.isdigit():
                continue
            try:
                fields = _read(f"{root}/{name}/stat").rsplit(b")", 1)[1].split(None, 20)
                flags, start = int(fields[6]), int(fields[19])
                used = int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):
                continue
            pid = int(name)
            if flags & _PF_KTHREAD or pid == ignore:
                continue
            seen[pid] = (start, used, now)
            before = last.get(pid)
            if before is not None and before[0] == start and now > before[2]:
                share = (used - before[1]) / _TICKS / (now - before[2])
            else:
                age = now - start / _TICKS
                share = used / _TICKS / age if age >= MIN_AGE_S else 0.0
            if share >= MIN_SHARE:
                out.append(pid)
        self._procs = seen
        return out

    def _sleepless(self, pid: int, now: float) -> bool:
        root = self.proc_root
        try:
            tids = os.listdir(f"{root}/{pid}/task")
            start = self._procs[pid][0] / _TICKS
        except (OSError, KeyError):
            return False
        found = False
        for tid in tids:
            task_dir = f"{root}/{pid}/task/{tid}"
            try:
                run_ns, wait_ns = (int(x) for x in _read(f"{task_dir}/schedstat").split()[:2])
                sleeps = _voluntary(task_dir)
            except (OSError, ValueError):
                continue
            if sleeps is None:
                continue
            self.counts["thread_looks"] += 1
            key = (pid, int(tid))
            before = self._threads.get(key)
            self._threads[key] = (now, run_ns, wait_ns, sleeps)
            if before is not None and now > before[0]:
                span, ran = now - before[0], (run_ns - before[1]) / 1e9
                waited, slept = (wait_ns - before[2]) / 1e9, sleeps - before[3]
            else:
                span, ran, waited, slept = now - start, run_ns / 1e9, wait_ns / 1e9, sleeps
                if span < MIN_AGE_S:
                    continue
            if slept <= SLEEPS_PER_S * span and (
                ran >= BUSY_SHARE * span
                or (ran >= MIN_SHARE * span and ran + waited >= SPINNING * span)
            ):
                found = True
        if len(self._threads) > 4096:
            self._threads = {k: v for k, v in self._threads.items() if v[0] == now}
        return found
