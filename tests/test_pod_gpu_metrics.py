"""Per-pod GPU use: two pods time-slicing one GPU each get their own share.

Real processes run in cgroups this test creates, named the way the kubelet names
pod and container cgroups (systemd driver); the kubelet's log links that name
them are laid out in a private directory.  The NVIDIA sampler runs over the fake
``pynvml`` fed sample by sample from the real H100 traces: the hashing loop in
pod A, the CNN training and the inference server as two containers of pod B.  Under
time-slicing the driver gives each context its own share, so each process's own
figures are the trace's scaled by its slice.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.pipeline import Agent
from gpuguard.outputs.metrics import AgentMetrics, metric_names
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from gpuguard.sources.gpu import nvml
from gpuguard.sources.proc.pod_names import PodNames, PodRef
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.agent_run import agent_running, until
from tests.support.prometheus import exposition

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

TRACES = Path(__file__).resolve().parent / "traces" / "h100"
CGROUP_ROOT = Path(cgroup2_mount())  # /sys/fs/cgroup/unified on this hybrid host
GPU_UUID = "GPU-f6b4f902-6004-f273-fbc9-c583b04ad97f"  # the H100 of the traces
MODEL = "NVIDIA H100 80GB HBM3"  # its name in the traces
NODE = "gpu-node-7"  # the Kubernetes node name the DaemonSet hands the agent in NODE_NAME
SLICE = 0.5  # two pods time-slicing one GPU: each context gets half the time


def trace(name: str) -> list[tuple[float, int]]:
    """(SM %, memory bytes) of the trace's one GPU process, per 1 s sample it has one."""
    out = []
    for line in (TRACES / f"{name}.gpus.jsonl").read_text().splitlines():
        procs = json.loads(line)["processes"]
        if procs and procs[0]["sm_util"] is not None:
            out.append((procs[0]["sm_util"], procs[0]["used_memory"]))
    return out


class Pod:
    """A pod cgroup with one container cgroup per name, a real process in each, and its log links."""

    def __init__(self, parent: Path, logs: Path, namespace: str, name: str, containers: list[str]):
        self.namespace, self.name, self.uid = namespace, name, str(uuid.uuid4())
        pod_cg = parent / f"kubepods-besteffort-pod{self.uid.replace('-', '_')}.slice"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ids: dict[str, str] = {}
        (logs / "pods" / f"{namespace}_{name}_{self.uid}").mkdir(parents=True)
        for container in containers:
            cid = os.urandom(32).hex()
            cg = pod_cg / f"cri-containerd-{cid}.scope"
            cg.mkdir(parents=True)
            proc = subprocess.Popen(["sleep", "600"])
            (cg / "cgroup.procs").write_text(str(proc.pid))
            link = logs / "containers" / f"{name}_{namespace}_{container}-{cid}.log"
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(logs / "pods" / f"{namespace}_{name}_{self.uid}" / container / "0.log")
            self.procs[container], self.ids[container] = proc, cid

    def stop(self, container: str) -> None:
        proc = self.procs.pop(container)
        proc.kill()
        proc.wait()  # reaped: its cgroup is empty and can go


@pytest.fixture
def two_pods(tmp_path):
    parent = (
        CGROUP_ROOT / f"gg-podtest-{os.getpid()}" / "kubepods.slice" / "kubepods-besteffort.slice"
    )
    logs = tmp_path / "log"
    pods = []
    try:
        pods.append(Pod(parent, logs, "mining", "hasher-7d9f", ["hasher"]))
        pods.append(Pod(parent, logs, "ml-team", "trainer-0", ["train", "serve"]))
        yield pods, PodNames(str(logs))
    finally:
        for pod in pods:
            for container in list(pod.procs):
                pod.stop(container)
        top = CGROUP_ROOT / f"gg-podtest-{os.getpid()}"
        if top.exists():
            dirs = [top] + [p for p in top.rglob("*") if p.is_dir()]
            for path in sorted(dirs, key=lambda p: -len(p.parts)):  # leaves first
                path.rmdir()


def samples(metrics: AgentMetrics) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(exposition(metrics).decode())
        for s in fam.samples
    }


def pod_series(metrics: AgentMetrics, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for (n, labels), value in samples(metrics).items():
        if n == name:
            d = dict(labels)
            # dcgm-exporter's names for the GPU and the node: its DCGM_FI_DEV_* join on UUID
            assert (d["gpu"], d["UUID"], d["modelName"], d["Hostname"]) == (
                "nvidia0",
                GPU_UUID,
                MODEL,
                NODE,
            )
            out[(d["namespace"], d["pod"], d["container"])] = value
    return out


def test_two_pods_time_slicing_one_gpu_each_get_their_own_share(two_pods):
    (hasher, trainer), names = two_pods
    a, b1, b2 = hasher.procs["hasher"].pid, trainer.procs["train"].pid, trainer.procs["serve"].pid
    hashing, cnn, serving = trace("hashing-loop"), trace("cnn-training"), trace("inference-server")
    gpu = FakeGpu(uuid=GPU_UUID, name=MODEL)
    fake = FakeNvml([gpu])
    sampler = nvml.open_sampler(proc_root="/proc", library=fake.module)
    metrics = AgentMetrics(per_process_gpu=True, hostname=NODE)
    steps = min(len(hashing), len(cnn), len(serving), 20)
    base_us = int(time.time() * 1e6)
    differs = 0  # samples where pod A's share is not the whole GPU's busy percent
    for i in range(steps):
        (sm_a, mem_a), (sm_b1, mem_b1), (sm_b2, mem_b2) = hashing[i], cnn[i], serving[i]
        want = {a: (sm_a * SLICE, mem_a), b1: (sm_b1 * SLICE, mem_b1), b2: (sm_b2 * SLICE, mem_b2)}
        gpu.compute = [FakeProcess(pid, mem) for pid, (_, mem) in want.items()]
        gpu.util_samples = [
            (pid, base_us + i * 1_000_000, round(sm), 0, 0, 0) for pid, (sm, _) in want.items()
        ]
        gpu.util_gpu = min(100, round(sum(sm for sm, _ in want.values())))
        metrics.observe_snapshot(sampler.sample(), comm_of=lambda pid: "sleep", pod_of=names.of_pid)
        sm = pod_series(metrics, "gpuguard_pod_gpu_sm_percent")
        mem = pod_series(metrics, "gpuguard_pod_gpu_memory_bytes")
        assert sm == {
            ("mining", "hasher-7d9f", "hasher"): round(want[a][0]),
            ("ml-team", "trainer-0", "train"): round(want[b1][0]),
            ("ml-team", "trainer-0", "serve"): round(want[b2][0]),
        }, i
        assert mem == {
            ("mining", "hasher-7d9f", "hasher"): mem_a,
            ("ml-team", "trainer-0", "train"): mem_b1,
            ("ml-team", "trainer-0", "serve"): mem_b2,
        }
        # the pods' shares add up to what their processes used: nothing counted twice or lost
        assert sum(sm.values()) == sum(round(v) for v, _ in want.values())
        differs += sm[("mining", "hasher-7d9f", "hasher")] != gpu.util_gpu
        procs = {
            dict(labels)["pid"]: v
            for (n, labels), v in samples(metrics).items()
            if n == "gpuguard_process_gpu_memory_bytes"
        }
        assert procs == {str(a): mem_a, str(b1): mem_b1, str(b2): mem_b2}
    # the hashing loop is busy at ~99 % alone: sliced, it shows half of it, and the trainer the rest
    assert 45 <= sm[("mining", "hasher-7d9f", "hasher")] <= 50
    assert differs >= steps // 2  # a per-GPU figure would have given pod A the trainer's share too

    # pod A goes: its series go with it (pod and process), pod B's stay
    hasher.stop("hasher")
    gpu.compute = [p for p in gpu.compute if p.pid != a]
    gpu.util_samples = [(pid, base_us + steps * 1_000_000, 40, 0, 0, 0) for pid in (b1, b2)]
    metrics.observe_snapshot(sampler.sample(), pod_of=names.of_pid)
    assert set(pod_series(metrics, "gpuguard_pod_gpu_sm_percent")) == {
        ("ml-team", "trainer-0", "train"),
        ("ml-team", "trainer-0", "serve"),
    }
    assert not any(
        dict(lbl)["pid"] == str(a)
        for (n, lbl) in samples(metrics)
        if n == "gpuguard_process_gpu_sm_percent"
    )
    sampler.close()


def test_the_cap_bounds_the_series_and_counts_what_it_dropped(two_pods):
    (hasher, trainer), names = two_pods
    a, b1, b2 = hasher.procs["hasher"].pid, trainer.procs["train"].pid, trainer.procs["serve"].pid
    gpu = FakeGpu(uuid=GPU_UUID, name=MODEL)
    fake = FakeNvml([gpu])
    sampler = nvml.open_sampler(proc_root="/proc", library=fake.module)
    metrics = AgentMetrics(
        max_pod_series=1, hostname=NODE
    )  # per-process off: no process families at all
    now = int(time.time() * 1e6)
    gpu.compute = [FakeProcess(a, 500 << 20), FakeProcess(b1, 4 << 30), FakeProcess(b2, 700 << 20)]
    gpu.util_samples = [(a, now, 60, 0, 0, 0), (b1, now, 30, 0, 0, 0), (b2, now, 1, 0, 0, 0)]
    for _ in range(3):
        metrics.observe_snapshot(sampler.sample(), pod_of=names.of_pid)
    assert pod_series(metrics, "gpuguard_pod_gpu_sm_percent") == {
        ("mining", "hasher-7d9f", "hasher"): 60  # the busiest kept
    }
    dropped = samples(metrics)[("gpuguard_pod_gpu_series_dropped_total", (("family", "pod"),))]
    assert dropped == 2 * 3
    names_exported = {n for (n, _) in samples(metrics)}
    assert not names_exported & (metric_names(per_process_gpu=True) - metric_names())
    sampler.close()


def test_unknown_ids_keep_their_ids_and_host_processes_have_empty_labels(tmp_path):
    names = PodNames(str(tmp_path))
    uid, cid = str(uuid.uuid4()), os.urandom(32).hex()
    assert names.name(uid, cid) == PodRef("", uid, cid[:12])
    assert names.name(None, None) == PodRef("", "", "")
    assert names.of_pid(os.getpid()) == PodRef("", "", "")  # this test runs outside any pod
    # the kubelet's links appear later: found on the next rescan
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"web-1_prod_nginx-{cid}.log").symlink_to("/nonexistent")
    names._scanned = float("-inf")
    assert names.name(uid, cid) == PodRef("prod", "web-1", "nginx")
    # names Kubernetes cannot give (upper case, underscores, a hostile byte) are not parsed
    (tmp_path / "containers" / f"Evil_x_y_z-{'a' * 64}.log").symlink_to("/nonexistent")
    names._scanned = float("-inf")
    assert names.name(None, "a" * 64) == PodRef("", "", "a" * 12)


def test_the_running_agent_exports_pod_gpu_use_over_http(two_pods, tmp_path, monkeypatch):
    (hasher, trainer), names = two_pods
    a = hasher.procs["hasher"].pid
    monkeypatch.setenv("NODE_NAME", NODE)  # the DaemonSet's, from spec.nodeName
    gpu = FakeGpu(uuid=GPU_UUID, name=MODEL, compute=[FakeProcess(a, 545_259_520)])
    fake = FakeNvml([gpu])
    config = AgentConfig(
        sensor="proc",
        log_path=str(tmp_path / "agent.log"),
        status_path=tmp_path / "status.json",
        sample_interval_s=0.2,
        status_interval_s=0.5,
        metrics_address="127.0.0.1:0",
        per_process_gpu=True,
    )
    agent = Agent(
        config,
        install_signals=False,
        stderr=lambda line: None,
        sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module)},
    )
    agent.telemetry.pod_names = names
    with agent_running(agent):
        stamp = [int(time.time() * 1e6)]

        def scrape() -> str:
            stamp[0] += 1_000_000  # a fresh per-process sample each time
            gpu.util_samples = [(a, stamp[0], 99, 0, 0, 0)]
            port = agent.telemetry.server.port
            return (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            )

        want = (  # the exposition sorts label names
            f'gpuguard_pod_gpu_sm_percent{{Hostname="{NODE}",UUID="{GPU_UUID}",container="hasher",'
            f'gpu="nvidia0",modelName="{MODEL}",namespace="mining",pod="hasher-7d9f"}} 99.0'
        )
        assert until(lambda: want in scrape(), timeout=20)
        body = scrape()
        assert f'pid="{a}"' in body and "gpuguard_process_gpu_memory_bytes" in body
