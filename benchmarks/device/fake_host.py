"""The dry run's GPU machine, on a host without a GPU: only the vendor libraries are stand-ins.

* NVML: the fake ``pynvml`` (tests/fakes) holding the traced H100, playing its recordings a
  second at a time (tests/fakes/h100_replay.py): at rest, or the recording of the workload
  running, under the real pid of the process the check started.
* libcuda: fake_libcuda.c, built here with gcc.  Its cuInit replays the CUDA start-up ioctls
  the H100 recorded for that workload (tests/traces/h100/*.launch.ioctl.gz, files from the
  matching ``.fds``) on null-device nodes named like the GPU's, in a private /dev
  (tests/support/workloads.py), so tracefs, the probes and /proc see GPU files and ioctls.

The workload processes, the pool and peer sessions, the agent, tracefs and cgroups are real.
"""

from __future__ import annotations

import gzip
import threading
from pathlib import Path
from types import ModuleType

from tracefs_ioctls import parse

from tests.fakes.fake_pynvml import FakeNvml
from tests.fakes.h100_replay import TRACES, TraceFeed, driver_version, idle_gpu
from tests.support.workloads import GPU_NODES, build_c_program, private_dev_command

HERE = Path(__file__).resolve().parent
# shape -> (recording, the recorded workload's comm)
RECORDINGS = {"hash": ("hashing-loop", "xmrig-cuda"), "train": ("cnn-training", "python3")}
NODES = (*GPU_NODES, "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")
KERNEL_MS = {"hash": 50, "train": 2}  # the stand-in's time per synchronize


def startup_ioctls(recording: str, comm: str) -> list[tuple[str, int]]:
    """(path, command) of each ioctl the recorded workload made while CUDA started, in order."""
    fds: dict[int, str] = {}
    main_pid = None
    for line in (TRACES / f"{recording}.fds").read_text().splitlines():
        pid, *_, fd, _, path = line.split()
        main_pid = main_pid or pid
        if pid == main_pid:
            fds[int(fd)] = path
    out = []
    with gzip.open(TRACES / f"{recording}.launch.ioctl.gz", "rt") as f:
        for line in f:
            parsed = parse(line)
            if parsed and parsed[0] == comm and parsed[3] in fds and fds[parsed[3]] in NODES:
                out.append((fds[parsed[3]], parsed[4]))
    return out


class FakeGpuHost:
    def __init__(self, workdir: Path) -> None:
        self.gpu = idle_gpu()
        self.feed = TraceFeed(self.gpu, "idle", None)
        self.feed.step()
        self.libcuda = build_c_program(
            HERE / "fake_libcuda.c", workdir, ("-shared", "-fPIC", "-Wextra")
        )
        self.scripts: dict[str, Path] = {}
        for shape, (recording, comm) in RECORDINGS.items():
            script = workdir / f"{recording}.startup-ioctls"
            script.write_text("".join(f"{p} 0x{c:x}\n" for p, c in startup_ioctls(recording, comm)))
            self.scripts[shape] = script
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def describe(self) -> dict:
        return {
            "nvml": "fake pynvml (tests/fakes/fake_pynvml.py) playing tests/traces/h100",
            "libcuda": f"stand-in {self.libcuda.name} (benchmarks/device/fake_libcuda.c): "
            "no GPU work; cuInit replays the recorded H100 start-up ioctls on null nodes",
            "startup_ioctls": {s: len(p.read_text().splitlines()) for s, p in self.scripts.items()},
        }

    def library(self) -> ModuleType:
        """A fake pynvml for one more user (its own init state, the same GPU)."""
        return FakeNvml([self.gpu], driver_version=driver_version()).module

    def play(self, shape: str, pid: int) -> None:
        feed = TraceFeed(self.gpu, RECORDINGS[shape][0], pid)
        while not feed.step()["processes"]:  # the recording starts before its workload
            pass
        self.feed = feed

    def rest(self) -> None:
        self.feed = TraceFeed(self.gpu, "idle", None)
        self.feed.step()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self.feed.step()

    def command(self, argv: list[str], shape: str) -> tuple[list[str], dict[str, str]]:
        """``argv`` in a private /dev of GPU-named null nodes, with the stand-in libcuda."""
        command, env = private_dev_command(argv, NODES)
        env.update(
            GG_LIBCUDA=str(self.libcuda),
            GG_FAKE_CUDA_IOCTLS=str(self.scripts[shape]),
            GG_FAKE_CUDA_KERNEL_MS=str(KERNEL_MS[shape]),
        )
        return command, env

    def close(self) -> None:
        self._stop.set()
