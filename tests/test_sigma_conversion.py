"""The shipped Sigma rules convert to every documented backend, and match what the agent emits."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sigma.backends.elasticsearch import ElastalertBackend, ESQLBackend, LuceneBackend
from sigma.backends.splunk import SplunkBackend
from sigma.collection import SigmaCollection

from gpuguard.events.abi import DEVICE_CLASS_NAMES
from gpuguard.outputs.finding import GpuUse
from gpuguard.outputs.records import render_record
from tests.test_agent_logs import HOST, hostile_finding
from tests.test_deploy import _matches

REPO = Path(__file__).resolve().parent.parent
SIGMA = REPO / "packaging" / "sigma"
SIGMA_CLI = Path(sys.executable).parent / "sigma"
NOT_GPU = ("pci-bar", "mem", "msr", "msr-config", "hugepages-config")


def documented_commands() -> list[list[str]]:
    """The ``sigma convert`` commands in docs/siem.md, continuation lines joined."""
    text = (REPO / "docs" / "siem.md").read_text().replace("\\\n", " ")
    return [
        shlex.split(line.split("#", 1)[0])
        for line in (raw.strip() for raw in text.splitlines())
        if line.startswith("sigma convert ")
    ]


def test_the_documented_commands_work_as_written():
    commands = documented_commands()
    assert len(commands) == 4
    for argv in commands:
        done = subprocess.run(
            [str(SIGMA_CLI), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        assert "gpuguard.agent" in done.stdout


@pytest.mark.parametrize("backend", [ESQLBackend, ElastalertBackend, SplunkBackend, LuceneBackend])
def test_every_rule_converts(backend):
    collection = SigmaCollection.load_ruleset([SIGMA])
    assert not collection.errors and len(collection.rules) == 4
    if backend is LuceneBackend:  # plain Lucene has no aggregation (docs/siem.md says so)
        single = [r for r in collection.rules if type(r).__name__ == "SigmaRule"]
        queries = backend().convert(SigmaCollection(single))
        assert len(queries) == 3 and all("gpuguard" in q for q in queries)
        return
    queries = [str(q) for q in backend().convert(collection)]
    assert len(queries) == 4, queries  # three rules and the correlation
    distinct = ("count_distinct(host.name)", "dc(host.name)", "metric_agg_key: host.name")
    (correlation,) = [q for q in queries if any(d in q for d in distinct)]
    assert "destination.ip" in correlation and re.search(r"1h|hours: 1", correlation), correlation


def test_the_gpu_rule_names_the_device_classes_the_agent_emits():
    rule = yaml.safe_load((SIGMA / "gpuguard_malicious_on_gpu_node.yml").read_text())
    classes = rule["detection"]["gpu"]["gpuguard.gpu.device_classes"]
    assert set(classes) == set(DEVICE_CLASS_NAMES) - set(NOT_GPU), classes
    for device_class in ("drm-render", "drm-card", "kfd", "nvidia"):
        finding = hostile_finding()
        finding.gpu = GpuUse([device_class], ["/dev/dri/renderD128"], 97.0, 1 << 30, 12)
        doc = json.loads(render_record(finding, "ecs", HOST))
        assert _matches(rule, doc), device_class
    finding = hostile_finding()
    finding.gpu = GpuUse(["hugepages-config"], [], None, None, 0)
    assert not _matches(rule, json.loads(render_record(finding, "ecs", HOST)))


def test_no_rule_names_a_field_outside_the_records():
    """Every field a rule selects on is one the ECS records carry (ECS or gpuguard.*)."""
    fields = json.loads((REPO / "tests" / "data" / "ecs_flat_8.11.json").read_text())["fields"]
    for path in SIGMA.glob("*.yml"):
        rule = yaml.safe_load(path.read_text())
        for name, selection in (rule.get("detection") or {}).items():
            if name == "condition":
                continue
            for key in selection:
                field = re.sub(r"\|.*$", "", key)
                assert field in fields or field.startswith("gpuguard."), (path.name, field)
