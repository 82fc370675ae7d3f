"""Pidfds proven to name the process an event was about, through the kernel's exit generations.

A pid is a number the kernel hands out again, within milliseconds on a busy host.
The probes keep an exit generation per pid (``exit_gens``, see ``gg_exec.exit_gen``
in probes/gpuguard.h): it is bumped when a process exits, before its pid can be
reused, and an exec event carries the value it saw.  :func:`open_verified` opens a
pidfd for the pid and then reads the generation: unchanged means no process with
that pid has exited since the event, so the pidfd names that very process, and a
signal sent through it can reach no other.  :func:`read_while_alive` binds what is
read from /proc to a pidfd's process (read, then check it has not been reaped).
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class OffenderExited(Exception):
    """The process an event was about is gone (its pid may name another process now)."""


class ExitGenerations(Protocol):
    """What reads a probe's exit generation of a pid (``sources.ebpf.exit_gens.ExitGenTable``)."""

    def of(self, pid: int) -> int | None: ...


def pidfd_alive(pidfd: int) -> bool:
    """True while the pidfd's process is not yet reaped (so its pid names it in /proc)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def pidfd_exited(pidfd: int) -> bool:
    """True once the pidfd's process has exited (zombie or reaped): it can touch nothing more."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def open_verified(pid: int, exit_gen: int, generations: ExitGenerations) -> int:
    """A pidfd for ``pid`` if it is still the process that had ``exit_gen``; else OffenderExited."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise OffenderExited(f"pid {pid} has exited") from None
    now = generations.of(pid)
    if now != exit_gen:
        os.close(pidfd)
        raise OffenderExited(
            f"pid {pid} exited after the event (exit generation {exit_gen} -> {now}); "
            "the number may belong to another process now"
        )
    return pidfd


def first_sight(generations: ExitGenerations | None) -> Callable[[int, int | None], int | None]:
    """The correlator's hook: a pidfd for a process seen at its exec, proven by the generation.

    None when there is no generation (no sensor, an old recording) or the process is already
    gone; also when the agent is out of file descriptors (the response then proves the
    identity from the generation alone when it acts).
    """

    def identify(pid: int, exit_gen: int | None) -> int | None:
        if generations is None or exit_gen is None:
            return None
        try:
            return open_verified(pid, exit_gen, generations)
        except (OffenderExited, OSError):
            return None

    return identify


def raise_fd_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit (pidfds held per tracked process); returns it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft


def read_while_alive(pidfd: int, read: Callable[[], T]) -> T:
    """``read()`` (of /proc/PID/...), kept only if the pidfd's process was alive throughout."""
    value = read()
    if not pidfd_alive(pidfd):
        raise OffenderExited("the process exited while it was being read")
    return value
