"""The NVML a ``gpu``-marked test runs against: the fake, or the real one when asked for.

By default a test gets the fake ``pynvml`` (tests/fakes/fake_pynvml.py) holding the H100 of the
recordings (tests/fakes/h100_replay.py).  With ``GPUGUARD_REAL_NVML=1`` (the device check,
benchmarks/device_check.sh, sets it on a GPU machine) it gets the real ``pynvml`` and the real
driver; when NVML cannot start there the test fails, naming why: a check that asked for the
real GPU never passes on the fake.

A test written for both asserts what holds on any NVIDIA GPU (units, ranges, the process it
started being listed), never a value only the fake holds.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.fake_pynvml import FakeGpu, FakeNvml
from tests.fakes.h100_replay import TraceFeed, driver_version, idle_gpu
from tests.support.processes import terminate

REAL_NVML = "GPUGUARD_REAL_NVML"
REPO = Path(__file__).resolve().parent.parent.parent
CUDA_WORKLOAD = REPO / "benchmarks" / "device" / "cuda_workload.py"
START_S = 90.0  # a CUDA start-up (context, PTX compiled by the driver) on a cold GPU


def real_nvml_wanted() -> bool:
    return os.environ.get(REAL_NVML, "") not in ("", "0")


@dataclass
class NvmlUnderTest:
    """The library handed to the adapter, and how to move time on for it."""

    module: ModuleType
    real: bool
    gpu: FakeGpu | None = None  # the fake's one GPU (None on the real NVML)
    feed: TraceFeed | None = None  # what the fake GPU plays: the H100 at rest, or a workload

    def library(self) -> ModuleType:
        """A module for one more NVML user: the real one is shared (the driver counts its
        inits); each fake user gets its own init state over the same GPU."""
        if self.real:
            return self.module
        return FakeNvml([self.gpu], driver_version=driver_version()).module

    def tick(self, seconds: float = 1.0) -> None:
        """Let ``seconds`` pass: the real GPU moves by itself, the fake plays one more
        recorded second."""
        time.sleep(seconds)
        if self.feed is not None:
            self.feed.step()


def open_nvml() -> NvmlUnderTest:
    if not real_nvml_wanted():
        gpu = idle_gpu()
        module = FakeNvml([gpu], driver_version=driver_version()).module
        return NvmlUnderTest(module, False, gpu, TraceFeed(gpu, "idle", None))
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.fail(f"{REAL_NVML}=1 asks for the real NVML, but nvmlInit failed: {exc}")
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.fail(f"{REAL_NVML}=1 asks for the real NVML, but it sees no GPU")
    return NvmlUnderTest(pynvml, True)


@dataclass
class GpuProcess:
    pid: int
    comm: str
    proc: subprocess.Popen


def start_gpu_process(nvml: NvmlUnderTest) -> GpuProcess:
    """A process that uses the GPU: on the real NVML a CUDA hashing loop (the device check's
    workload, loaded through libcuda); on the fake a real idle process the fake lists, with the
    H100 hashing loop's recorded figures."""
    if not nvml.real:
        proc = subprocess.Popen(["sleep", "600"])
        nvml.feed = TraceFeed(nvml.gpu, "hashing-loop", proc.pid)
        while not nvml.feed.step()["processes"]:  # the recording starts before the workload
            pass
        return GpuProcess(proc.pid, "sleep", proc)
    proc = subprocess.Popen(
        [sys.executable, str(CUDA_WORKLOAD), "hash", "--seconds", "120"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + START_S
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        if not select.select([proc.stdout], [], [], 1.0)[0]:
            continue
        line = proc.stdout.readline()
        if '"event": "running"' in line:
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            return GpuProcess(proc.pid, comm, proc)
        if '"event": "error"' in line:
            break
    stop_gpu_process(GpuProcess(proc.pid, "", proc))
    pytest.fail(f"the CUDA workload did not start: {line.strip()} {proc.stderr.read()[-2000:]}")


def stop_gpu_process(process: GpuProcess) -> None:
    terminate(process.proc)
