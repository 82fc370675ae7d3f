"""Reassembly of the first writes of each connection, for protocol recognition.

The probes copy the first ``payload_writes`` writes of every fresh connection
(``net_payload`` events, each cut at the capture length).  A protocol message
can span writes, so :class:`PayloadStreams` keeps the writes seen so far per
``(pid, fd)`` and recognises the stream as a whole
(``gpuguard.events.payload.recognise_stream``); a write that follows a cut one
is recognised on its own, since it is not contiguous with it.  It also keeps
which connections are still being captured per process, so the sensor can
remove their kernel entries when the process exits.  Bounded: at most
``MAX_PAYLOAD_STREAMS`` streams, the oldest dropped first.
"""

from __future__ import annotations

from collections import defaultdict

from gpuguard.events.model import NetPayload
from gpuguard.events.payload import recognise_payload, recognise_stream

MAX_PAYLOAD_STREAMS = 4096
_CUT = b""  # marks a stream whose last captured write was truncated (compared by identity)


class PayloadStreams:
    """Per-connection captured writes and the connections still being captured (see the module docstring)."""

    def __init__(self, payload_writes: int) -> None:
        self.payload_writes = payload_writes
        self._streams: dict[tuple[int, int], list[bytes]] = {}
        self._fresh_fds: dict[int, set[int]] = defaultdict(set)

    def connected(self, pid: int, fd: int, capturing: bool) -> None:
        """A connect on ``fd``: a new stream (the fd may have carried another connection before)."""
        self._streams.pop((pid, fd), None)
        if capturing:
            self._fresh_fds[pid].add(fd)

    def recognise(self, event: NetPayload) -> None:
        """Set ``event.protocol`` and ``event.detail`` from the stream so far."""
        key = (event.pid, event.fd)
        chunks = self._streams.get(key)
        if chunks is None:
            if len(self._streams) >= MAX_PAYLOAD_STREAMS:
                self._streams.pop(next(iter(self._streams)))
            chunks = self._streams[key] = []
        if chunks and chunks[-1] is _CUT:
            event.protocol, event.detail = recognise_payload(event.data)
        else:
            chunks.append(event.data)
            event.protocol, event.detail = recognise_stream(chunks)
            if event.truncated:
                chunks.append(_CUT)
        if event.seq + 1 >= self.payload_writes:
            self._streams.pop(key, None)
            fresh = self._fresh_fds.get(event.pid)
            if fresh is not None:
                fresh.discard(event.fd)
                if not fresh:
                    del self._fresh_fds[event.pid]

    def process_gone(self, pid: int) -> set[int]:
        """Forget an exited process's streams; returns the fds whose capture had not finished."""
        fresh = self._fresh_fds.pop(pid, None) or set()
        for fd in fresh:
            self._streams.pop((pid, fd), None)
        return fresh

    def __len__(self) -> int:
        return len(self._streams)
