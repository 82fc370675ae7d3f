"""The one interface every GPU telemetry source implements (registry.py lists and opens them).

A sampler is opened once, then ``sample()`` is called at a steady rate (1 Hz in
the agent).  A source that cannot work here (no library, no driver, no GPU)
raises :class:`SourceUnavailable` from its ``open`` and is reported once, in one
line with the cause and the fix; the others keep working.  After a sampler is
open it never raises from ``sample()``: a metric it cannot read is ``None`` and
a line in ``GpuSnapshot.errors``.  (The one exception is the replay sampler,
which raises ``EndOfRecording`` after the last recorded snapshot.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gpuguard.errors import GpuguardError
from gpuguard.events.gpu_snapshot import GpuSnapshot


@runtime_checkable
class GpuSampler(Protocol):
    """A source of :class:`GpuSnapshot`; ``sample()`` never raises once opened."""

    source: str

    def sample(self) -> GpuSnapshot: ...

    def close(self) -> None: ...


class SourceUnavailable(GpuguardError):
    """This telemetry source cannot work on this machine (cause + fix); ``absent``: the host has
    no GPU it reads (a missing NVIDIA library on a host without NVIDIA GPUs is no fault).
    ``hardware_same``, for an absent source: whether the devices that decided it are still the
    ones listed then (a cheap look, so a retry waits for hardware that may have appeared)."""

    def __init__(
        self,
        cause: str,
        fix: str = "",
        absent: bool = False,
        hardware_same: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(cause, fix)
        self.absent = absent
        self.hardware_same = hardware_same


class OnceErrors:
    """Error lines reported once per (device, field) until that part works again.

    Sampling at 1 Hz must not repeat "power: not supported" every second; a
    field that recovers and later fails again is reported again.
    """

    def __init__(self) -> None:
        self._active: dict[tuple[object, str], str] = {}

    def report(self, errors: list[str], device: object, field: str, line: str) -> None:
        key = (device, field)
        if self._active.get(key) != line:
            self._active[key] = line
            errors.append(line)

    def clear(self, device: object, field: str) -> None:
        self._active.pop((device, field), None)
