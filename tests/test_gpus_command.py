"""`gpuguard gpus`: tables and JSON over the samplers, with no GPU, a faked NVIDIA GPU, and --watch."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from gpuguard.commands import gpus
from tests.fakes.fake_pynvml import MIB, FakeGpu, FakeNvml, FakeProcess

HOSTILE_COMM = "\x1b]0;pwn\x07[red]x"  # retitles a terminal; [red] is rich markup


def run_gpus(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    gpus.add_arguments(parser)
    return gpus.run(parser.parse_args(list(argv)))


@pytest.fixture
def hostile_process():
    code = f"open('/proc/self/comm', 'w').write({HOSTILE_COMM!r}); print('ok', flush=True); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ok"
    yield child.pid
    child.kill()
    child.wait()


@pytest.fixture
def fake_nvidia(monkeypatch, hostile_process):
    gpu = FakeGpu(
        util_gpu=99,
        memory_used=70_000 * MIB,
        power_mw=690_000,
        sm_clock=1980,
        compute=[FakeProcess(hostile_process, 69_000 * MIB)],
        util_samples=[(hostile_process, int(time.time() * 1e6), 99, 71, 0, 0)],
    )
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


@pytest.mark.skipif(os.path.exists("/sys/class/drm"), reason="this machine has DRM devices")
def test_no_gpu_says_which_sources_were_tried_and_exits_0(capsys):
    assert run_gpus() == 0
    out = capsys.readouterr().out
    assert out.startswith("No GPU found. Sources tried:\n")
    assert "NVML not available: library not found" in out
    assert "amdsmi not available: libamd_smi.so not found" in out
    assert "DRM fdinfo not available: no DRM device" in out
    assert "GPUs" in out and "Processes" in out  # the (empty) tables

    assert run_gpus("--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"] == [] and doc["processes"] == [] and doc["sources"] == []
    assert [line.split(":")[0] for line in doc["unavailable"]] == [
        "NVML not available",
        "amdsmi not available",
        "DRM fdinfo not available",
    ]


def test_table_attributes_processes_and_escapes_their_names(fake_nvidia, hostile_process, capsys):
    assert run_gpus("--source", "nvml") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;pwn\\x07[red]x" in out  # shown escaped, markup not interpreted
    assert "NVIDIA H100 80GB HBM3" in out and "99% / 0%" in out
    assert "70,000 MiB / 81,559 MiB" in out and "690 W / 700 W" in out
    row = next(line for line in out.splitlines() if f" {hostile_process} " in line)
    assert "nvml:0" in row and "69,000 MiB" in row and "99% / 71%" in row and "compute" in row
    assert "root" in row or str(os.getuid()) in row


def test_json_carries_exact_values_and_labels(fake_nvidia, hostile_process, capsys):
    assert run_gpus("--json", "--source", "nvml") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sources"] == ["nvml"] and doc["unavailable"] == [] and doc["errors"] == []
    (dev,) = doc["devices"]
    assert (
        dev["source"] == "nvml" and dev["gpu_util"] == 99.0 and dev["memory_total"] == 81_559 * MIB
    )
    (proc,) = doc["processes"]
    assert proc["pid"] == hostile_process and proc["name"] == HOSTILE_COMM
    assert (
        proc["used_memory"] == 69_000 * MIB
        and proc["sm_util"] == 99.0
        and proc["kind"] == "compute"
    )
    assert proc["exe"] == os.path.realpath(sys.executable) and proc["container"] == ""


def test_watch_prints_one_json_line_per_sample_and_ctrl_c_exits_cleanly(
    fake_nvidia, monkeypatch, capsys
):
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(gpus.time, "sleep", sleep)
    assert run_gpus("--json", "--watch", "0.5", "--source", "nvml") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # first view + two refreshes before Ctrl-C
    assert all(json.loads(line)["devices"][0]["gpu_util"] == 99.0 for line in lines)
    assert fake_nvidia.initialized is False  # NVML shut down on the way out
