"""The agent's stages, built once in flow order: what each counts reaches the state file and /metrics.

An in-process agent in reduced mode (its /proc sweeps find the selftest's miner simulator,
which this test starts), monitor mode: the simulator is reported and acted on (an alert), so
the score, report and act stages count real work.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import fields

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.pipeline import Agent
from tests.support.agent_run import agent_running, miner_simulator, until

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

FLOW = ["produce", "enrich", "correlate", "score", "report", "act", "emit"]


def _stage_work(agent: Agent) -> dict[tuple[str, str], float]:
    port = agent.telemetry.server.port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.labels["stage"], s.labels["work"]): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "gpuguard_stage_work_total"
    }


def _status_stages(path) -> dict:
    return json.loads(path.read_text())["counters"]["stages"]


def _verdict_of(agent, pid: int) -> str | None:
    state = agent.correlator.state_of(pid)
    return state.verdict.verdict if state is not None and state.verdict is not None else None


def test_each_stage_s_counts_reach_the_state_file_and_the_metrics(tmp_path):
    status = tmp_path / "status.json"
    config = AgentConfig(
        sensor="proc",
        log_path=str(tmp_path / "agent.log"),
        status_path=status,
        gpu_sources=[],
        sweep_interval_s=0.5,
        status_interval_s=0.3,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(config, install_signals=False, stderr=lambda line: None, sampler_openers={})
    assert agent.opened.wired is None  # nothing is built before start-up opens what it needs
    with agent_running(agent), miner_simulator() as miner:
        stages = agent.opened.wired.stages
        assert [f.name for f in fields(stages)] == FLOW
        counting = dict(stages.counts())
        assert agent.counters.stages == counting  # the stages' own dicts, registered once
        # the agent sweeps the whole host: wait for the simulator's own verdict, not any act
        until(lambda: _verdict_of(agent, miner["pid"]) == "malicious", timeout=60)
        until(lambda: stages.act.counts["acted"] >= 1, timeout=30)
        assert stages.report.counts["written"] >= 1 and stages.score.counts["verdicts"] >= 1
        shown = until(lambda: (s := _status_stages(status))["act"]["acted"] >= 1 and s)
        assert {name: set(counts) for name, counts in shown.items()} == {
            name: set(counts) for name, counts in counting.items()
        }
        exported = until(lambda: (w := _stage_work(agent)).get(("act", "acted"), 0) >= 1 and w)
        assert set(exported) == {
            (name, work) for name, counts in counting.items() for work in counts
        }
        assert exported[("report", "written")] >= 1 and exported[("score", "verdicts")] >= 1
    # the last state file is written after the final scoring: it says what the stages counted
    final = json.loads(status.read_text())
    assert final["running"] is False
    assert final["counters"]["stages"] == {name: dict(c) for name, c in counting.items()}
