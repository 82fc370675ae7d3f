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
from gpuguard.sources.proc.pod_names import PodNames

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
        never_namespaces: tuple[str, ...] = (),
        only_namespaces: tuple[str, ...] = (),
        pod_names: PodNames | None = None,
    ) -> None:
        self.scope = scope
        self.cgroups = tuple(c.rstrip("/") or "/" for c in cgroups)
        self.protect_exes = frozenset(protect_exes)
        self.never_namespaces = frozenset(never_namespaces)
        self.only_namespaces = frozenset(only_namespaces)
        self.pod_names = pod_names or PodNames()  # a live process's namespace, from the node
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
        return self.namespace_refusal(pid, facts.pod_namespace) or self._outside_cgroups(
            pid, facts.cgroup
        )

    def namespace_refusal(self, pid: int, namespace: str | None = None) -> str | None:
        """Why ``pid``'s Kubernetes namespace keeps it out of the response, or None.

        ``never_act_namespaces``: a process in one is never acted on, nor one in a pod whose
        namespace the node cannot name.  ``only_act_namespaces``: only a process whose
        namespace the node names, and is listed, is acted on.  Unknown errs towards not acting.
        """
        if not (self.never_namespaces or self.only_namespaces):
            return None
        in_pod = True
        if namespace is None:
            ref = container_from_cgroup(read_cgroup_path(pid))
            in_pod = ref.pod_uid is not None or ref.container_id is not None
            namespace = self.pod_names.lookup(ref.pod_uid, ref.container_id).namespace or None
        if namespace in self.never_namespaces:
            return f"in namespace {namespace}, which response.never_act_namespaces names"
        if self.only_namespaces and namespace not in self.only_namespaces:
            where = f"in namespace {namespace}" if namespace else "its namespace is unknown"
            return f"outside the response scope ({where}; response.only_act_namespaces)"
        if self.never_namespaces and namespace is None and in_pod:
            return "its pod's namespace is unknown (response.never_act_namespaces is set)"
        return None

    def outside_scope(self, pid: int, fallback_cgroup: str = "") -> str | None:
        """Why ``pid`` is outside ``response.cgroups`` / ``scope: containers`` / the namespaces
        now, or None."""
        return self.namespace_refusal(pid) or self._outside_cgroups(pid, fallback_cgroup)

    def _outside_cgroups(self, pid: int, fallback_cgroup: str = "") -> str | None:
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
