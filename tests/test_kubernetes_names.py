"""A process's Kubernetes names and image from the node alone: containerd's bundles and the
kubelet's log tree, laid out as they lay them; the allowlist's namespace and image entries."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import load_ruleset, validate_rules
from gpuguard.detect.scoring.score import score_process
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.proc.container_images import ContainerImages, RuntimeNames
from gpuguard.sources.proc.pod_names import PodNames, PodRef

T = 1_700_000_000.0


def bundle(tasks: Path, container_id: str, **notes: str) -> Path:
    path = tasks / "k8s.io" / container_id / "config.json"
    path.parent.mkdir(parents=True)
    keys = {
        "image": "io.kubernetes.cri.image-name",
        "container": "io.kubernetes.cri.container-name",
        "namespace": "io.kubernetes.cri.sandbox-namespace",
        "pod": "io.kubernetes.cri.sandbox-name",
    }
    path.write_text(json.dumps({"annotations": {keys[k]: v for k, v in notes.items()}}))
    return path


def test_the_runtime_bundle_names_the_image_and_fills_what_the_log_tree_lacks(tmp_path):
    tasks, logs = tmp_path / "tasks", tmp_path / "log"
    cid, uid = os.urandom(32).hex(), str(uuid.uuid4())
    names = PodNames(str(logs), images=ContainerImages(str(tasks)))
    assert names.lookup(uid, cid) == PodRef("", "", "", "")  # nothing on the node yet
    bundle(
        tasks,
        cid,
        image="nvcr.io/nvidia/pytorch:24.01-py3",
        container="train",
        namespace="ml",
        pod="t-0",
    )
    assert names.lookup(uid, cid) == PodRef(
        "ml", "t-0", "train", "nvcr.io/nvidia/pytorch:24.01-py3"
    )
    # the kubelet's log tree wins for the names; the image comes from the bundle only
    (logs / "containers").mkdir(parents=True)
    (logs / "containers" / f"web-1_prod_nginx-{cid}.log").symlink_to("/nonexistent")
    names._scanned = float("-inf")
    facts = names.fill(ProcessFacts(pid=1, start_time=T, container_id=cid, pod_uid=uid))
    assert (facts.pod_namespace, facts.pod_name, facts.container_name, facts.container_image) == (
        "prod",
        "web-1",
        "nginx",
        "nvcr.io/nvidia/pytorch:24.01-py3",
    )
    host = names.fill(ProcessFacts(pid=2, start_time=T))
    assert host.pod_namespace is None and host.container_image is None


def test_a_bundle_that_is_not_a_regular_file_or_not_json_names_nothing(tmp_path):
    cid = os.urandom(32).hex()
    fifo = tmp_path / "k8s.io" / cid / "config.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)  # never opened blocking
    assert ContainerImages(str(tmp_path)).of(cid) == RuntimeNames()
    other = os.urandom(32).hex()
    broken = tmp_path / "k8s.io" / other / "config.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    assert ContainerImages(str(tmp_path)).of(other) == RuntimeNames()


def _state(**facts) -> ProcessState:
    state = ProcessState(ProcessKey(4242, T), first_seen=T, last_seen=T)
    base = dict(pid=4242, start_time=T, comm="python3", exe="/usr/bin/python3", uid=1000)
    state.set_facts(ProcessFacts(**{**base, **facts}))
    return state


RULES = """\
version: 1
rules:
  - id: in-team-b
    description: runs in team-b
    severity: high
    weight: 80
    condition: {signal: k8s_namespace, is: team-b}
  - id: pulled-from-example
    description: an image of registry.example
    severity: low
    weight: 5
    condition: {signal: container_image, glob: "registry.example/*"}
allowlist:
  - {id: by-image, image: "registry.example/jupyter/*"}
  - {id: by-namespace, namespace: "ml-prod*"}
"""


def test_rules_and_the_allowlist_read_the_namespace_and_the_image(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES)
    ruleset = load_ruleset([path])
    cid = "c" * 64
    miner = score_process(
        _state(container_id=cid, pod_namespace="team-b", container_image="registry.example/x:1"),
        ruleset,
        T + 1,
    )
    assert miner.verdict == "malicious" and not miner.allowlisted
    assert {e.rule_id for e in miner.evidence} == {"in-team-b", "pulled-from-example"}
    jupyter = _state(
        container_id=cid, pod_namespace="team-b", container_image="registry.example/jupyter/b:2"
    )
    assert score_process(jupyter, ruleset, T + 1).allowlist_entry == "by-image"
    prod = _state(container_id=cid, pod_namespace="ml-prod-eu", container_image=None)
    assert score_process(prod, ruleset, T + 1).allowlist_entry == "by-namespace"
    # an unknown namespace or image never matches an entry, nor a rule
    unknown = score_process(_state(container_id=cid), ruleset, T + 1)
    assert not unknown.allowlisted and not unknown.evidence


def test_an_allowlist_entry_may_name_only_a_namespace_and_unknown_keys_stay_errors(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\nallowlist:\n  - {id: a, namespace: x, images: y}\n")
    problems = [str(p) for p in validate_rules([path])]
    assert len(problems) == 1 and "r.yaml:3:27: unknown allowlist key 'images'" in problems[0]
