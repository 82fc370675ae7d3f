"""Config visibility: `gpuguard config validate` lists every problem, and a failed reload shows
on stderr, in `gpuguard status --json` and as a metric (the real agent, SIGHUP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agent_run import REPO, lifecycle, running_agent, simulator_rules
from tests.support.metrics_scrape import scrape, series
from tests.support.ports import free_port

BROKEN = """\
mode: sometimes
logg: {path: x}
sampling:
  interval_s: fast
response:
  kil: {grace_s: 1}
  kill: {grace_s: soon, target: host}
  actions: {malicious: [explode]}
  hooks:
    - {argv: [logger], on: [bad]}
guard_policies:
  - {id: x, allowed_hours: 8, colour: red}
  - {max_gpus_per_user: -1}
"""
# (line:col, words) of every problem in BROKEN, in file order
EXPECTED = [
    ("1:7", "mode 'sometimes' is not one of monitor, enforce"),
    ("2:1", "unknown key 'logg'"),
    ("4:15", "sampling.interval_s must be a number, not 'fast'"),
    ("6:3", "response.kil: unknown key 'kil'"),
    ("7:19", "response.kill.grace_s: expected a number >= 0, got 'soon'"),
    ("7:33", "response.kill.target: 'host' is not process, group or cgroup"),
    ("8:25", "response.actions.malicious[0]: unknown action 'explode'"),
    ("10:15", "response.hooks[0].argv[0]: 'logger' is not an absolute path"),
    ("10:29", "response.hooks[0].on[0]: unknown verdict 'bad'"),
    ("12:28", "guard_policies[0].allowed_hours: 8 is not an hour range"),
    ("12:31", "guard_policies[0].colour: unknown key 'colour'"),
    ("13:5", "guard_policies[1].id: a policy needs a name"),
    ("13:25", "guard_policies[1].max_gpus_per_user: expected a whole number >= 0, got -1"),
]


def gpuguard(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuguard", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_config_validate_reports_every_problem_with_its_position(tmp_path):
    path = write(tmp_path / "agent.yaml", BROKEN)
    run = gpuguard("config", "validate", str(path))
    assert run.returncode == 2, run
    lines = run.stdout.splitlines()
    assert len(lines) == len(EXPECTED), lines
    for line, (where, words) in zip(lines, EXPECTED, strict=True):
        assert line.startswith(f"{path}:{where}: ") and words in line, (line, where, words)
    assert run.stderr == f"{len(EXPECTED)} problems\n"
    # the agent refuses the same file at start, naming the first problem and the count of the rest
    agent = gpuguard("agent", "--config", str(path), "--sensor", "proc")
    assert agent.returncode == 2 and agent.stderr.count("\n") == 1, agent.stderr
    assert f"{path}:1:7: mode 'sometimes'" in agent.stderr and "and 12 more" in agent.stderr


def test_config_validate_passes_the_shipped_config_and_a_good_one(tmp_path):
    run = gpuguard("config", "validate", str(REPO / "packaging" / "agent.yaml"))
    assert (run.returncode, run.stderr) == (0, ""), run
    good = write(tmp_path / "agent.yaml", "mode: enforce\nresponse: {scope: containers}\n")
    run = gpuguard("config", "validate", str(good))
    assert (run.returncode, run.stdout) == (0, f"ok: {good}\n"), run


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_config_validate_refuses_a_file_others_can_write(tmp_path, mode):
    path = write(tmp_path / "agent.yaml", "mode: monitor\n", mode)
    run = gpuguard("config", "validate", str(path))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "writable by group/others" in run.stderr, run.stderr


def test_config_validate_refuses_a_file_root_does_not_own(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("run as root (the agent's own check depends on it)")
    path = write(tmp_path / "agent.yaml", "mode: monitor\n")
    os.chown(path, 65534, 65534)
    run = gpuguard("config", "validate", str(path))
    assert run.returncode == 2 and "owned by uid 65534, not root" in run.stderr, run.stderr


def test_config_validate_names_a_missing_file_or_a_fifo(tmp_path):
    run = gpuguard("config", "validate", str(tmp_path / "nope.yaml"))
    assert run.returncode == 2 and "does not exist" in run.stderr
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo, 0o600)
    run = gpuguard("config", "validate", str(fifo))  # must not hang on the FIFO
    assert run.returncode == 2 and "FIFO" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.root
@pytest.mark.self_contained
def test_a_failed_reload_shows_on_stderr_in_status_and_as_a_metric(tmp_path):
    rules, site = simulator_rules(tmp_path)
    good_site = site.read_text()
    config = write(tmp_path / "agent.yaml", "mode: monitor\nsampling: {sources: []}\n")
    good_config = config.read_text()
    port = free_port()
    with running_agent(
        tmp_path,
        "--config",
        str(config),
        "--sensor",
        "proc",
        "--rules",
        str(rules),
        "--rules",
        str(site),
        "--metrics-address",
        f"127.0.0.1:{port}",
    ) as agent:
        doc = agent.wait_status(lambda d: d.get("config"))
        assert doc["config"] == {"path": str(config), "error": None}
        samples = scrape(port)
        assert series(samples, "gpuguard_config_last_reload_successful", part="config") == 1
        assert series(samples, "gpuguard_config_last_reload_successful", part="rules") == 1

        # a broken agent.yaml: the previous settings stay, and it shows in all three places
        write(config, "mode: monitor\nsampling: {interval_s: fast}\n")
        agent.signal(signal.SIGHUP)
        doc = agent.wait_status(lambda d: d["config"]["error"])
        assert f"{config}:2:24: sampling.interval_s must be a number" in doc["config"]["error"]
        assert doc["rules"]["error"] is None  # the rules themselves reloaded fine
        stderr = [line for line in agent.stderr().splitlines() if "config not reloaded" in line]
        assert len(stderr) == 1 and f"{config}:2:24" in stderr[0], agent.stderr()
        samples = scrape(port)
        assert series(samples, "gpuguard_config_last_reload_successful", part="config") == 0
        assert series(samples, "gpuguard_reloads_total", result="failed") >= 1
        status = gpuguard("status", "--json", "--state-file", str(agent.state))
        assert json.loads(status.stdout)["config"]["error"] == doc["config"]["error"]
        human = gpuguard("status", "--state-file", str(agent.state)).stdout
        assert "config:     last reload FAILED" in human, human

        # a broken rules file too: rules.error is set (the config error stands until fixed)
        write(site, "version: 1\nrules: [{id: x}]\n")
        agent.signal(signal.SIGHUP)
        doc = agent.wait_status(lambda d: d["rules"]["error"])
        assert str(site) in doc["rules"]["error"] and doc["config"]["error"]
        samples = scrape(port)
        assert series(samples, "gpuguard_config_last_reload_successful", part="rules") == 0
        assert any("rules not reloaded" in line for line in agent.stderr().splitlines())

        # good files again: the next reload clears both, and the gauges go back to 1
        write(config, good_config)
        write(site, good_site)
        agent.signal(signal.SIGHUP)
        doc = agent.wait_status(
            lambda d: d["config"]["error"] is None and d["rules"]["error"] is None, timeout=30
        )
        samples = scrape(port)
        assert series(samples, "gpuguard_config_last_reload_successful", part="config") == 1
        assert series(samples, "gpuguard_config_last_reload_successful", part="rules") == 1
        failed = [r for r in agent.records() if lifecycle("reload-failed")(r)]
        assert any("config not reloaded" in r["message"] for r in failed)
        assert any("rules not reloaded" in r["message"] for r in failed)
