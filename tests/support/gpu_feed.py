"""A busy GPU fed to a correlator as NVML snapshots, five seconds apart."""

from __future__ import annotations

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage

T = 1_795_305_600.0  # the session tests' clock (tests/test_sessions.py, tests/test_tcp_sessions.py)


def feed_busy_gpu(c, pid, seconds=300):
    for i in range(0, seconds, 5):
        c.feed(
            GpuSnapshot(
                time=T + i,
                source="nvml",
                devices=[DeviceSample("nvidia", 0, memory_total=80 << 30)],
                processes=[ProcessGpuUsage(pid, "nvidia", 0, sm_util=99.0, used_memory=520 << 20)],
            )
        )
