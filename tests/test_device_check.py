"""benchmarks/device_check.sh --dry-run: the GPU machine's check, run here over the fakes, so it
cannot rot between the rare runs on a GPU.

The dry run starts real processes (a stand-in libcuda replaying the H100's start-up ioctls on
GPU-named nodes, a stratum session to a loopback pool, a c10d-like session), the agent (with
the probes when they load), a tracefs instance and pod cgroups; only NVML and libcuda are
stand-ins.  This test checks the summary it writes, its files and its time budget, and that it
left nothing behind.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from gpuguard.respond.cgroup_blocks import cgroup2_mount

# a miner-shaped stand-in, an agent; run by .ci/run as a step of its own (pytest --device-check)
pytestmark = [pytest.mark.root, pytest.mark.host_mutator, pytest.mark.device_check]

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "device_check.sh"
SECTIONS = [
    "setup",
    "environment",
    "gpu_tests",
    "sampler_cost",
    "idle_view",
    "agent",
    "miner-like",
    "training-like",
    "files",
]
TRACE_FILES = {"gpus.jsonl", "launch.ioctl.gz", "steady.ioctl.gz", "fds"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check")
    started = time.monotonic()
    run = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    wall = time.monotonic() - started
    summary_path = out / "summary.json"
    assert summary_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    return run, wall, json.loads(summary_path.read_text()), out


def test_the_dry_run_passes_within_its_budget(dry_run):
    run, wall, summary, _ = dry_run
    failing = {k: v for k, v in summary["sections"].items() if v["status"] != "ok"}
    assert run.returncode == 0 and summary["ok"] is True, (failing, run.stderr[-3000:])
    assert summary["format"] == "gpuguard-device-check/1" and summary["mode"] == "dry-run"
    assert list(summary["sections"]) == SECTIONS
    assert summary["within_budget"] is True and summary["wall_s"] <= summary["budget_s"] <= 480
    assert wall <= summary["budget_s"] + 60, wall  # the script's own start and end included


def test_the_summary_says_honestly_what_was_real(dry_run):
    _, _, summary, _ = dry_run
    sensor = summary["sections"]["agent"]["sensor"]["mode"]
    assert summary["real"] == {"nvml": False, "cuda": False, "sensor": sensor}
    assert sensor in ("ebpf", "proc")
    stand_ins = summary["sections"]["setup"]["stand_ins"]
    assert "fake pynvml" in stand_ins["nvml"] and "no GPU work" in stand_ins["libcuda"]
    assert summary["sections"]["gpu_tests"]["nvml"] == "fake"
    for name in ("miner-like", "training-like"):
        assert summary["sections"][name]["cuda"]["cuda"]["device"] == "stand-in (no GPU)"


def test_each_section_carries_its_measurements(dry_run):
    _, _, summary, _ = dry_run
    sections = summary["sections"]
    env = sections["environment"]
    assert env["host"]["kernel"] and env["nvml"]["gpu_count"] == 1
    assert env["packages"]["nvidia-ml-py"]["locked"] and "can_load" in env["probes"]
    tests = sections["gpu_tests"]
    assert tests["passed"] >= 5 and tests["failed"] == tests["errors"] == 0, tests
    cost = sections["sampler_cost"]["idle"]
    assert cost["gpus"] == 1 and cost["goal_ms"] == 2.0 and cost["per_gpu_ms"] > 0
    assert cost["calls"]["nvmlDeviceGetUtilizationRates"]["per_sample"] == 1.0
    assert "nvmlDeviceGetPcieThroughput" not in cost["calls"]  # the 20 ms call stays off
    for name in ("miner-like", "training-like"):
        workload = sections[name]
        assert workload["pid"] > 0 and workload["expectations"], name
        assert all({"what", "ok", "got"} <= set(e) for e in workload["expectations"])
        assert all(e["ok"] is not False for e in workload["expectations"]), workload["expectations"]
        launch = workload["ioctls"]["launch"]
        # the stand-in replays the H100's start-up on GPU-named nodes: tracefs saw it, decoded
        assert (
            launch["ioctls"]["gpu"] > 400
            and launch["by_name"]["nvidia-ctl NV_ESC_RM_CONTROL"] > 100
        )
        first = workload["agent"]["first_s"]
        assert {"known", "gpu_samples", "process_series", "pod_series"} <= set(first), first
    miner = sections["miner-like"]
    assert miner["peer"]["shares"] >= 1 and "mining.subscribe" in miner["peer"]["methods"]
    assert miner["sampler_cost_busy"]["processes"] == 1
    assert sections["training-like"]["peer"]["all_reduces"] >= 1


def test_the_traces_replay_in_the_h100_format(dry_run):
    _, _, summary, out = dry_run
    assert summary["files"] == ["summary.json", "check.log", "traces.tar.gz", "logs.tar.gz"]
    assert sorted(p.name for p in out.iterdir()) == sorted(summary["files"])  # <= 8 come back
    with tarfile.open(out / "traces.tar.gz") as tar:
        files = {
            Path(m.name).name: tar.extractfile(m).read()
            for m in tar.getmembers()
            if m.isfile() and Path(m.name).parent.name == "device-traces"
        }
    assert {"README.md", "idle.gpus.json"} <= set(files)
    for name in ("miner-like", "training-like"):
        assert {f"{name}.{suffix}" for suffix in TRACE_FILES} <= set(files)
        pid = summary["sections"][name]["pid"]
        lines = [json.loads(x) for x in files[f"{name}.gpus.jsonl"].decode().splitlines()]
        assert lines and all(line["devices"] for line in lines)
        assert any(p["pid"] == pid for line in lines for p in line["processes"])
        launch = gzip.decompress(files[f"{name}.launch.ioctl.gz"]).decode().splitlines()
        mine = [line for line in launch if f"-{pid} " in line]
        assert mine and all(": sys_ioctl(fd: " in line for line in mine)
        fds = files[f"{name}.fds"].decode().splitlines()
        assert fds and all(line.startswith(f"{pid} ") and " -> /dev/nvidia" in line for line in fds)


def test_it_leaves_nothing_behind(dry_run):
    _, _, summary, _ = dry_run
    pid = summary["check_pid"]
    for tracefs in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        assert not list((tracefs / "instances").glob(f"gg-devcheck-*-{pid}"))
    assert not list(Path(cgroup2_mount()).glob(f"gg-devcheck-{pid}-*"))
