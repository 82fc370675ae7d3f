"""The sensor's wait for records: the ring buffer's epoll fd beside an eventfd any thread may write.

bcc's ``ring_buffer_poll(timeout)`` can only end early for a record, so an idle sensor had to
wake on a short timer to notice a stop or a request from another thread (each wake-up of an
idle agent costs ~0.1-0.5 ms of CPU on a VM).  Here the wait is a ``poll(2)`` on libbpf's epoll
fd for the ring (``ring_buffer__epoll_fd``) and on an eventfd: a record, :meth:`RingWait.wake`
(a stop, a watch or interest request) or the timeout ends it, and the records are then read
with ``ring_buffer_consume``.  Where libbpf's symbol cannot be had (another bcc build) or the
sensor uses a perf buffer, :func:`RingWait.open` returns None and the sensor keeps bcc's own
poll with a short timer.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import os
import select
import threading

UNWAKEABLE_MAX_MS = 1000  # the longest wait of a sensor without a RingWait (bcc's own poll)


def _epoll_fd(bpf) -> int | None:
    """libbpf's epoll fd of the ring buffers bcc opened for ``bpf`` (None when not to be had)."""
    manager = getattr(bpf, "_ringbuf_manager", None)  # bcc: a libbpf struct ring_buffer *
    if not manager:
        return None
    try:
        libbpf = ct.CDLL("libbpf.so.1")  # the copy libbcc is linked against (same soname)
        epoll_fd = libbpf.ring_buffer__epoll_fd
    except (OSError, AttributeError):
        return None
    epoll_fd.argtypes, epoll_fd.restype = [ct.c_void_p], ct.c_int
    fd = epoll_fd(manager)
    return fd if fd >= 0 else None


class RingWait:
    """One poll(2) over the ring's epoll fd and a wake-up eventfd (see the module docstring)."""

    def __init__(self, bpf, ring_fd: int) -> None:
        self._bpf = bpf
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # a wake never writes to the fd once closed (or reused); reentrant: a signal handler may
        # run wake() in the thread that holds it
        self._closing = threading.RLock()
        self._poll = select.poll()
        self._poll.register(ring_fd, select.POLLIN)
        self._poll.register(self._wake_fd, select.POLLIN)
        self.interruptions = 0  # waits ended by wake() from another thread

    @classmethod
    def open(cls, bpf) -> RingWait | None:
        fd = _epoll_fd(bpf)
        return cls(bpf, fd) if fd is not None else None

    def wait_and_read(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for a record or a wake-up, then read what the ring holds."""
        for fd, _ in self._poll.poll(timeout_ms):
            if fd == self._wake_fd:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._wake_fd)
                self.interruptions += 1
        self._bpf.ring_buffer_consume()

    def wake(self) -> None:
        """End the current (or next) wait now; from any thread, or a signal handler."""
        with self._closing, contextlib.suppress(OSError):
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)

    def close(self) -> None:
        with self._closing:
            fd, self._wake_fd = self._wake_fd, -1
        with contextlib.suppress(OSError):
            os.close(fd)
