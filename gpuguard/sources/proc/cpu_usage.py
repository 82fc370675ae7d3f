"""How processes hold the CPU: CPU % between two looks, and runnable threads from schedstat.

The agent has no per-process CPU window otherwise (the sensor sees syscalls, not time
on a CPU).  It samples only the processes a CPU-miner rule could need it for (huge-page
users and host tuners: ``Correlator.cpu_candidates``) once per housekeeping period, so
the cost is one small /proc read per candidate per period.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from gpuguard.events.model import CpuActivity
from gpuguard.events.rounding_modes import FpuCounts

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, proc_root: str = "/proc") -> float | None:
    """User + system CPU seconds the process has used so far; None if it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def cpu_and_start(pid: int, proc_root: str = "/proc") -> tuple[float, int] | None:
    """(user + system CPU seconds so far, start time in clock ticks after boot) from one read of
    /proc/PID/stat; the start time tells a recycled pid apart.  None if it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


class CpuSampler:
    """CPU % (100 = one core) of each process since the previous :meth:`sample` that included it."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._last: dict[Hashable, tuple[float, float]] = {}  # key -> (cpu seconds, monotonic time)

    def sample(self, keys: Iterable[tuple[int, float]]) -> dict[tuple[int, float], float]:
        """``keys`` are (pid, start time) pairs; returns a percentage for those seen last time too."""
        now = time.monotonic()
        seen: dict[Hashable, tuple[float, float]] = {}
        out: dict[tuple[int, float], float] = {}
        for key in keys:
            used = cpu_seconds(key[0], self.proc_root)
            if used is None:
                continue
            seen[key] = (used, now)
            previous = self._last.get(key)
            if previous is not None and now > previous[1] and used >= previous[0]:
                out[key] = round(100.0 * (used - previous[0]) / (now - previous[1]), 1)
        self._last = seen  # processes no longer asked for are forgotten
        return out


# -- runnable fraction per thread (schedstat) ----------------------------------------------
# /proc/PID/task/TID/schedstat: nanoseconds on a CPU, nanoseconds waiting in a run queue,
# timeslices.  A thread that never sleeps is runnable all the time whatever it is given to
# run: nice 19, a cgroup quota or two CPU hogs beside it move time from the first figure to
# the second, not out of their sum.  So (run + wait) / wall time holds ~1.0 for a spinning
# thread under throttling and contention, where CPU % falls to whatever the scheduler
# grants it.  The kernel keeps these totals from the thread's start (CONFIG_SCHED_INFO),
# so one read gives the lifetime figure; two reads give a window.

SPINNING = 0.9  # runnable fraction from which a thread counts as spinning
MIN_SPAN_S = 5.0  # a thread younger than this is not judged (start-up noise)
MAX_THREADS = 512  # threads read per process: a miner uses one per core
# A thread stopped from outside (SIGSTOP/SIGCONT throttlers such as cpulimit) is neither
# runnable nor asleep while stopped, so its runnable fraction falls to its duty cycle; each stop
# is one voluntary switch.  One runnable >= PAUSED_RUNNABLE of its life that switched out
# voluntarily at most PAUSED_SWITCHES_PER_S times a second looks paused, not waiting for work
# (a server or an interactive program blocks hundreds of times a second).
PAUSED_RUNNABLE = 0.25
PAUSED_SWITCHES_PER_S = 20.0


@dataclass(slots=True)
class _ThreadTotals:
    runnable_ns: int
    run_ns: int
    span_s: float  # the thread's age at the read


def _boot_seconds() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _thread_start_s(task_dir: str) -> float | None:
    """Thread start, seconds after boot (field 22 of its stat)."""
    try:
        with open(f"{task_dir}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19]) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def thread_totals(
    pid: int, start_after_boot_s: float, proc_root: str = "/proc", single_thread: bool = False
) -> dict[int, _ThreadTotals] | None:
    """Runnable and run nanoseconds of each thread so far, with its age; None if gone or unreadable.

    ``single_thread``: the process had one thread when its facts were read, so its task listing
    is skipped (a thread started since is younger than ``MIN_SPAN_S``: it would not be judged).

    ``start_after_boot_s`` is the process's start: a thread's own start is read only when the
    process's age would not already show it spinning (a thread started late, e.g. by a process
    that idled before it began to mine), so most threads cost one small read."""
    now = _boot_seconds()
    if single_thread:
        tids = [str(pid)]
    else:
        try:
            tids = os.listdir(f"{proc_root}/{pid}/task")
        except OSError:
            return None
    out: dict[int, _ThreadTotals] = {}
    for name in tids[:MAX_THREADS]:
        # a single thread's schedstat is its process's own (/proc/PID/schedstat: the leader's)
        task_dir = f"{proc_root}/{pid}" if single_thread else f"{proc_root}/{pid}/task/{name}"
        try:
            fd = os.open(f"{task_dir}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                fields = os.read(fd, 256).split()
            finally:
                os.close(fd)
            run_ns, wait_ns = int(fields[0]), int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        runnable_ns = run_ns + wait_ns
        span = now - start_after_boot_s
        if runnable_ns >= MIN_SPAN_S * 1e9 and runnable_ns < SPINNING * span * 1e9:
            started = _thread_start_s(task_dir)
            if started is not None and started > start_after_boot_s:
                span = now - started
        out[int(name)] = _ThreadTotals(runnable_ns, run_ns, max(span, 0.0))
    return out if out or not single_thread else None  # its one thread gone: the process is


def _voluntary_switches(task_dir: str) -> int | None:
    try:
        with open(f"{task_dir}/status", "rb") as f:
            for line in f:
                if line.startswith(b"voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def paused_threads(
    pid: int,
    totals: dict[int, _ThreadTotals],
    proc_root: str = "/proc",
    single_thread: bool = False,
) -> int:
    """Threads of ``totals`` (:func:`thread_totals`) that look paused from outside rather than
    asleep: runnable between PAUSED_RUNNABLE and SPINNING of a life of MIN_SPAN_S or more, with
    few voluntary switches (one /proc read per such thread only)."""
    found = 0
    for tid, t in totals.items():
        if (
            t.span_s < MIN_SPAN_S
            or not PAUSED_RUNNABLE <= t.runnable_ns / (t.span_s * 1e9) < SPINNING
        ):
            continue
        task_dir = f"{proc_root}/{pid}" if single_thread else f"{proc_root}/{pid}/task/{tid}"
        switches = _voluntary_switches(task_dir)
        if switches is not None and switches <= PAUSED_SWITCHES_PER_S * t.span_s:
            found += 1
    return found


def process_start_after_boot(pid: int, proc_root: str = "/proc") -> float | None:
    """Process start, seconds after boot."""
    return _thread_start_s(f"{proc_root}/{pid}")


@dataclass(slots=True)
class Runnable:
    """What :func:`summarize` makes of one process's threads (the fields of ``CpuActivity``)."""

    threads: int = 0
    spinning_threads: int = 0
    spin_span_s: float = 0.0
    runnable_max: float = 0.0
    ran_share: float | None = None


def summarize(
    totals: dict[int, _ThreadTotals], previous: dict[int, tuple[int, int, float]] | None = None
) -> Runnable:
    """Spinning threads over their lifetime or, with ``previous`` ({tid: (runnable ns, run ns,
    boot seconds)} from an earlier read), over the interval since; each thread counts once,
    by whichever of the two shows it spinning over the longer span."""
    now = _boot_seconds()
    out = Runnable(threads=len(totals))
    run_sum = runnable_sum = 0
    for tid, t in totals.items():
        best_fraction, best_span, best_run, best_runnable = 0.0, 0.0, 0, 0
        if t.span_s >= MIN_SPAN_S:
            best_fraction = t.runnable_ns / (t.span_s * 1e9)
            best_span, best_run, best_runnable = t.span_s, t.run_ns, t.runnable_ns
        old = previous.get(tid) if previous else None
        if old is not None and now - old[2] >= MIN_SPAN_S and t.runnable_ns >= old[0]:
            span = now - old[2]
            fraction = (t.runnable_ns - old[0]) / (span * 1e9)
            if best_fraction < SPINNING <= fraction or (
                fraction >= SPINNING and best_fraction >= SPINNING and span > best_span
            ):
                best_fraction, best_span = fraction, span
                best_run, best_runnable = t.run_ns - old[1], t.runnable_ns - old[0]
        best_fraction = min(best_fraction, 1.0)  # clock reads a few microseconds apart
        out.runnable_max = max(out.runnable_max, round(best_fraction, 3))
        if best_fraction >= SPINNING:
            out.spinning_threads += 1
            out.spin_span_s = max(out.spin_span_s, round(best_span, 1))
            run_sum += best_run
            runnable_sum += best_runnable
    if runnable_sum:
        out.ran_share = round(run_sum / runnable_sum, 3)
    return out


class RunnableSampler:
    """Spinning threads of chosen processes over their lifetime and since the previous look."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._last: dict[Hashable, tuple[float, dict[int, tuple[int, int, float]]]] = {}

    def sample(self, pids: dict[Hashable, int]) -> dict[Hashable, Runnable]:
        """``pids``: {key: pid}; a key's start after boot is read once and kept."""
        seen: dict[Hashable, tuple[float, dict[int, tuple[int, int, float]]]] = {}
        out: dict[Hashable, Runnable] = {}
        for key, pid in pids.items():
            last = self._last.get(key)
            start = last[0] if last is not None else process_start_after_boot(pid, self.proc_root)
            if start is None:
                continue
            totals = thread_totals(pid, start, self.proc_root)
            if totals is None:
                continue
            out[key] = summarize(totals, last[1] if last is not None else None)
            now = _boot_seconds()
            seen[key] = (start, {tid: (t.runnable_ns, t.run_ns, now) for tid, t in totals.items()})
        self._last = seen
        return out


def _fpu_fields(fpu: FpuCounts | None, watched: bool) -> dict:
    """CpuActivity's FPU fields from the probe's totals (``watched`` False: the probe is not
    loaded; ``fpu`` None: loaded, and the process never left round-to-nearest)."""
    if not watched:
        return {}
    if fpu is None:
        return {"fpu_samples": 0, "fpu_round_nondefault": 0, "fpu_round_changes": 0}
    return {
        "fpu_samples": fpu.samples,
        "fpu_round_nondefault": fpu.nondefault,
        "fpu_round_changes": fpu.changes,
        "fpu_span_s": round(fpu.span_s, 1),
        "fpu_modes": list(fpu.modes),
        "fpu_transitions": list(fpu.transitions),
        "fpu_sleeps": fpu.sleeps,
        "fpu_stops": fpu.stopped,
        "fpu_threads": fpu.threads,
        "fpu_sleepless_threads": fpu.sleepless,
    }


def cpu_activity(
    time_s: float,
    pid: int,
    comm: str,
    runnable: Runnable | None,
    fpu: FpuCounts | None = None,
    fpu_watched: bool = False,
) -> CpuActivity:
    """One ``CpuActivity`` record from a runnable summary and the FPU probe's totals."""
    r = runnable or Runnable()
    return CpuActivity(
        time=time_s,
        pid=pid,
        comm=comm,
        threads=r.threads,
        spinning_threads=r.spinning_threads,
        spin_span_s=r.spin_span_s,
        runnable_max=r.runnable_max,
        ran_share=r.ran_share,
        **_fpu_fields(fpu, fpu_watched or fpu is not None),
    )


def cpu_activity_with_fpu(activity: CpuActivity, fpu: FpuCounts | None) -> CpuActivity:
    """``activity`` (a runnable look) with the FPU probe's totals of a window that watched it."""
    return dataclasses.replace(activity, **_fpu_fields(fpu, True))


class CpuActivitySampler:
    """The agent's look at CPU-miner candidates each housekeeping period: runnable threads over
    their lifetime and since the previous look, with the FPU probe's rounding-mode totals."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.runnable = RunnableSampler(proc_root)

    def sample(
        self,
        targets: dict[Hashable, tuple[int, str]],
        now: float,
        fpu: dict[int, FpuCounts] | None = None,
    ) -> list[CpuActivity]:
        """``targets``: {key: (pid, comm)}; ``fpu`` None when the probe is not loaded."""
        measured = self.runnable.sample({key: pid for key, (pid, _) in targets.items()})
        out = []
        for key, runnable in measured.items():
            pid, comm = targets[key]
            counts = fpu.get(pid) if fpu is not None else None
            out.append(cpu_activity(now, pid, comm, runnable, counts, fpu is not None))
        return out
