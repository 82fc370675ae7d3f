"""The shipped alerting rules, evaluated by promtool over what a real eBPF agent exports before
and after it finds a real miner stand-in (the selftest's simulator): the first malicious finding
of each rule pages, as the agent's series really are.  The agent is the one this test process
shares (tests/support/shared_agent.py): its counters may already count other processes."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.detect.ruleset.model import VERDICTS
from tests.support.agent_run import REPO, finding_for, miner_simulator

pytestmark = [pytest.mark.root, pytest.mark.self_contained]
ALERTS = REPO / "packaging" / "prometheus" / "gpuguard-alerts.yaml"
NODE = "gpu-node-1"
JOB = "gpuguard-metrics"


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if math.isfinite(s.value)
    ]


def malicious(samples: list) -> dict[str, float]:
    return {
        labels["rule"]: value
        for name, labels, value in samples
        if name == "gpuguard_findings_total" and labels["verdict"] == "malicious"
    }


def series_name(name: str, labels: dict[str, str]) -> str:
    """``name{label="value",...}`` as promtool reads it (values escaped as in the exposition)."""

    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inner = ",".join(f'{k}="{quoted(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(scrapes: list[list | None], minutes: int = 10) -> list[dict[str, str]]:
    """One promtool input series per exported sample: each scrape holds for ``minutes`` one-minute
    steps, as a 1m scrape interval would store it (``_`` where a scrape lacks the series), with the
    target labels Prometheus adds and ``up``."""
    keys: dict[str, list[str]] = {}
    for i, samples in enumerate(scrapes):
        for name, labels, value in samples or ():
            key = series_name(name, {**labels, "instance": NODE, "job": JOB})
            keys.setdefault(key, ["_"] * len(scrapes))[i] = f"{value:.6f}"
    keys[series_name("up", {"instance": NODE, "job": JOB})] = [
        "1" if s is not None else "_" for s in scrapes
    ]
    return [
        {"series": key, "values": " ".join(f"{v}x{minutes - 1}" for v in values)}
        for key, values in sorted(keys.items())
    ]


def expected_page(rule: str) -> dict:
    (annotated,) = [
        r
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "GpuguardMaliciousFinding"
    ]
    fill = {"{{ $labels.instance }}": NODE, "{{ $labels.rule }}": rule}
    annotations = {}
    for key, text in annotated["annotations"].items():
        for placeholder, value in fill.items():
            text = text.replace(placeholder, value)
        annotations[key] = text
    return {
        "exp_labels": {"severity": "critical", "instance": NODE, "rule": rule},
        "exp_annotations": annotations,
    }


def promtool_test(tmp_path: Path, name: str, series: list, cases: list) -> str:
    doc = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    path = tmp_path / f"{name}.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (fix: bash packaging/setup-host.sh setup)"
    run = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    return run.stdout


def test_the_first_malicious_finding_of_a_real_agent_pages(tmp_path, shared_agent):
    agent, port = shared_agent, shared_agent.metrics_port
    before = scrape(port)
    quiet = malicious(before)
    # Every rule is exported at each verdict, at 0 until a finding names it.  The host is
    # busy (other tests run miner stand-ins too), so a rule may already count findings
    # about processes this test did not start: each such rule must be one the agent's log
    # named in a malicious finding (the log is written before the counter ticks).
    named = {
        r["rule"]["id"]
        for r in agent.records()
        if r.get("gpuguard", {}).get("verdict") == "malicious" and "rule" in r
    }
    assert "miner-cmdline-stratum" in quiet, sorted(quiet)
    assert {rule for rule, n in quiet.items() if n} <= named, (quiet, named)
    assert any(n == 0 for n in quiet.values()), quiet
    counted = {
        (labels["rule"], labels["verdict"])
        for name, labels, _ in before
        if name == "gpuguard_findings_total"
    }
    assert {v for _, v in counted} == set(VERDICTS) and len(counted) == 3 * len(quiet)
    with miner_simulator() as miner:
        found = agent.wait_record(finding_for(miner["pid"]), timeout=20)
        # the totals reach /metrics on a state-file tick: wait for the miner's own rule to
        # count it (another rule may already count other tests' stand-ins)
        rule, deadline = found["rule"]["id"], time.monotonic() + 20
        while time.monotonic() < deadline:
            if malicious(scrape(port)).get(rule, 0) > quiet.get(rule, 0):
                break
            time.sleep(0.25)
        after = scrape(port)
    assert found["gpuguard"]["verdict"] == "malicious"
    rose = sorted(rule for rule, n in malicious(after).items() if n > quiet.get(rule, 0))
    assert found["rule"]["id"] in rose, (found["rule"], rose)
    # promtool over the two scrapes, ten minutes apart: quiet, then the finding.  The agent's
    # start time is real (about 1.8e9 s) while promtool's clock starts at 0, so the alert's
    # young-agent clause stays out: the page comes from increase() over the exported 0.
    pages = [expected_page(rule) for rule in rose]
    out = promtool_test(
        tmp_path,
        "first-finding",
        input_series([before, after]),
        [
            {"eval_time": "9m", "alertname": "GpuguardMaliciousFinding", "exp_alerts": []},
            {"eval_time": "11m", "alertname": "GpuguardMaliciousFinding", "exp_alerts": pages},
            {"eval_time": "11m", "alertname": "GpuguardAgentDown", "exp_alerts": []},
            {"eval_time": "11m", "alertname": "GpuguardReducedMode", "exp_alerts": []},
        ],
    )
    (tmp_path / "promtool.out").write_text(out)
    # The same finding without the exported 0 (the series first seen at 1): no step for
    # increase() to see, no page.  This is what the agent did before, and why it exports 0.
    unseen = [s for s in before if s[0] != "gpuguard_findings_total"]
    promtool_test(
        tmp_path,
        "no-zero",
        input_series([unseen, after]),
        [{"eval_time": "11m", "alertname": "GpuguardMaliciousFinding", "exp_alerts": []}],
    )
