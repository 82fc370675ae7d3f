"""The agent survives its own faults: a sampler that raises, a GPU that falls off the bus, a full queue.

The agent runs in this process (reduced mode, so no probes are compiled) with
the NVML sampler opened over the faithful fake ``pynvml``; everything else is
real: /proc sweeps, the correlator, the log file and the state file.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.agent.config import AgentConfig, load_config, with_overrides
from gpuguard.agent.pipeline import Agent
from gpuguard.proving.enforce_scope import EnforceScope
from gpuguard.sources.gpu import nvml
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml
from tests.support.agent_run import agent_running, log_records, until

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


@pytest.fixture
def agent_with_fake_nvml(tmp_path):
    fake = FakeNvml([FakeGpu(util_gpu=97, memory_used=70_000 * 1024 * 1024)])
    config = AgentConfig(
        sensor="proc",
        log_path=str(tmp_path / "agent.log"),
        status_path=tmp_path / "status.json",
        sample_interval_s=0.1,
        sweep_interval_s=0.5,
        intake_queue=64,
        status_interval_s=0.5,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(
        config,
        install_signals=False,
        stderr=lambda line: None,
        sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module)},
    )
    agent.housekeeping_s = 0.5
    with agent_running(agent):
        yield agent, fake, tmp_path / "agent.log"


def test_a_sampler_that_raises_is_reported_and_retried(agent_with_fake_nvml):
    agent, fake, log = agent_with_fake_nvml
    until(lambda: agent.counters.samples["nvml"] >= 3)
    real = fake.module.nvmlDeviceGetUtilizationRates

    def broken(handle):
        raise OSError("ctypes: bad handle")

    fake.module.nvmlDeviceGetUtilizationRates = broken
    until(lambda: agent.counters.sampler_errors["nvml"] >= 4)  # past one reopen
    fake.module.nvmlDeviceGetUtilizationRates = real
    samples = agent.counters.samples["nvml"]
    until(lambda: agent.counters.samples["nvml"] > samples + 2)  # sampling resumed, same agent
    records = log_records(log)
    faults = [r for r in records if r["event"].get("action") == "fault" and "nvml" in r["message"]]
    assert faults and "OSError: ctypes: bad handle" in faults[0]["message"]
    assert until(lambda: any(r["event"].get("action") == "recovered" for r in log_records(log)))
    assert agent.counters.gpus[("nvidia", 0)]["util"] == 97


def _metric(agent, name: str, **labels: str) -> float:
    port = agent.telemetry.server.port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == name and set(labels.items()) <= set(s.labels.items())
    )


def test_gpu_snapshots_and_sampler_errors_reach_the_metrics(agent_with_fake_nvml):
    agent, fake, _log = agent_with_fake_nvml
    until(lambda: _metric(agent, "gpuguard_gpu_utilization_percent", gpu="nvidia0") == 97)
    assert _metric(agent, "gpuguard_gpu_memory_used_bytes", gpu="nvidia0") == 70_000 * 1024 * 1024
    assert _metric(agent, "gpuguard_events_total", kind="gpu_snapshot") > 0
    assert _metric(agent, "gpuguard_blind_spot") == len(agent.counters.blind_spots) > 0
    fake.module.nvmlDeviceGetUtilizationRates = lambda handle: 1 / 0
    until(
        lambda: _metric(agent, "gpuguard_sampler_errors_total", source="nvml") >= 2
    )  # synced on status ticks


def test_a_gpu_that_falls_off_the_bus_is_reported_and_comes_back(agent_with_fake_nvml):
    agent, fake, log = agent_with_fake_nvml
    until(lambda: agent.counters.samples["nvml"] >= 2)
    fake.gpus[0].lost = True
    until(lambda: agent.counters.gpus[("nvidia", 0)]["lost"])
    lost = until(
        lambda: [
            r
            for r in log_records(log)
            if r["event"].get("action") == "fault" and "lost" in r["message"].lower()
        ]
    )
    assert "nvml" in lost[0]["message"]
    fake.gpus[0].lost = False
    until(lambda: not agent.counters.gpus[("nvidia", 0)]["lost"])
    assert agent.counters.sampler_errors["nvml"] == 0  # reported by the sampler, not raised


def test_a_burst_beyond_capacity_is_counted_and_reported(agent_with_fake_nvml):
    agent, _fake, log = agent_with_fake_nvml
    # 150 new processes: the next sweep queues one facts record each, far more than the 64-item intake holds
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(150)]
    try:
        until(lambda: agent.counters.intake_dropped["sweep"] > 0)
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
    drops = until(lambda: [r for r in log_records(log) if r["event"].get("action") == "drops"])
    assert drops[0]["gpuguard"]["detail"]["intake_dropped"]["sweep"] > 0
    status = json.loads(agent.config.status_path.read_text())
    until(
        lambda: (
            json.loads(agent.config.status_path.read_text())["drops"]["intake"].get("sweep", 0) > 0
        )
    )
    assert status["sensor"] == "proc"


def test_sighup_with_a_broken_config_keeps_the_last_good_settings(tmp_path):
    config_file = tmp_path / "agent.yaml"
    config_file.write_text("mode: monitor\nsweep: {interval_s: 0.5}\n")
    os.chmod(config_file, 0o600)
    os.chmod(tmp_path, 0o700)
    config = load_config(config_file)
    config = with_overrides(
        config,
        log_path=str(tmp_path / "agent.log"),
        status_path=tmp_path / "status.json",
        sensor="proc",
        gpu_sources=[],
    )
    agent = Agent(
        config,
        config_path=config_file,
        install_signals=False,
        stderr=lambda line: None,
        overrides={
            "log_path": config.log_path,
            "status_path": config.status_path,
            "sensor": "proc",
        },
    )
    scope = EnforceScope(tmp_path)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        assert agent.ready.wait(60)
        config_file.write_text("mode: enforce\nsweep: {interval_s: never}\n")
        agent.request_reload()
        failed = until(
            lambda: [
                r
                for r in log_records(tmp_path / "agent.log")
                if r["event"].get("action") == "reload-failed" and "config" in r["message"]
            ]
        )
        assert (
            f"{config_file}:2:" in failed[0]["message"]
            and "keeping the previous settings" in failed[0]["message"]
        )
        assert agent.config.mode == "monitor" and agent.config.sweep_interval_s == 0.5
        # a response section that does not parse is refused with the rest of the file, the agent runs on
        config_file.write_text("mode: enforce\nresponse:\n  kill: {grace_s: soon}\n")
        agent.request_reload()
        failed = until(
            lambda: [
                r
                for r in log_records(tmp_path / "agent.log")
                if r["event"].get("action") == "reload-failed" and "grace_s" in r["message"]
            ]
        )
        assert "response.kill.grace_s: expected a number" in failed[0]["message"]
        assert thread.is_alive() and agent.config.mode == "monitor"
        # enforce only inside a cgroup made for the test (other suites run on this machine)
        config_file.write_text("mode: enforce\n" + scope.response_section())
        agent.request_reload()
        # the loop thread sets the config, then builds the responder (a real one takes ~0.3 s), then the counters
        until(lambda: agent.config.mode == "enforce" and agent.counters.mode == "enforce")
        assert agent.responder.settings.cgroups == (scope.scope,)
    finally:
        agent.request_stop()
        thread.join(30)
        scope.close()
    assert not thread.is_alive() and agent.responder is None  # teardown closed the responder


def _log_of_a_short_agent_run(tmp_path, fake, **config):
    log = tmp_path / "agent.log"
    agent = Agent(
        AgentConfig(
            sensor="proc",
            log_path=str(log),
            status_path=tmp_path / "status.json",
            sample_interval_s=0.1,
            sweep_interval_s=0.5,
            status_interval_s=0.5,
            **config,
        ),
        install_signals=False,
        stderr=lambda line: None,
        sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module)},
    )
    with agent_running(agent):
        until(lambda: agent.counters.samples["nvml"] >= 3)
    return log_records(log)


@pytest.mark.parametrize("opt_in", [False, True])
def test_accounting_mode_is_turned_on_only_when_configured_and_the_change_is_logged(
    tmp_path, opt_in
):
    from tests.fakes.fake_pynvml import ERROR_CODES

    off, already_on = FakeGpu(accounting_mode=0), FakeGpu(accounting_mode=1)
    refusing = FakeGpu(
        accounting_mode=0,
        failing={"nvmlDeviceSetAccountingMode": ERROR_CODES["NVML_ERROR_NO_PERMISSION"]},
    )
    fake = FakeNvml([off, already_on, refusing])
    records = _log_of_a_short_agent_run(tmp_path, fake, nvml_accounting=opt_in)
    changes = [r for r in records if r["event"].get("action") == "host-change"]
    if not opt_in:
        assert (off.accounting_mode, already_on.accounting_mode) == (0, 1)  # host state untouched
        assert not changes and "nvmlDeviceSetAccountingMode" not in fake.call_counts
        return
    assert (off.accounting_mode, already_on.accounting_mode, refusing.accounting_mode) == (1, 1, 0)
    assert len(changes) == 1, changes  # one open, one record
    message = changes[0]["message"]
    assert "nvml gpu0: accounting mode on (was off)" in message
    assert "nvml gpu1: accounting mode on (was already)" in message
    assert "nvml gpu2: cannot turn accounting mode on" in message  # said, not fatal


def test_outcomes_the_responder_reports_later_are_counted_and_kept(tmp_path):
    """A hook result or a SIGKILL after the grace reaches the agent through the responder's emit,
    from another thread: it is logged, counted and listed like an outcome returned at once."""
    from gpuguard.events.agent_events import ActionOutcome

    log = tmp_path / "agent.log"
    agent = Agent(
        AgentConfig(
            sensor="proc",
            log_path=str(log),
            status_path=tmp_path / "status.json",
            gpu_sources=[],
            sweep_interval_s=0.5,
            status_interval_s=0.5,
        ),
        install_signals=False,
        stderr=lambda line: None,
    )
    with agent_running(agent):
        later = ActionOutcome(
            time=1.0, action="hook", status="done", pid=4_000_001, comm="x", reason="hook ran"
        )
        reporter = threading.Thread(target=agent.responder.emit, args=(later,))
        reporter.start()
        reporter.join()
        # queued by the responder's thread, recorded by the loop thread on its next turn
        until(lambda: agent.counters.actions[("hook", "done")] == 1)
        assert agent.counters.actions[("hook", "done")] == 1
        # listed among the latest (this agent watches the host: other tests' miners may add
        # their alerts after it)
        assert 4_000_001 in [a["pid"] for a in agent.counters.last_actions]
        until(
            lambda: [r for r in log_records(log) if r.get("gpuguard", {}).get("action") == "hook"]
        )
