"""Signals to one exact process: a pidfd, and its start time checked before anything is sent.

A pid is only a number the kernel hands out again.  :func:`open_process`
opens a pidfd (which from then on names that one process, whatever happens
to the number) and compares the process's start time with the one the
verdict was made about; a mismatch means the pid was recycled and nothing is
signalled.  :class:`Guard` says whether a process may be acted on at all:
never pid 1, kernel threads, gpuguard itself or its ancestors, protected
executables or processes outside the configured scope.
"""

from __future__ import annotations

import os
import select
import signal
from dataclasses import dataclass

import psutil

from gpuguard.events.process_facts import ProcessFacts
from gpuguard.respond.cgroup_blocks import cgroup2_of
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path

START_TIME_TOLERANCE_S = 0.015  # ProcessKey.start_time keeps 2 decimals


class RecycledPid(Exception):
    """The pid now names another process (or none)."""


@dataclass(slots=True)
class ProcessHandle:
    pid: int
    pidfd: int

    def send(self, sig: int) -> None:
        signal.pidfd_send_signal(self.pidfd, sig)

    def wait_exit(self, timeout_s: float) -> bool:
        """True once the process has exited (its pidfd turns readable), False at the timeout."""
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def __enter__(self) -> ProcessHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_time_of(pid: int) -> float:
    """The start time the correlator keys processes by (psutil's, rounded to 2 decimals)."""
    return round(psutil.Process(pid).create_time(), 2)


def open_process(pid: int, start_time: float) -> ProcessHandle:
    """A pidfd for ``pid`` if it is still the process that started at ``start_time``; else RecycledPid."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise RecycledPid(f"pid {pid} has exited") from None
    try:
        # Checked after the pidfd is open: from here the pidfd cannot follow the number to another process.
        now_start = start_time_of(pid)
    except psutil.NoSuchProcess:
        os.close(pidfd)
        raise RecycledPid(f"pid {pid} has exited") from None
    if abs(now_start - start_time) > START_TIME_TOLERANCE_S:
        os.close(pidfd)
        raise RecycledPid(
            f"pid {pid} now belongs to a process started at {now_start:.2f}, not {start_time:.2f}"
        )
    return ProcessHandle(pid, pidfd)


def process_group_members(pgid: int) -> list[int]:
    """Every live pid in process group ``pgid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    members.append(int(entry))
            except OSError:
                continue
    return members


def own_lineage() -> frozenset[int]:
    """gpuguard's pid and every ancestor's, up to pid 1."""
    pids = {os.getpid()}
    try:
        proc = psutil.Process()
        pids.update(p.pid for p in proc.parents())
    except psutil.Error:
        pids.add(os.getppid())
    return frozenset(pids)


class Guard:
    """Whether a process may be acted on (see the module docstring)."""

    def __init__(
        self,
        *,
        scope: str = "all",
        cgroups: tuple[str, ...] = (),
        protect_exes: tuple[str, ...] = (),
    ) -> None:
        self.scope = scope
        self.cgroups = tuple(c.rstrip("/") or "/" for c in cgroups)
        self.protect_exes = frozenset(protect_exes)
        self.lineage = own_lineage()

    def refusal(
        self, pid: int, facts: ProcessFacts | None, *, allowlisted: bool = False
    ) -> str | None:
        """Why ``pid`` must not be touched, or None when it may be."""
        if pid <= 1:
            return "pid 1 and the kernel's own pids are never acted on"
        if pid in self.lineage:
            return "gpuguard and its ancestors are never acted on"
        if allowlisted:
            return "allowlisted"
        if facts is None:
            return "no /proc facts about the process (cannot check scope or identity)"
        if facts.kernel_thread:
            return "kernel threads are never acted on"
        if facts.exe and facts.exe in self.protect_exes:
            return "its executable is in response.protect_exes"
        if self.scope == "containers" and not facts.container_id:
            return "outside the response scope (containers only)"
        return self.outside_scope(pid, facts.cgroup)

    def outside_scope(self, pid: int, fallback_cgroup: str = "") -> str | None:
        """Why ``pid`` is outside ``response.cgroups`` / ``scope: containers`` now, or None."""
        if (
            self.scope == "containers"
            and not container_from_cgroup(read_cgroup_path(pid)).container_id
        ):
            return "outside the response scope (containers only)"
        if self.cgroups:
            # The live cgroup v2 path (facts may name a v1 hierarchy on hybrid hosts).
            try:
                cgroup = cgroup2_of(pid)
            except OSError:
                cgroup = fallback_cgroup
            if not cgroup or not any(_within(cgroup, c) for c in self.cgroups):
                return "outside the response scope (response.cgroups)"
        return None


def _within(cgroup: str, parent: str) -> bool:
    cgroup = cgroup.rstrip("/") or "/"
    return parent == "/" or cgroup == parent or cgroup.startswith(parent + "/")
