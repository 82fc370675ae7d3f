"""Kubernetes identity as fields, in a real enforce agent: namespace, pod, container and image
from a directory tree laid out as the kubelet and containerd lay it, for real processes in
cgroups named like pods; the allowlist by namespace and image, a rule condition on the
namespace, the response scope's never_act_namespaces, and a record that says what is unknown.

The agent acts only inside a cgroup made for the test (:class:`EnforceScope`); the pods'
cgroups are made under it.
"""

from __future__ import annotations

import json
import os

import pytest

from gpuguard.proving.enforce_scope import EnforceScope
from tests.support.agent_run import AgentProcess, actions_on, finding_for
from tests.support.kubernetes_pod import Pod

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

RULES = """\
version: 1
actions: {{malicious: kill}}
rules:
  - id: test-marked
    description: carries the test's marker
    severity: high
    tags: [gpu-abuse]
    weight: 80
    condition: {{signal: cmdline, contains: {marker}}}
  - id: test-in-team-b
    description: runs in namespace team-b
    severity: low
    weight: 5
    condition: {{signal: k8s_namespace, is: team-b}}
allowlist:
  - {{id: allow-ml-prod, namespace: ml-prod}}
  - {{id: allow-jupyter, image: "registry.example/jupyter/*"}}
"""


def test_namespace_and_image_are_fields_of_findings_allowlist_rules_and_scope(tmp_path):
    os.chmod(tmp_path, 0o700)
    logs, tasks = tmp_path / "log", tmp_path / "containerd"
    marker = f"gg{os.getpid()}-k8s"
    with EnforceScope(tmp_path) as scope:
        pods = {
            "prod": Pod(
                scope.cgroup, logs, tasks, "ml-prod", "trainer-0", "registry.example/train:1"
            ),
            "jupyter": Pod(
                scope.cgroup, logs, tasks, "team-a", "nb-alice", "registry.example/jupyter/base:2"
            ),
            "miner": Pod(scope.cgroup, logs, tasks, "team-b", "job-7", "registry.example/batch:3"),
            "dev": Pod(scope.cgroup, logs, tasks, "ml-dev", "sweep-1", None),  # no bundle
        }
        rules = tmp_path / "test-rules.yaml"
        rules.write_text(RULES.format(marker=marker))
        rules.chmod(0o600)
        config = tmp_path / "agent.yaml"
        config.write_text(
            "mode: enforce\nsensor: ebpf\nrules: [test-rules.yaml]\n"
            f"kubernetes: {{log_root: {logs}, containerd_root: {tasks}}}\n"
            + scope.response_section()
            + "  actions: {malicious: [kill], suspicious: alert}\n"
            + "  never_act_namespaces: [ml-dev]\n"
        )
        config.chmod(0o600)
        agent = AgentProcess(tmp_path, "--config", str(config))
        try:
            agent.wait_ready()
            pids = {name: pod.start(marker) for name, pod in pods.items()}

            # the one pod neither allowlisted nor out of scope: killed, its record names it all
            killed = agent.wait_record(
                lambda r: (
                    actions_on([r], pids["miner"])
                    and r["gpuguard"]["action"] == "kill"
                    and r["gpuguard"]["status"] == "done"
                ),
                timeout=30,
            )
            assert killed
            pods["miner"].proc.wait(timeout=10)
            found = agent.wait_record(finding_for(pids["miner"]), timeout=10)
            assert found["orchestrator"]["namespace"] == "team-b"
            assert found["orchestrator"]["resource"]["name"] == "job-7"
            assert found["container"]["name"] == "main"
            assert found["container"]["image"]["name"] == "registry.example/batch:3"
            assert "kubernetes_unknown" not in found["gpuguard"]
            rules_seen = {e["rule_id"] for e in found["gpuguard"]["evidence"]}
            assert rules_seen == {"test-marked", "test-in-team-b"}  # a condition on the namespace

            # allowlisted by namespace and by image: clean, untouched
            for name, entry in (("prod", "allow-ml-prod"), ("jupyter", "allow-jupyter")):
                record = agent.wait_record(finding_for(pids[name]), timeout=20)
                assert record["gpuguard"]["verdict"] == "clean"
                assert record["gpuguard"]["allowlisted"] is True
                assert f"allowlisted by {entry}" in record["message"]

            # never_act_namespaces: malicious, refused, alive; its unknown image is said
            dev = agent.wait_record(finding_for(pids["dev"]), timeout=20)
            assert dev["gpuguard"]["verdict"] == "malicious"
            assert dev["orchestrator"]["namespace"] == "ml-dev"
            assert dev["gpuguard"]["kubernetes_unknown"] == ["image"]
            refused = agent.wait_record(
                lambda r: actions_on([r], pids["dev"]) and r["gpuguard"]["status"] == "refused",
                timeout=20,
            )
            assert "never_act_namespaces" in refused["message"] + json.dumps(refused["gpuguard"])

            for name in ("prod", "jupyter", "dev"):
                assert pods[name].proc.poll() is None, f"{name} was touched"
                assert not [
                    r
                    for r in actions_on(agent.records(), pids[name])
                    if r["gpuguard"]["action"] == "kill" and r["gpuguard"]["status"] == "done"
                ]
        finally:
            for pod in pods.values():
                pod.stop()
            assert agent.stop() == 0, agent.stderr()
