"""Ending a process a test started: SIGTERM, a wait, then SIGKILL if it did not go."""

from __future__ import annotations

import subprocess


def terminate(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM ``proc`` (by its Popen: no pid reuse), wait ``timeout`` s, then kill and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
