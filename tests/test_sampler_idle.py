"""A GPU sampler over idle, unchanged GPUs samples less often, and is back at its full rate at
once when a GPU device is opened or a GPU gets busy.

The sampler thread runs for real over the NVML adapter and the faithful fake ``pynvml`` (two
idle H100s, values as NVML reports them); only the GPU library is a stand-in.
"""

from __future__ import annotations

import threading
import time

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.stages.s1_produce.producers import (
    IDLE_FACTOR,
    QUIET_SAMPLES,
    SamplerThread,
    SensorThread,
)
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import Exit, GpuOpen
from gpuguard.sources.gpu import nvml
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml

INTERVAL_S = 0.05


def _sampler(fake: FakeNvml, interval: float = INTERVAL_S) -> tuple[SamplerThread, threading.Event]:
    stop = threading.Event()
    thread = SamplerThread(
        "nvml",
        lambda: nvml.open_sampler(library=fake.module),
        BoundedQueue(10_000),
        AgentCounters(),
        stop,
        emit=lambda line: None,
        interval=interval,
    )
    thread.start()
    return thread, stop


def _samples_in(thread: SamplerThread, seconds: float) -> int:
    before = thread.counters.samples["nvml"]
    time.sleep(seconds)
    return thread.counters.samples["nvml"] - before


def _two_idle_h100s() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(),
            FakeGpu(bus_id="00000000:2A:00.0", uuid="GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c02"),
        ]
    )


def test_idle_unchanged_gpus_are_sampled_less_often_and_a_busy_one_at_the_full_rate():
    fake = _two_idle_h100s()
    thread, stop = _sampler(fake)
    try:
        time.sleep(INTERVAL_S * (QUIET_SAMPLES + 3))  # past the quiet samples: the idle rate
        idle = _samples_in(thread, 1.0)
        assert thread.quiet_samples >= QUIET_SAMPLES
        # a full rate gives ~20 in a second; the idle rate ~5 (a slow host gives fewer still)
        assert idle <= 1.0 / (INTERVAL_S * IDLE_FACTOR) + 2, idle
        fake.gpus[0].util_gpu = 97  # a kernel runs: every sample differs from idle
        time.sleep(INTERVAL_S * IDLE_FACTOR * 2)
        busy = _samples_in(thread, 1.0)
        assert busy > idle + 4, (busy, idle)
        assert thread.quiet_samples == 0
    finally:
        stop.set()
        thread.wake.set()
        thread.join(5)
    assert not thread.is_alive()


def test_a_gpu_open_brings_an_idle_sampler_back_at_once():
    fake = _two_idle_h100s()
    thread, stop = _sampler(fake, interval=0.5)  # idle: a sample every 2 s
    try:
        deadline = time.monotonic() + 10
        while thread.quiet_samples < QUIET_SAMPLES and time.monotonic() < deadline:
            time.sleep(0.05)
        assert thread.quiet_samples >= QUIET_SAMPLES
        time.sleep(0.1)  # just after an idle-rate sample: the next one is ~1.9 s away
        before = thread.counters.samples["nvml"]
        gpu_open = GpuOpen(time=time.time(), pid=4242, comm="miner", path="/dev/nvidia0")
        feeder = SensorThread(
            sensor=None,
            intake=BoundedQueue(100),
            counters=AgentCounters(),
            stop=threading.Event(),
            emit=lambda line: None,
            on_gpu_open=thread.nudge,
            stall_s=AgentConfig().health_stall_s,
        )
        feeder._queue([Exit(time=time.time(), pid=1234, comm="sh"), gpu_open])
        deadline = time.monotonic() + 1.0
        while thread.counters.samples["nvml"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.counters.samples["nvml"] > before  # sampled within 1 s, not ~2 s
        assert thread.quiet_samples < QUIET_SAMPLES
    finally:
        stop.set()
        thread.wake.set()
        thread.join(5)


def test_a_nudge_at_the_full_rate_is_no_extra_sample():
    fake = _two_idle_h100s()
    fake.gpus[0].util_gpu = 50
    thread, stop = _sampler(fake, interval=0.5)
    try:
        time.sleep(0.2)
        for _ in range(50):  # a burst of GPU opens
            thread.nudge()
        assert not thread.wake.is_set()
        assert _samples_in(thread, 1.0) <= 3  # the full rate: 2 a second
    finally:
        stop.set()
        thread.wake.set()
        thread.join(5)


def test_what_counts_as_nothing_happened():
    from gpuguard.agent.stages.s1_produce.producers import quiet_view

    def snap(util=0, memory=0, processes=(), errors=(), state=None):
        dev = DeviceSample(vendor="nvidia", index=0, name="H100", gpu_util=util, memory_used=memory)
        if state:
            dev.extra["state"] = state
        return GpuSnapshot(
            time=1.0, source="nvml", devices=[dev], processes=list(processes), errors=list(errors)
        )

    assert quiet_view(snap()) == quiet_view(snap())
    assert quiet_view(snap(memory=1 << 30)) != quiet_view(snap())  # memory moved: a change
    assert quiet_view(snap(util=1)) is None
    unsupported = quiet_view(snap(errors=["power: Not Supported"]))
    assert unsupported == quiet_view(snap(errors=["power: Not Supported"]))  # stays so: quiet
    assert unsupported != quiet_view(snap())  # a part that fails anew is a change
    assert quiet_view(snap(state="lost")) is None
    usage = ProcessGpuUsage(pid=4242, vendor="nvidia", device_index=0)
    assert quiet_view(snap(processes=[usage])) is None


class _WakeLog(BoundedQueue):
    """An intake that notes, per queued GPU sample, whether it woke the consumer."""

    def __init__(self) -> None:
        super().__init__(10_000)
        self.wakes: list[bool] = []

    def put_many(self, items: list, producer: str, wake: bool = True) -> int:
        self.wakes.extend(wake for _ in items)
        return super().put_many(items, producer, wake)


def test_a_sample_that_says_what_the_last_one_said_does_not_wake_the_detect_loop():
    fake = _two_idle_h100s()
    intake = _WakeLog()
    stop = threading.Event()
    thread = SamplerThread(
        "nvml",
        lambda: nvml.open_sampler(library=fake.module),
        intake,
        AgentCounters(),
        stop,
        emit=lambda line: None,
        interval=INTERVAL_S,
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(intake.wakes) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert intake.wakes[:3] == [True, False, False]  # the first is news, the same is not
        fake.gpus[0].util_gpu = 97  # a kernel runs: news again, and each busy sample is news
        seen = len(intake.wakes)
        while len(intake.wakes) < seen + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert intake.wakes[seen + 1 : seen + 3] == [True, True]
    finally:
        stop.set()
        thread.wake.set()
        thread.join(5)
    assert len(intake) == len(intake.wakes)  # every sample was queued, woken or not


def test_items_queued_without_a_wake_leave_a_waiting_consumer_asleep_and_wait_for_its_turn():
    intake = BoundedQueue(10)
    notified: list[int] = []
    intake._cond.notify = lambda n=1: notified.append(n)  # the wake itself
    intake.put("idle sample", "sampler", wake=False)
    assert notified == []
    assert intake.take_all(0) == ["idle sample"]  # taken at the consumer's next turn
    intake.put("busy sample", "sampler")
    assert notified == [1]
