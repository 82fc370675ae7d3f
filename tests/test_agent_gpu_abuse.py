"""GPU abuse that is not mining, through a real agent run: the per-process rules reach the log.

* ``gpu-raw-bar-access``: a real process opens ``/dev/mem`` (a private /dev,
  null-backed node, seen by the eBPF sensor); the agent's finding names the
  device and the holder, although the rule alone stays below the alert
  threshold (rules tagged ``gpu-abuse`` are written as notes);
* ``gpu-memory-hog``: a real process holds 70 GiB of a shared H100 (fake NVML)
  at 1 % SM while another works.  The rule needs two minutes of samples; the
  sampler's clock steps 5 s per sample, so the correlator sees them in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.pipeline import Agent
from gpuguard.sources.gpu import nvml
from tests.fakes.fake_pynvml import MIB, FakeGpu, FakeNvml, FakeProcess
from tests.support.agent_run import log_records, until
from tests.support.workloads import run_with_gpu_nodes

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

GIB = 1024 * MIB


def _finding_for(log: Path, pid: int, rule: str) -> dict | None:
    for doc in log_records(log):
        mine = doc.get("gpuguard", {})
        if (
            mine.get("kind") == "process"
            and doc.get("process", {}).get("pid") == pid
            and rule in mine["rule_ids"]
        ):
            return doc
    return None


def _start(agent: Agent) -> threading.Thread:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    until(lambda: agent.ready.is_set() or not thread.is_alive(), 120)
    assert agent.ready.is_set(), "the agent did not start"
    return thread


def _stop(agent: Agent, thread: threading.Thread) -> None:
    agent.request_stop()
    thread.join(30)
    assert not thread.is_alive()


HOLDER = "import os, sys; fd = os.open('/dev/mem', os.O_RDWR); print('ready', flush=True); sys.stdin.readline()"


def test_raw_dev_mem_access_is_reported_with_device_and_holder(tmp_path):
    """An ordinary interpreter (not in a temp dir, no other evidence) opens /dev/mem: the rule alone
    is below the alert threshold, and the agent still writes it, as a note."""
    log = tmp_path / "agent.log"
    config = AgentConfig(
        sensor="ebpf",
        log_path=str(log),
        status_path=tmp_path / "status.json",
        status_interval_s=0.5,
        gpu_sources=[],
    )
    agent = Agent(config, install_signals=False, stderr=lambda line: None, sampler_openers={})
    thread = _start(agent)
    try:
        proc = run_with_gpu_nodes([sys.executable, "-c", HOLDER])
        try:
            assert proc.stdout.readline() == b"ready\n"
            found = until(lambda: _finding_for(log, proc.pid, "gpu-raw-bar-access"))
        finally:
            proc.communicate(b"go\n", timeout=10)
    finally:
        _stop(agent, thread)
    raw = next(e for e in found["gpuguard"]["evidence"] if e["rule_id"] == "gpu-raw-bar-access")
    assert "gpu_paths=/dev/mem" in raw["detail"]  # the device
    assert found["process"]["executable"] == os.path.realpath(sys.executable)  # the holder
    assert found["process"]["args"][:2] == [sys.executable, "-c"]
    assert (found["gpuguard"]["verdict"], found["event"]["kind"]) == (
        "clean",
        "event",
    )  # a note, not a page
    assert found["gpuguard"]["rule_ids"] == ["gpu-raw-bar-access"]


class SteppingClock:
    """The sampler's clock: 5 s per call, and the driver's per-process samples at each step."""

    def __init__(self, gpu: FakeGpu, work: dict[int, int]) -> None:
        self.gpu, self.work = gpu, work
        self.now = time.time()

    def __call__(self) -> float:
        self.now += 5.0
        stamp = int(self.now * 1e6) - 100_000
        self.gpu.util_samples = [(pid, stamp, sm, 0, 0, 0) for pid, sm in self.work.items()]
        return self.now


def test_a_memory_hog_on_a_shared_gpu_is_reported(tmp_path):
    hog = subprocess.Popen(["sleep", "600"])
    worker = subprocess.Popen(["sleep", "600"])
    try:
        gpu = FakeGpu(
            memory_used=74 * GIB + 480 * MIB,
            compute=[FakeProcess(hog.pid, 70 * GIB), FakeProcess(worker.pid, 4 * GIB)],
        )
        fake = FakeNvml([gpu])
        clock = SteppingClock(gpu, {hog.pid: 1, worker.pid: 60})
        log = tmp_path / "agent.log"
        config = AgentConfig(
            sensor="proc",
            log_path=str(log),
            status_path=tmp_path / "status.json",
            sample_interval_s=0.1,
            sweep_interval_s=0.5,
            status_interval_s=0.5,
        )
        agent = Agent(
            config,
            install_signals=False,
            stderr=lambda line: None,
            sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module, clock=clock)},
        )
        thread = _start(agent)
        try:
            found = until(lambda: _finding_for(log, hog.pid, "gpu-memory-hog"))
        finally:
            _stop(agent, thread)
        assert found["gpuguard"]["verdict"] == "suspicious" and found["event"]["kind"] == "alert"
        assert found["gpuguard"]["gpu"]["memory_used"] == 70 * GIB
        assert (
            _finding_for(log, worker.pid, "gpu-memory-hog") is None
        )  # the one doing the work is not a hog
    finally:
        for p in (hog, worker):
            p.kill()
            p.wait()
