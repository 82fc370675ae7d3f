"""Replay of recorded GPU telemetry: the sampler and `gpuguard gpus --replay`, end to end."""

from __future__ import annotations

import argparse
import json

import pytest

from gpuguard.commands import gpus
from gpuguard.errors import GpuguardError
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import GpuOpen
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.wire_write import RecordingWriter
from gpuguard.sources.gpu.replay import EndOfRecording, ReplaySampler

MIB = 1024 * 1024
T0 = 1_750_000_000.0
CONTAINER = "3f2a1b4c5d6e" + "0" * 52


def snapshot(t: float, util: float, source: str = "nvml") -> GpuSnapshot:
    return GpuSnapshot(
        time=t,
        source=source,
        devices=[
            DeviceSample(
                vendor="nvidia",
                index=0,
                name="NVIDIA H100 80GB HBM3",
                uuid="GPU-1",
                gpu_util=util,
                memory_used=76_000 * MIB,
                memory_total=81_559 * MIB,
                power_w=690.0,
            )
        ],
        processes=[
            ProcessGpuUsage(
                pid=4242,
                vendor="nvidia",
                device_index=0,
                device_uuid="GPU-1",
                ns_pid=7,
                sm_util=util,
                used_memory=75_000 * MIB,
                kind="compute",
            )
        ],
        errors=["nvml gpu0 mig_mode: Not Supported"] if t == T0 else [],
    )


@pytest.fixture
def recording(tmp_path):
    path = tmp_path / "trace.ggr"
    with RecordingWriter(path, meta={"test": "gpu replay"}) as writer:
        writer.write(
            ProcessFacts(
                pid=4242,
                start_time=T0 - 60,
                comm="kworker/0:1",
                exe="/tmp/.x/xmrig",
                username="www-data",
                uid=33,
                container_runtime="docker",
                container_id=CONTAINER,
            )
        )
        writer.write(snapshot(T0, 97.0))
        writer.write(GpuOpen(time=T0 + 0.5, pid=4242, comm="kworker/0:1", path="/dev/nvidia0"))
        writer.write(snapshot(T0 + 1, 98.0))
        writer.write(snapshot(T0 + 3, 99.0))
    return path


def test_snapshots_come_back_in_order_then_the_end_is_signalled(recording):
    sampler = ReplaySampler(str(recording))
    got = [sampler.sample() for _ in range(3)]
    assert [s.time for s in got] == [T0, T0 + 1, T0 + 3]
    assert got[0] == snapshot(T0, 97.0)  # every field survives the round trip
    assert [s.devices[0].gpu_util for s in got] == [97.0, 98.0, 99.0]
    assert sampler.process_facts[4242].exe == "/tmp/.x/xmrig"
    with pytest.raises(EndOfRecording):
        sampler.sample()
    assert sampler.finished
    with pytest.raises(EndOfRecording):
        sampler.sample()


def test_pacing_follows_recorded_time(recording):
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(round(seconds, 6))
        now[0] += seconds

    sampler = ReplaySampler(str(recording), pace=True, sleep=sleep, monotonic=lambda: now[0])
    assert len(list(sampler)) == 3
    assert sleeps == [1.0, 2.0]


def test_missing_and_damaged_recordings_are_user_errors(recording, tmp_path):
    with pytest.raises(GpuguardError, match="not found"):
        ReplaySampler(str(tmp_path / "nope.ggr"))
    data = recording.read_bytes()
    cut = tmp_path / "cut.ggr"
    cut.write_bytes(data[: len(data) - 40])  # the last snapshot and the end marker damaged
    sampler = ReplaySampler(str(cut))
    seen = []
    with pytest.raises(GpuguardError):
        for snap in sampler:
            seen.append(snap.time)
    assert seen[:2] == [T0, T0 + 1]


def run_gpus(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    gpus.add_arguments(parser)
    return gpus.run(parser.parse_args(list(argv)))


def test_gpus_replay_json_lines_with_recorded_process_facts(recording, capsys):
    assert run_gpus("--replay", str(recording), "--json") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [doc["time"] for doc in lines] == [T0, T0 + 1, T0 + 3]
    assert lines[0]["errors"] == ["nvml gpu0 mig_mode: Not Supported"] and lines[1]["errors"] == []
    proc = lines[2]["processes"][0]
    assert (proc["pid"], proc["ns_pid"], proc["name"], proc["exe"]) == (
        4242,
        7,
        "kworker/0:1",
        "/tmp/.x/xmrig",
    )
    assert proc["user"] == "www-data" and proc["container"] == "docker:3f2a1b4c5d6e"
    assert proc["source"] == "nvml" and proc["used_memory"] == 75_000 * MIB


def test_gpus_replay_tables(recording, capsys):
    assert run_gpus("--replay", str(recording)) == 0
    out = capsys.readouterr().out
    assert out.count("NVIDIA H100 80GB HBM3") == 3
    row = next(line for line in out.splitlines() if "/tmp/.x/xmrig" in line)
    assert (
        "4242" in row and "www-data" in row and "docker:3f2a1b4c5d6e" in row and "75,000 MiB" in row
    )
