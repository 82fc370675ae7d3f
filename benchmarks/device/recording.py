"""The check's recordings, in the format of tests/traces/h100, so tests can replay them later.

``NAME.gpus.jsonl``: what ``gpuguard gpus --watch 1 --json`` prints, one line a second (the
same functions make each line); ``idle.gpus.json``: one ``gpuguard gpus --json`` view;
``NAME.launch.ioctl.gz`` / ``NAME.steady.ioctl.gz`` / ``NAME.fds``: tracefs_ioctls.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpuguard.commands.gpus import first_view, live_labels
from gpuguard.outputs.gpu_table import GpuView, view_to_json
from gpuguard.outputs.jsonl import dumps_line

README = """\
# GPU recordings from benchmarks/device_check.sh

{origin}

The format of tests/traces/h100 (see its README.md):

| file | what |
|---|---|
| `idle.gpus.json` | one `gpuguard gpus --json` view with nothing of the check running |
| `NAME.gpus.jsonl` | one `gpus --watch 1 --json` line a second while workload NAME ran |
| `NAME.launch.ioctl.gz` | every `ioctl(2)` on the host in the workload's first {launch_s:g} s, \
from the kernel's `syscalls:sys_enter_ioctl` event (a tracefs instance of its own, monotonic clock) |
| `NAME.steady.ioctl.gz` | the same for {steady_s:g} s from {steady_at_s:g} s after its start |
| `NAME.fds` | `ls -l /proc/PID/fd` of the workload, GPU files only, when the steady capture started |

Workloads (benchmarks/device/cuda_workload.py, through libcuda by ctypes, no framework):
- **miner-like**: a hashing-loop kernel (2,112 blocks x 256 threads, ~50 ms a launch), an
  80-byte job in and 8 bytes out per launch, a stratum session to a loopback pool on
  127.0.0.1 (jobs pushed, a share about every 15 s).
- **training-like**: 1 GiB weights, a 512 MiB batch in each step from page-locked memory,
  32 axpy passes a step, 2 s bursts with 0.7 s pauses, a checkpoint out every fourth burst, a
  c10d-like session (a store handshake, an 8 MiB all-reduce each step) on 127.0.0.1.

summary.json beside this folder holds what the check measured and judged.
"""


class GpuRecorder(threading.Thread):
    """``gpus --watch 1 --json`` into ``path`` until :meth:`finish`."""

    def __init__(self, samplers: list, unavailable: list[str], path: Path) -> None:
        super().__init__(daemon=True)
        self.samplers, self.unavailable, self.path = samplers, unavailable, path
        self.stop = threading.Event()
        self.lines = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with open(self.path, "w") as out:
                out.write(dumps_line(view_to_json(self.view(first=True))) + "\n")
                self.lines += 1
                next_due = time.monotonic() + 1.0
                while not self.stop.wait(max(0.0, next_due - time.monotonic())):
                    next_due += 1.0
                    out.write(dumps_line(view_to_json(self.view())) + "\n")
                    out.flush()
                    self.lines += 1
        except Exception as exc:  # noqa: BLE001 - a recorder fault is reported, not raised
            self.error = f"{type(exc).__name__}: {exc}"

    def view(self, first: bool = False) -> GpuView:
        if first:
            return first_view(self.samplers, self.unavailable, "/proc")
        snapshots = [s.sample() for s in self.samplers]
        return GpuView(time.time(), snapshots, live_labels(snapshots, "/proc"), self.unavailable)

    def finish(self) -> None:
        self.stop.set()
        self.join(10)
