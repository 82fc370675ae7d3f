"""A run's log opens with its start: ``start`` before what start-up found, ``start-failed`` (with
the reason, outcome failure, and nothing after it) when start-up was refused."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpuguard.outputs.records import FORMATS
from tests.support.agent_run import AgentProcess, finding_for, lifecycle, miner_simulator, until
from tests.support.ports import free_port
from tests.support.schemas import log_errors

REPO = Path(__file__).resolve().parent.parent


def test_the_start_record_is_the_runs_first_before_start_up_findings_and_degraded_lines(tmp_path):
    """A miner running before the agent is scored by the first sweep, and reduced mode logs a
    degraded line while the sensor step runs: both come after the start record, in the log and
    by time."""
    with miner_simulator() as miner:
        agent = AgentProcess(tmp_path, "--sensor", "proc")
        try:
            agent.wait_ready()
            agent.wait_record(finding_for(miner["pid"]), timeout=15)
        finally:
            agent.stop()
    records = agent.records()
    actions = [r["event"]["action"] for r in records if lifecycle(r["event"]["action"])(r)]
    assert records[0]["event"]["action"] == "start", [r["event"]["action"] for r in records]
    assert records[0]["gpuguard"]["detail"]["sensor"] == "proc"
    assert actions.count("start") == 1 and actions[-1] == "stop"
    first = records[0]["@timestamp"]
    assert all(r["@timestamp"] >= first for r in records), "a record older than the start"
    degraded = [r for r in records if lifecycle("degraded")(r) and "reduced mode" in r["message"]]
    found = [r for r in records if finding_for(miner["pid"])(r)]
    assert degraded and found  # made during start-up (sensor step, first sweep), logged after


@pytest.mark.root
@pytest.mark.self_contained
def test_a_stop_during_start_up_still_opens_the_log_with_the_start(tmp_path):
    """SIGTERM while the probes compile: the start record (marked interrupted) comes first, with
    what start-up had learnt, and the stop last."""
    port = free_port()
    agent = AgentProcess(tmp_path, "--sensor", "ebpf", "--metrics-address", f"127.0.0.1:{port}")
    try:  # the metrics port opens before the sensor step: start-up is under way
        until(lambda: _answers(port), timeout=60)
        assert agent.status().get("running") is not True  # not ready yet
        agent.signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=120) == 0, agent.stderr()
    finally:
        agent.stop()
    records = agent.records()
    actions = [r["event"]["action"] for r in records]
    assert actions[0] == "start" and actions[-1] == "stop" and actions.count("start") == 1, actions
    start = records[0]
    assert start["gpuguard"]["detail"]["interrupted"] is True
    assert "stopped during start-up" in start["message"]
    assert all(r["@timestamp"] >= start["@timestamp"] for r in records)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _refused(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp_path / "agent.log"
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "agent", "--sensor", "proc"]
        + ["--state-file", str(tmp_path / "s.json"), "--log", str(log), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert not log_errors(log), log_errors(log)  # valid records of their format
    return run, log.read_text().splitlines()


def test_a_start_refused_for_a_taken_port_is_logged_as_start_failed_with_the_reason(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        run, lines = _refused(tmp_path, "--metrics-address", f"127.0.0.1:{port}")
    finally:
        taken.close()
    (record,) = [json.loads(line) for line in lines]  # the run's first and last record
    event, detail = record["event"], record["gpuguard"]["detail"]
    assert (event["action"], event["outcome"], event["type"]) == (
        "start-failed",
        "failure",
        ["start"],
    )
    assert record["log"]["level"] == "error"
    assert detail["step"] == "metrics" and "Address already in use" in detail["reason"]
    assert f"port {port}" in detail["reason"] and "metrics.address" in detail["fix"]
    assert detail["reason"] in run.stderr and detail["fix"] in run.stderr  # what stderr says


@pytest.mark.parametrize("fmt", FORMATS[1:])  # the default (ecs): the test above
def test_a_start_refused_for_a_bad_web_config_says_failure_in_every_format(tmp_path, fmt):
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: nope.crt\n")
    web.chmod(0o600)
    run, lines = _refused(
        tmp_path,
        "--log-format",
        fmt,
        "--metrics-address",
        "127.0.0.1:0",
        "--web-config-file",
        str(web),
    )
    (line,) = lines
    assert "key_file" in run.stderr
    if fmt == "ocsf":
        record = json.loads(line)
        assert (record["activity_name"], record["status"]) == ("Start", "Failure")
        detail = record["unmapped"]["gpuguard"]["detail"]
        assert detail["step"] == "metrics" and "key_file" in detail["reason"]
    else:
        assert "|agent-start-failed|" in line and "outcome=failure" in line, line
        assert "key_file" in line
