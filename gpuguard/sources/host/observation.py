"""One look at the live host, in the agent's event model: what ``gpuguard scan`` feeds the engine.

Details: docs/internals.md, "host_observation".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from gpuguard.errors import GpuguardError
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import ConnActivity, CpuActivity, Event
from gpuguard.events.process_facts import MAX_ANCESTORS, Ancestor, ProcessFacts
from gpuguard.sources.gpu.fd_holders import HolderScan, holder_event, scan_device_holders
from gpuguard.sources.gpu.registry import SOURCE_NAMES, open_samplers
from gpuguard.sources.host.rounding_window import RoundingWindow, watch_rounding
from gpuguard.sources.net.connections import (
    ConnectionTable,
    connect_event,
    read_connection_table,
)
from gpuguard.sources.net.session_window import SessionWindow
from gpuguard.sources.proc.cpu_usage import (
    PAUSED_RUNNABLE,
    cpu_activity,
    cpu_and_start,
    paused_threads,
    process_start_after_boot,
    summarize,
    thread_totals,
)
from gpuguard.sources.proc.fd_table import read_fd_tables
from gpuguard.sources.proc.hidden_pids import list_proc_pids
from gpuguard.sources.proc.pod_names import PodNames
from gpuguard.sources.proc.process import collect_process_facts

GPU_STEP_S = 1.0  # the agent's sampling rate: windows hold the same shape in scan and agent


@dataclass(slots=True)
class HostObservation:
    time: float
    listed_pids: set[int]
    facts: dict[int, ProcessFacts] = field(default_factory=dict)
    holders: HolderScan = field(default_factory=HolderScan)
    connections: ConnectionTable = field(default_factory=ConnectionTable)
    snapshots: list[GpuSnapshot] = field(default_factory=list)  # oldest first
    accounting: list[GpuAccounting] = field(
        default_factory=list
    )  # NVML accounting records (running and exited)
    gpu_window_s: float = 0.0  # seconds of live GPU sampling (first to last sample)
    sessions: list[ConnActivity] = field(
        default_factory=list
    )  # GPU holders' connections over the window
    session_status: list[str] = field(default_factory=list)  # TCP counters that could not be read
    gpu_status: list[str] = field(
        default_factory=list
    )  # one line per GPU source that does not work here
    cpu_window_s: float = 0.0
    own_uid: int = 0
    # processes with a thread runnable >= 90 % of its life (schedstat: no window needed)
    cpu_activity: dict[int, CpuActivity] = field(default_factory=dict)
    gpu_window_skipped: bool = False  # asked for, but no GPU sampler and no GPU handle here
    # processes with a thread paused from outside (SIGSTOP duty cycle): rounding-mode candidates
    paused: dict[int, CpuActivity] = field(default_factory=dict)
    rounding: RoundingWindow = field(default_factory=RoundingWindow)  # the FPU probe's window
    # the head of each environ read with the facts, {(pid, start time): bytes}, for YARA
    environs: dict[tuple[int, float], bytes] = field(default_factory=dict)

    def events(self) -> list[Event]:
        """GpuOpen and Connect events for every process with facts, in pid order."""
        out: list[Event] = []
        for pid, holders in sorted(self.holders.by_pid().items()):
            facts = self.facts.get(pid)
            if facts is None:
                continue
            out.extend(holder_event(h, self.time, max(facts.uid, 0), facts.comm) for h in holders)
        for pid, conns in sorted(self.connections.by_pid.items()):
            facts = self.facts.get(pid)
            if facts is None:
                continue
            out.extend(connect_event(c, self.time, max(facts.uid, 0), facts.comm) for c in conns)
        out.extend(s for s in self.sessions if s.pid in self.facts)
        out.extend(a for pid, a in sorted(self.cpu_activity.items()) if pid in self.facts)
        return out

    def gpu_pid_states(self) -> dict[int, str]:
        """For each pid a GPU driver lists in the newest live snapshots: "running", "zombie" or "gone"."""
        return gpu_pid_states(self.snapshots)

    def gpu_pids(self) -> dict[int, str]:
        """Pids GPU drivers report (host pids), to cross-check against the /proc listing."""
        return {p.pid: f"gpu:{s.source}" for s in self.snapshots for p in s.processes}


def gpu_pid_states(snapshots: Iterable[GpuSnapshot]) -> dict[int, str]:
    """For each pid a GPU driver lists in the newest live snapshots: "running", "zombie" or "gone"."""
    latest: dict[str, GpuSnapshot] = {}
    for snap in snapshots:
        if not any(d.extra.get("history") for d in snap.devices):
            latest[snap.source] = snap
    states: dict[int, str] = {}
    for snap in latest.values():
        for usage in snap.processes:
            try:
                status = psutil.Process(usage.pid).status()
            except psutil.NoSuchProcess:
                status = "gone"
            except psutil.AccessDenied:
                status = "running"
            states[usage.pid] = (
                "zombie"
                if status == psutil.STATUS_ZOMBIE
                else "gone"
                if status == "gone"
                else "running"
            )
    return states


def _fill_ancestors(facts: dict[int, ProcessFacts], proc_root: str) -> None:
    for f in facts.values():
        chain: list[Ancestor] = []
        ppid = f.ppid
        while ppid > 0 and len(chain) < MAX_ANCESTORS:
            parent = facts.get(ppid)
            if parent is None:
                break
            chain.append(Ancestor(parent.pid, parent.comm, parent.exe))
            if parent.pid <= 1 or parent.ppid == ppid:
                break
            ppid = parent.ppid
        f.ancestors = chain


def _lifetime_cpu_activity(
    facts: dict[int, ProcessFacts], now: float, proc_root: str
) -> tuple[dict[int, CpuActivity], dict[int, CpuActivity]]:
    """Lifetime runnable threads of every user-space process: ({pid: activity} of those with a
    thread spinning, {pid: activity} of those with one paused from outside instead).

    One listing of its tasks and one schedstat read per thread (the kernel's totals since
    each thread started), so a scan sees a throttled miner at once, with no window."""
    spinning: dict[int, CpuActivity] = {}
    paused: dict[int, CpuActivity] = {}
    boot = psutil.boot_time()  # the facts' start times are psutil's: boot time + ticks
    for pid, f in facts.items():
        if f.kernel_thread or not f.exe:
            continue
        start = f.start_time - boot if f.start_time else process_start_after_boot(pid, proc_root)
        if start is None:
            continue
        single = f.num_threads == 1
        totals = thread_totals(pid, start, proc_root, single)
        if totals is None:
            continue
        runnable = summarize(totals)
        if runnable.spinning_threads:
            spinning[pid] = cpu_activity(now, pid, f.comm, runnable)
        elif runnable.runnable_max >= PAUSED_RUNNABLE and paused_threads(
            pid, totals, proc_root, single
        ):
            paused[pid] = cpu_activity(now, pid, f.comm, runnable)
    return spinning, paused


def _sample_all(samplers: list, out: list[GpuSnapshot]) -> None:
    for sampler in samplers:
        out.append(sampler.sample())


def _driver_memory(samplers: list, obs: HostObservation) -> None:
    """What the drivers remember: device sample history and accounting records (samplers that have them)."""
    for sampler in samplers:
        history = getattr(sampler, "history", None)
        if history is not None:
            obs.snapshots.extend(history())
        accounting = getattr(sampler, "accounting", None)
        if accounting is not None:
            records, errors = accounting()
            obs.accounting.extend(records)
            obs.gpu_status.extend(errors)


class _WindowSampler(threading.Thread):
    """Samples every GPU, and the TCP counters of GPU holders once they are known, once a second until ``stop``
    (the scan's other steps run meanwhile)."""

    def __init__(self, samplers: list, out: list[GpuSnapshot], sessions: SessionWindow) -> None:
        super().__init__(name="gpuguard-gpu-window", daemon=True)
        self._samplers, self._out, self._sessions = samplers, out, sessions
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(GPU_STEP_S):
            _sample_all(self._samplers, self._out)
            self._sessions.sample()


def observe_host(
    cpu_sample_s: float = 0.5,
    proc_root: str = "/proc",
    gpu: bool = True,
    facts_hook: Callable[[ProcessFacts], None] | None = None,
    gpu_window_s: float = 0.0,
    fpu_window_s: float = 0.0,
) -> HostObservation:
    """Observe every process once (see the module docstring for the steps)."""
    try:
        listed = list_proc_pids(proc_root)
    except OSError as exc:
        raise GpuguardError(
            f"cannot list processes in {proc_root}: {exc.strerror}",
            "mount procfs (mount -t proc proc /proc)",
        ) from None
    obs = HostObservation(time=time.time(), listed_pids=listed, own_uid=os.geteuid())
    window_start = time.monotonic()
    # one read of /proc/PID/stat per process (psutil.Process would read it twice more)
    cpu_baseline: dict[int, tuple[float, int]] = {}
    if cpu_sample_s > 0:
        for pid in listed:
            first = cpu_and_start(pid, proc_root)
            if first is not None:
                cpu_baseline[pid] = first

    # one walk of every fd table: GPU device holders, the DRM sampler's first sweep and the
    # socket owners of the connection table all read it
    tables = read_fd_tables(sorted(listed), proc_root)
    samplers = (
        open_samplers(
            SOURCE_NAMES,
            on_status=obs.gpu_status.append,
            fd_links=tables.device_links if proc_root == "/proc" else None,
        )
        if gpu
        else []
    )
    window: _WindowSampler | None = None
    live: list[GpuSnapshot] = []
    sessions = SessionWindow()
    try:
        _sample_all(samplers, live)
        _driver_memory(samplers, obs)
        if gpu_window_s > 0 and samplers:
            window = _WindowSampler(samplers, live, sessions)
            window.start()
        pod_names = PodNames()  # the pod's names and image, from the node (rules read them)
        for pid in sorted(listed):
            facts = collect_process_facts(
                pid, proc_root, with_ancestors=False, environ_sink=obs.environs
            )
            if facts is not None:
                pod_names.fill(facts)
                if facts_hook is not None:
                    facts_hook(facts)
                obs.facts[pid] = facts
        _fill_ancestors(obs.facts, proc_root)
        obs.holders = scan_device_holders(sorted(obs.facts), proc_root, tables)
        if window is None and gpu_window_s > 0 and obs.holders.holders:
            # no GPU sampler works here, yet processes hold GPU devices: watch their sessions
            window = _WindowSampler(samplers, live, sessions)
            window.start()
        elif window is None and gpu_window_s > 0:
            obs.gpu_window_skipped = True
        if window is not None and proc_root == "/proc":
            # the holders the fd tables show and the pids the GPU drivers list; the window thread samples them
            sessions.pids = set(obs.holders.by_pid()) | {
                p.pid for snap in list(live) for p in snap.processes
            }
        obs.connections = read_connection_table(
            socket_owners=tables.socket_owners() if proc_root == "/proc" else None
        )
        obs.cpu_activity, obs.paused = _lifetime_cpu_activity(obs.facts, obs.time, proc_root)
        if fpu_window_s > 0 and proc_root == "/proc":
            # the GPU window's thread samples meanwhile
            obs.rounding = watch_rounding(obs.cpu_activity | obs.paused, fpu_window_s)
            obs.cpu_activity.update(obs.rounding.activity)

        remaining = cpu_sample_s - (time.monotonic() - window_start)
        if remaining > 0:
            time.sleep(remaining)
        obs.cpu_window_s = elapsed = time.monotonic() - window_start
        for pid, (used, started) in cpu_baseline.items():
            facts = obs.facts.get(pid)
            now_used = cpu_and_start(pid, proc_root)
            if facts is None or now_used is None or now_used[1] != started or elapsed <= 0:
                continue  # gone, or the pid is another process's now
            facts.cpu_percent = round(100.0 * max(0.0, now_used[0] - used) / elapsed, 1)
        if window is not None:
            remaining = gpu_window_s - (time.monotonic() - window_start)
            if remaining > 0:
                time.sleep(remaining)
            window.stop_event.set()
            window.join()
            window = None
            sessions.sample()
        _sample_all(samplers, live)
    finally:
        if window is not None:
            window.stop_event.set()
            window.join()
        for sampler in samplers:
            try:
                sampler.close()
            except Exception:  # noqa: BLE001 - a sampler's close must not turn a finished scan into a traceback
                pass
    if len(live) > 1:
        obs.gpu_window_s = live[-1].time - live[0].time
    obs.snapshots.extend(live)
    obs.snapshots.sort(key=lambda snap: snap.time)
    obs.sessions = sessions.records(
        lambda pid: (
            (obs.facts[pid].comm, max(obs.facts[pid].uid, 0)) if pid in obs.facts else ("", 0)
        )
    )
    obs.session_status = sorted(sessions.unreadable)
    return obs


def limitation_lines(obs: HostObservation) -> list[str]:
    """What this run could not see, each with the fix ("run as root ...")."""
    lines: list[str] = []
    others = [f for f in obs.facts.values() if f.uid != obs.own_uid]
    no_exe = sum(1 for f in others if not f.exe and not f.kernel_thread and f.start_time)
    denied = sum(1 for f in others if not f.start_time)
    no_env = sum(1 for f in others if not f.kernel_thread and f.exe and not f.environ_readable)
    no_fd = sum(
        1
        for pid in obs.holders.unreadable_pids
        if (f := obs.facts.get(pid)) is not None and f.uid != obs.own_uid and not f.kernel_thread
    )
    if no_exe:
        lines.append(
            f"could not read /proc/PID/exe for {no_exe} processes owned by other users; run as root to see them"
        )
    if denied:
        lines.append(
            f"could not read /proc/PID/stat for {denied} processes (hidepid?); run as root to see them"
        )
    if no_fd:
        lines.append(
            f"could not read /proc/PID/fd for {no_fd} processes owned by other users, so their GPU "
            "device handles are unknown; run as root to see them"
        )
    if no_env:
        lines.append(
            f"could not read /proc/PID/environ for {no_env} processes owned by other users "
            "(LD_PRELOAD unchecked); run as root to see them"
        )
    lines.extend(f"could not read {line}; run as root to see them" for line in obs.session_status)
    if obs.connections.unavailable:
        lines.append(f"{obs.connections.unavailable}; run as root to see them")
    elif obs.connections.unattributed:
        lines.append(
            f"could not map {obs.connections.unattributed} network connections to their processes; "
            "run as root to see them"
        )
    return lines
