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
from gpuguard.events.devices import GPU_NODE_CLASS_NAMES
from gpuguard.outputs.finding import GpuUse
from tests.support.findings import HOST, hostile_finding
from tests.support.records import render_record
from tests.support.sigma_match import sigma_matches

REPO = Path(__file__).resolve().parent.parent
SIGMA = REPO / "packaging" / "sigma"
SIGMA_CLI = Path(sys.executable).parent / "sigma"
POOL_RULE = "gpuguard_pool_connection.yml"
NOT_GPU = ("pci-bar", "mem", "msr", "msr-config", "hugepages-config")


def documented_commands() -> list[list[str]]:
    """The ``sigma convert`` commands in docs/siem.md, continuation lines joined."""
    text = (REPO / "docs" / "siem.md").read_text().replace("\\\n", " ")
    return [
        shlex.split(line.split("#", 1)[0])
        for line in (raw.strip() for raw in text.splitlines())
        if line.startswith("sigma convert ")
    ]


def runs_alone(backend: type, query: str) -> bool:
    """An ES|QL query has its ``from`` clause, an ElastAlert output is a rule: what a base rule
    printed beside its correlation with ``generate: true`` lacks (pySigma 1.5.1)."""
    if backend is ESQLBackend:
        return query.startswith("from ")
    if backend is ElastalertBackend:
        doc = yaml.safe_load(query)
        return isinstance(doc, dict) and "filter" in doc and "type" in doc
    return bool(query.strip())


def test_the_documented_commands_work_as_written_and_print_only_queries_that_run_alone():
    commands = documented_commands()
    assert len(commands) == 7
    for argv in commands:
        done = subprocess.run(
            [str(SIGMA_CLI), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        assert "gpuguard.agent" in done.stdout
        if argv[argv.index("-t") + 1] == "esql":
            queries = [q for q in done.stdout.split("\n\n") if q.strip()]
            assert queries and all(q.startswith("from ") for q in queries), (argv, queries)


@pytest.mark.parametrize("backend", [ESQLBackend, ElastalertBackend, SplunkBackend, LuceneBackend])
def test_every_rule_converts(backend):
    collection = SigmaCollection.load_ruleset([SIGMA])
    assert not collection.errors and len(collection.rules) == 4
    if backend is LuceneBackend:  # plain Lucene has no aggregation (docs/siem.md says so)
        single = [p for p in SIGMA.glob("*.yml") if "\ncorrelation:" not in p.read_text()]
        queries = backend().convert(SigmaCollection.load_ruleset(single))
        assert len(queries) == 3 and all("gpuguard" in q for q in queries)
        return
    queries = [str(q) for q in backend().convert(collection)]
    # the GPU and blind rules and the correlation; the pool rule is folded into the correlation
    assert len(queries) == 3, queries
    assert all(runs_alone(backend, q) for q in queries), queries
    distinct = ("count_distinct(host.name)", "dc(host.name)", "metric_agg_key: host.name")
    (correlation,) = [q for q in queries if any(d in q for d in distinct)]
    assert "destination.ip" in correlation and re.search(r"1h|hours: 1", correlation), correlation
    (pool,) = backend().convert(SigmaCollection.from_yaml((SIGMA / POOL_RULE).read_text()))
    assert runs_alone(backend, str(pool)) and "network_evidence" in str(pool)


def test_the_gpu_rule_matches_every_gpu_device_class_the_agent_emits_and_no_other():
    rule = yaml.safe_load((SIGMA / "gpuguard_malicious_on_gpu_node.yml").read_text())
    assert rule["detection"]["gpu"] == {"gpuguard.gpu.node_opened": True}
    assert set(GPU_NODE_CLASS_NAMES) == set(DEVICE_CLASS_NAMES) - set(NOT_GPU)
    for device_class in DEVICE_CLASS_NAMES:
        finding = hostile_finding()
        finding.gpu = GpuUse([device_class], ["/dev/dri/renderD128"], 97.0, 1 << 30, 12)
        doc = json.loads(render_record(finding, "ecs", HOST))
        assert sigma_matches(rule, doc) == (device_class not in NOT_GPU), device_class
    finding = hostile_finding()
    finding.gpu = GpuUse(
        ["hugepages-config", "nvidia"], [], None, None, 0
    )  # one GPU node is enough
    assert sigma_matches(rule, json.loads(render_record(finding, "ecs", HOST)))


def list_valued_fields(docs: list[dict]) -> set[str]:
    """Dotted names of the fields that hold a list in any of ``docs`` (ECS or ours), and of
    every field ECS declares an array (a backend may store it as one whatever a record holds)."""
    found: set[str] = set()

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}" if path else key)
        elif isinstance(value, list):
            found.add(path)

    for doc in docs:
        walk(doc, "")
    fields = json.loads((REPO / "tests" / "data" / "ecs_flat_8.11.json").read_text())["fields"]
    return found | {name for name, spec in fields.items() if spec.get("array")}


def rule_fields(rule: dict) -> set[str]:
    return {
        re.sub(r"\|.*$", "", key)
        for name, selection in (rule.get("detection") or {}).items()
        if name != "condition"
        for key in selection
    }


def test_no_rule_selects_on_a_field_the_agent_writes_as_a_list():
    """ES|QL compares a multi-valued field with == (or IN) to null, so a rule on event.category
    never matches in Elasticsearch; every rule selects on single-valued fields only."""
    from tests.support.findings import record_corpus

    finding = hostile_finding()
    finding.gpu = GpuUse(["nvidia", "nvidia-uvm"], ["/dev/nvidia0"], 97.0, 1 << 30, 12)
    docs = [json.loads(render_record(r, "ecs", HOST)) for r in record_corpus(finding)]
    listed = list_valued_fields(docs)
    assert {
        "event.category",
        "event.type",
        "gpuguard.gpu.device_classes",
        "gpuguard.rule_ids",
    } <= listed
    for path in SIGMA.glob("*.yml"):
        rule = yaml.safe_load(path.read_text())
        assert not rule_fields(rule) & listed, (path.name, rule_fields(rule) & listed)
    # the check catches what it is for: the rule as it was, on event.category
    old = {"detection": {"selection": {"event.category": "network"}, "condition": "selection"}}
    assert rule_fields(old) & listed == {"event.category"}


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
