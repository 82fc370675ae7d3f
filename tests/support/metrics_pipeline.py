"""A golden miner case replayed through the real pipeline into AgentMetrics, as the agent feeds them."""

from __future__ import annotations

import time
from pathlib import Path

from gpuguard.agent.counters import AgentCounters
from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import Event, Lost
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.wire import iter_recording
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.outputs.log_writer import open_log
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.sources.gpu import nvml
from gpuguard.sources.proc.pod_names import PodRef
from tests.fakes.fake_pynvml import ERROR_CODES, MIB, FakeGpu, FakeNvml, FakeProcess

CASE = Path(__file__).resolve().parents[1] / "cases" / "miner_stratum_cmdline" / "capture.ggrec"


HOSTILE = 'x\n\x1b]0;pwned\x07"} evil{a="1'


def fake_gpus(now_us: int) -> FakeNvml:
    busy = FakeGpu(
        util_gpu=98,
        util_memory=61,
        memory_used=76_210 * MIB,
        power_mw=688_512,
        sm_clock=1980,
        compute=[FakeProcess(4242, 70_000 * MIB), FakeProcess(4343, 1_000 * MIB)],
        util_samples=[(4242, now_us - 200_000, 97, 55, 0, 0), (4343, now_us - 200_000, 1, 1, 0, 0)],
    )
    # A second GPU whose temperature read fails: a sampler error, as NVML reports it.
    flaky = FakeGpu(
        uuid="GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c02",
        bus_id="00000000:2A:00.0",
        failing={"nvmlDeviceGetTemperature": ERROR_CODES["NVML_ERROR_UNKNOWN"]},
    )
    return FakeNvml([busy, flaky])


class Pipeline:
    """A golden miner case replayed through the real correlator and scoring, plus the NVML sampler
    over the fake library, feeding :class:`AgentMetrics` the way the agent does."""

    def __init__(self, metrics: AgentMetrics, log_dir: Path) -> None:
        self.metrics = metrics
        self.ruleset = load_ruleset([shipped_rules_file()])
        self.items = list(iter_recording(CASE))
        self.sampler = nvml.open_sampler(
            proc_root="/nonexistent", library=fake_gpus(int(time.time() * 1e6)).module
        )
        self.log = open_log(str(log_dir / "agent.log"), "ecs", queue_size=0)
        self.broken_log = open_log("/dev/full", "ecs", queue_size=0)  # every write: ENOSPC
        metrics.set_agent("monitor", "proc")
        metrics.set_rules("1", "sha256:0123abcd", time.time())
        metrics.set_blind_spots(["gpu ioctls (no eBPF)", "connect payloads (no eBPF)"])

    def run_once(self) -> None:
        m = self.metrics
        counters = AgentCounters()  # what the agent's stages count, synced as the agent does
        correlator = Correlator(facts_provider=None)
        engine = DetectionEngine(correlator, self.ruleset)
        now = 0.0
        for item in self.items + [Lost(time=0.0, pid=0, what="events", count=2)]:
            correlator.feed(item)
            if isinstance(item, Event):
                m.count_event(item.kind)
                if isinstance(item, Lost):
                    counters.ring_lost[item.what] += item.count
            elif isinstance(item, GpuSnapshot):
                m.count_event("gpu_snapshot")
            elif isinstance(item, ProcessFacts):
                m.count_event("process_facts")
            now = max(now, getattr(item, "time", 0.0) or getattr(item, "start_time", 0.0))
        started = time.perf_counter()
        verdicts = engine.verdicts(now)
        m.observe_scoring(time.perf_counter() - started)
        counters.processes_tracked = len(list(correlator.states()))
        for verdict in verdicts:
            state = correlator.get(verdict.key)
            finding = finding_from_verdict(
                verdict, state.facts if state else None, self.ruleset, state
            )
            counters.findings[(finding.rule_id, finding.verdict)] += 1
            self.log.write(finding)
            self.broken_log.write(finding)
            if verdict.verdict == "malicious":
                counters.actions[("alert", "done")] += 1
                # as the act stage counts a verdict rule by rule: the top rule in enforce mode
                # killed it, the others' kill was held back (respond.intent)
                per_rule = {e.rule_id: ("kill",) for e in verdict.evidence}
                top = (verdict.evidence[0].rule_id,)
                counters.count_intent(per_rule, {"kill"}, top, verdict.comm)
        snapshot = self.sampler.sample()
        m.observe_snapshot(
            snapshot,
            comm_of=lambda pid: {4242: "xmrig", 4343: HOSTILE}.get(pid),
            pod_of=lambda pid: PodRef("ml", f"trainer-{pid}", "main"),
        )
        m.set_queue("sensor", 3)
        counters.intake_dropped["sensor"] += 1
        m.sync_totals(counters.snapshot())
        m.count_reload(True)
        m.set_host_findings({"host-gpu-memory-orphaned": 1})
        m.set_blocks({"kill-on-touch": 1}, ("kill-on-touch", "quarantine"))
        m.observe_log(self.log)
        m.observe_log(self.broken_log)
        m.sync_totals({"stages": {"enrich": {"facts_read": 2, "yara_scans": 0}}})

    def close(self) -> None:
        self.log.close()
        self.broken_log.close()
