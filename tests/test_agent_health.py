"""/healthz and /readyz on the metrics listener: a real agent answers 200, a stalled detect loop
turns /healthz to 503 (fault injection: GPUGUARD_FAULT_STALL_LOOP), and the default port."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuguard.agent.telemetry import STALL_ENV
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.outputs.metrics_http import DEFAULT_METRICS_PORT, AgentHealth
from tests.support.agent_run import AgentProcess
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
# What GPU nodes commonly run, by port: the default must not be one of them.
TAKEN_ON_GPU_NODES = {
    9400: "NVIDIA DCGM exporter",
    9100: "Prometheus node_exporter",
    8765: "Falco web server (metrics, health)",
    9376: "falco-exporter",
    2112: "Tetragon metrics",
    9090: "Prometheus",
    9091: "Pushgateway / Calico Felix",
    9093: "Alertmanager",
    9464: "OpenTelemetry Prometheus exporter",
    9835: "nvidia_gpu_exporter",
    9808: "CSI livenessprobe",
    9962: "Cilium agent",
    9965: "Hubble",
    10250: "kubelet",
    10249: "kube-proxy metrics",
    10256: "kube-proxy health",
    8080: "kube-state-metrics / cAdvisor",
    5000: "AMD device-metrics-exporter",
    5555: "DCGM host engine",
    9479: "Prometheus beat exporter (beside Filebeat, which ships gpuguard's log)",
    10248: "kubelet health",
    10255: "kubelet read-only",
    10257: "kube-controller-manager",
    10259: "kube-scheduler",
    2379: "etcd",
    9253: "NodeLocal DNSCache metrics",
    20256: "node-problem-detector health",
    20257: "node-problem-detector metrics",
    29400: "torchrun rendezvous (c10d)",
    29500: "PyTorch distributed MASTER_PORT",
    6379: "Ray GCS",
    8265: "Ray dashboard",
    10001: "Ray client server",
    8000: "Triton / vLLM HTTP",
    8001: "Triton gRPC",
    8002: "Triton metrics",
    6817: "slurmctld",
    6818: "slurmd",
    4317: "OpenTelemetry collector OTLP",
    2020: "Fluent Bit metrics",
    9598: "Vector metrics",
    5066: "Filebeat HTTP monitoring",
    12345: "Grafana Alloy",
    15020: "Istio agent metrics",
}
# The Prometheus wiki's default port allocations: every port of this range was allocated by
# June 2023 (docs/deploy.md names the list and when it was checked).
EXPORTER_RANGE = range(9100, 10000)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: never happened (last {last!r})")


def agent_config(tmp_path: Path, port: int, stall_s: float) -> Path:
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"metrics:\n  address: 127.0.0.1:{port}\n  health_stall_s: {stall_s}\n"
        f"sampling:\n  sources: [nvml]\n"
    )
    config.chmod(0o600)
    return config


@pytest.mark.root
@pytest.mark.self_contained
def test_a_stalled_detect_loop_turns_healthz_to_503_and_back(tmp_path, monkeypatch):
    port = free_port()
    stall = tmp_path / "stall"
    monkeypatch.setenv(STALL_ENV, str(stall))
    config = agent_config(tmp_path, port, 2)
    agent = AgentProcess(tmp_path, "--sensor", "proc", "--config", str(config))
    try:
        agent.wait_ready()
        assert wait_for(lambda: get(port, "/readyz") == (200, "ready\n"), 20, "ready")
        assert get(port, "/healthz") == (200, "ok\n")
        body = get(port, "/metrics")[1]
        assert "gpuguard_agent_info" in body and "gpuguard_pod_gpu_series_dropped_total" in body
        lint = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr  # the real agent's /metrics
        stall.touch()
        stalled_at = time.monotonic()
        code, body = wait_for(
            lambda: (r := get(port, "/healthz"))[0] == 503 and r, 10, "/healthz 503"
        )
        assert time.monotonic() - stalled_at < 10
        assert "detect loop stalled" in body, body
        assert get(port, "/metrics")[0] == 200  # the listener itself still answers
        assert "fault injection" in agent.stderr()
        stall.unlink()
        assert wait_for(lambda: get(port, "/healthz") == (200, "ok\n"), 10, "/healthz back to 200")
    finally:
        if stall.exists():
            stall.unlink()
        assert agent.stop() == 0, agent.stderr()


@pytest.mark.root
@pytest.mark.self_contained
def test_readyz_once_the_probes_are_attached(tmp_path):
    port = free_port()
    config = agent_config(tmp_path, port, 30)
    agent = AgentProcess(tmp_path, "--sensor", "ebpf", "--config", str(config))
    try:
        seen = []  # /readyz answers, in order (the probe compile takes tens of seconds)
        deadline = time.monotonic() + 240  # a busy shared host slows the compile down
        while time.monotonic() < deadline and agent.proc.poll() is None:
            try:
                answer = get(port, "/readyz")
            except OSError:
                answer = None  # not listening yet
            if not seen or seen[-1] != answer:
                seen.append(answer)
            if answer == (200, "ready\n"):
                break
            time.sleep(0.05)
        assert seen[-1] == (200, "ready\n"), (seen, agent.stderr())
        assert all(a is None or a[0] == 503 for a in seen[:-1]), seen  # never ready too early
        doc = agent.wait_ready()
        assert doc["probes_attached"] > 0 and doc["sensor"] == "ebpf"
        assert get(port, "/healthz") == (200, "ok\n")
    finally:
        assert agent.stop() == 0, agent.stderr()


def test_health_logic_sensor_stall_and_dead_sensor_thread():
    now = [100.0]
    health = AgentHealth(5.0, clock=lambda: now[0])
    assert health.live() == (True, "starting") and health.ready() == (False, "starting")
    health.loop_turned()
    polled = [100.0]
    alive = [True]
    health.sensor_polled = lambda: polled[0]
    health.sensor_alive = lambda: alive[0]
    health.ready_reason = lambda: None
    assert health.live() == (True, "ok") and health.ready() == (True, "ready")
    now[0] = 104.0
    health.loop_turned()
    now[0] = 106.0
    ok, reason = health.live()
    assert not ok and "sensor stopped delivering" in reason
    polled[0] = 106.0
    assert health.live() == (True, "ok")
    alive[0] = False
    assert health.live()[0] is False
    alive[0] = True
    now[0] = 112.0
    ok, reason = health.live()
    assert not ok and reason.startswith("detect loop stalled")


def test_health_endpoints_served_beside_metrics():
    metrics = AgentMetrics()
    health = AgentHealth(5.0)
    server = metrics.serve("127.0.0.1:0", health)
    try:
        assert get(server.port, "/readyz") == (503, "starting\n")
        assert get(server.port, "/healthz") == (200, "starting\n")
        health.loop_turned()
        health.ready_reason = lambda: "GPU samplers not opened yet: nvml"
        assert get(server.port, "/readyz") == (503, "GPU samplers not opened yet: nvml\n")
        code, body = get(server.port, "/metrics")
        assert code == 200 and "gpuguard_agent_info" in body
    finally:
        server.close()


def test_default_port_collides_with_nothing_gpu_nodes_run():
    assert DEFAULT_METRICS_PORT not in TAKEN_ON_GPU_NODES
    assert DEFAULT_METRICS_PORT not in EXPORTER_RANGE and DEFAULT_METRICS_PORT != 9090
    assert not 30000 <= DEFAULT_METRICS_PORT <= 32767  # Kubernetes NodePorts (hostNetwork)
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert not low <= DEFAULT_METRICS_PORT <= high  # never an ephemeral port
    shipped = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
    for path in ("packaging/agent.yaml", "docs/deploy.md", "docs/agent.md"):
        text = (REPO / path).read_text()
        assert shipped in text or f":{DEFAULT_METRICS_PORT}" in text, path
        assert "9400" not in text or "DCGM" in text, path


def test_address_in_use_is_one_line_naming_the_port_and_the_key(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = tmp_path / "agent.yaml"
    config.write_text(f"metrics: {{address: '127.0.0.1:{port}'}}\n")
    config.chmod(0o600)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "gpuguard", "agent", "--sensor", "proc", "--config", str(config)]
            + ["--state-file", str(tmp_path / "s.json"), "--log", str(tmp_path / "a.log")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != STALL_ENV},
        )
    finally:
        taken.close()
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"port {port}" in run.stderr and "metrics.address" in run.stderr
    assert str(config) in run.stderr and "Traceback" not in run.stderr


def test_blocks_in_place_are_exported_by_kind(tmp_path):
    from gpuguard.agent.config import AgentConfig
    from gpuguard.agent.counters import AgentCounters
    from gpuguard.agent.telemetry import AgentTelemetry
    from gpuguard.respond import ResponseSettings
    from gpuguard.respond.blocks import Block, BlockStore

    config = AgentConfig(
        metrics_address="127.0.0.1:0", response=ResponseSettings(state_dir=str(tmp_path))
    )
    telemetry = AgentTelemetry(config, AgentCounters(), lambda line: None)
    telemetry.serve_metrics()
    try:
        store = BlockStore(str(tmp_path))
        for n, kind in enumerate(("quarantine", "quarantine", "nftables")):
            store.save(Block(id=f"b-{n}", kind=kind, created=1.0, expires=None, reason="test"))
        telemetry.sync_metrics()
        body = get(telemetry.server.port, "/metrics")[1]
        assert 'gpuguard_blocks_active{kind="quarantine"} 2.0' in body
        assert 'gpuguard_blocks_active{kind="nftables"} 1.0' in body
        assert 'gpuguard_blocks_active{kind="suspend"} 0.0' in body  # every kind, 0 when none
        store.remove("b-2")
        telemetry.sync_metrics()
        body = get(telemetry.server.port, "/metrics")[1]
        assert 'gpuguard_blocks_active{kind="nftables"} 0.0' in body
    finally:
        telemetry.close_metrics()


def test_every_file_that_names_the_metrics_port_names_the_one_default():
    """The port is defined once (metrics_http.DEFAULT_METRICS_PORT); the YAML, the image and the
    docs cannot import it, so this finds every port number they give the agent's endpoint."""
    port = str(DEFAULT_METRICS_PORT)
    named = {
        "packaging/agent.yaml": r"address: 127\.0\.0\.1:(\d+)",
        "packaging/Containerfile": r"EXPOSE (\d+)/tcp",
        "packaging/kubernetes/base/daemonset.yaml": r"\[\$\(POD_IP\)\]:(\d+)|containerPort: (\d+)",
        "packaging/kubernetes/overlays/enforce/enforce.yaml": r"\[\$\(POD_IP\)\]:(\d+)",
        "packaging/kubernetes/overlays/metrics/service.yaml": r"port: (\d+)",
        "docs/deploy.md": r"metrics port (\d+)|127\.0\.0\.1:(\d+)|\[\$\(POD_IP\)\]:(\d+)",
        "docs/agent.md": r"127\.0\.0\.1:(\d+)",
    }
    for path, pattern in named.items():
        found = {
            g for m in re.finditer(pattern, (REPO / path).read_text()) for g in m.groups() if g
        }
        assert found == {port}, (path, found)
