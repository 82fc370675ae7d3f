"""Loading and attaching the sensor's probes, and detaching them without waiting.

The probes are compiled (or taken from the probe cache) with their attach deferred, so the open
classifier is in its program array before any hook fires; detaching hands the probe fds to a
keeper process, so a stopping sensor does not wait for the kernel's RCU grace periods
(:class:`ProbeDetach`).
"""

from __future__ import annotations

import ctypes as ct
import os
import shutil
import subprocess
import threading

from gpuguard.errors import GpuguardError
from gpuguard.sources.ebpf.probe_cache import Loaded, load_probes
from gpuguard.sources.ebpf.probe_source import probe_text


def kernel_has_ringbuf(release: str | None = None) -> bool:
    """BPF ring buffers exist from Linux 5.8."""
    release = release or os.uname().release
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (5, 8)


def load_sensor_probes(bcc, cflags: list[str]) -> Loaded:
    """The sensor's probes loaded, not yet attached (:func:`attach_probes` does that)."""
    return load_probes(bcc, probe_text(), cflags)


def attach_probes(bcc, bpf, enter_hook: str) -> None:
    """Put the open classifier in its program array, then attach every hook."""
    # Every open hook tail-calls this one classifier: it must be in the
    # program array before any hook is attached, or opens would be missed.
    hook_type = bcc.BPF.RAW_TRACEPOINT if enter_hook == "raw" else bcc.BPF.TRACEPOINT
    classifier = bpf.load_func(b"classify_open", hook_type)
    bpf[b"open_classifier"][ct.c_int(0)] = ct.c_int(classifier.fd)
    bpf.attach_all()


def load_failure(exc: Exception) -> GpuguardError:
    """The one line (cause and fix) for a compile, load or attach error bcc raised."""
    return GpuguardError(
        f"the probes failed to compile or load: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
        "check that kernel headers match or fall back cleanly (bash packaging/setup-host.sh setup) "
        "and that the kernel allows BPF (lockdown 'confidentiality' forbids it)",
    )


class ProbeDetach:
    """Detaches every tracepoint and raw-tracepoint probe without making the caller wait for the kernel.

    Releasing a tracepoint's perf event makes the kernel wait for an RCU grace
    period: bcc's cleanup() does them one after another, 0.7 to 1.7 s for our
    23 probes, and under an exec flood the kernel serializes them even when
    they are closed concurrently (benchmarks/README-sensor.md).  So a keeper
    process (``cat``, fixed argv, no shell) is given a second reference to
    every probe fd: our own closes are then cheap (each perf event is disabled
    first, so no new event fires), and the release is paid when the keeper
    reads end-of-file on its stdin and exits, after we are gone.  A stopping
    watch, record or agent thus exits within a second; the probes are released
    by the kernel a moment later.  Without a keeper (no ``cat``, no process to
    be had) the fds are closed concurrently, one thread each.

    The fds are taken out of bcc's tables here, in the calling thread, so bcc's
    cleanup() (ours, or its atexit hook) never sees them again: each fd is closed
    exactly once, the way bcc's detach would close it.
    """

    def __init__(self, bcc, bpf) -> None:
        closes = [(bcc.lib.bpf_close_perf_event_fd, fd) for fd in bpf.tracepoint_fds.values()]
        closes += [(_os_close_status, fd) for fd in bpf.raw_tracepoint_fds.values()]
        bpf.tracepoint_fds.clear()
        bpf.raw_tracepoint_fds.clear()
        self.failures: list[int] = []
        self._threads: list[threading.Thread] = []
        keeper = _start_keeper([fd for _, fd in closes])
        if keeper is not None:
            for close, fd in closes:
                self._close(close, fd)
            keeper.stdin.close()  # end-of-file: the keeper exits and releases the probes
            return
        for close, fd in closes:
            thread = threading.Thread(
                target=self._close, args=(close, fd), name="gpuguard-detach", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: detach here, slowly but surely
                self._close(close, fd)
                continue
            self._threads.append(thread)

    def _close(self, close, fd: int) -> None:
        if close(fd) < 0:
            self.failures.append(fd)

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()


def _start_keeper(fds: list[int]) -> subprocess.Popen | None:
    """A process holding ``fds`` until its stdin closes (see ProbeDetach); None if none can start."""
    cat = shutil.which("cat")
    if not fds or cat is None:
        return None
    try:
        return subprocess.Popen(
            [cat],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=fds,
            close_fds=True,
            env={},
        )
    except OSError:
        return None


def _os_close_status(fd: int) -> int:
    try:
        os.close(fd)
    except OSError:
        return -1
    return 0
