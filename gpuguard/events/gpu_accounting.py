"""What a GPU driver remembers about a process's whole life on a GPU (NVML accounting mode).

With accounting on (``nvidia-smi -am 1``), NVML keeps for each pid that used a
GPU its lifetime average GPU and memory-controller utilisation, peak memory,
start time and duration, also after the process exited (4,000 pids on an
H100).  ``gpuguard scan`` reads it to give a one-shot audit a history, and to
show GPU users that are already gone.  Not part of recordings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class GpuAccounting:
    pid: int  # host pid (it may have been reused since, if not running)
    vendor: str
    device_index: int
    device_uuid: str | None
    gpu_util: float | None  # lifetime average %, start-up included
    mem_util: float | None  # lifetime average memory-controller %
    max_memory: int | None  # bytes
    start_time: float | None  # seconds since the epoch
    duration_s: float | None
    running: bool
