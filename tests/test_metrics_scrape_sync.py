"""/metrics serves the agent's totals as of the scrape: the detect loop syncs them when a scrape
asks (an idle agent no longer syncs on every turn), and a loop that does not answer in time
leaves the scrape its last totals, not a hang."""

from __future__ import annotations

import threading
import time
import urllib.request

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.telemetry import SCRAPE_SYNC_WAIT_S, AgentTelemetry
from tests.support.ports import free_port


def _exec_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith('gpuguard_events_total{kind="exec"}'):
                return float(line.split()[-1])
    return 0.0


def _telemetry(tmp_path) -> tuple[AgentTelemetry, int]:
    port = free_port()
    config = AgentConfig(log_path=str(tmp_path / "agent.log"), metrics_address=f"127.0.0.1:{port}")
    telemetry = AgentTelemetry(config, AgentCounters(), lambda line: None)
    telemetry.serve_metrics()
    return telemetry, port


def test_a_scrape_gets_the_totals_the_loop_syncs_for_it(tmp_path):
    telemetry, port = _telemetry(tmp_path)
    nudged, stop = threading.Event(), threading.Event()
    turns: list[float] = []

    def loop() -> None:  # the detect loop's side: a turn when nudged (or every 5 s)
        while not stop.is_set():
            nudged.wait(5.0)
            nudged.clear()
            turns.append(time.monotonic())
            telemetry.sync_metrics_if_wanted()

    telemetry.nudge_loop = nudged.set
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        telemetry.counters.events_by_kind["exec"] += 7
        assert _exec_total(port) == 7  # synced for this scrape, not at the next status check
        telemetry.counters.events_by_kind["exec"] += 5
        assert _exec_total(port) == 12
        assert len(turns) == 2  # one turn per scrape, none between
    finally:
        stop.set()
        nudged.set()
        thread.join(10)
        telemetry.close_metrics()


def test_a_scrape_does_not_wait_on_a_loop_that_does_not_turn(tmp_path):
    telemetry, port = _telemetry(tmp_path)
    telemetry.nudge_loop = lambda: None  # a loop busy with a long batch
    try:
        telemetry.counters.events_by_kind["exec"] += 3
        started = time.monotonic()
        assert _exec_total(port) == 0  # the last totals synced (none yet)
        assert time.monotonic() - started < SCRAPE_SYNC_WAIT_S + 5
    finally:
        telemetry.close_metrics()
