"""Agent metrics: fed from a real pipeline, exported, scraped by Debian's real Prometheus,
and every query of the shipped Grafana dashboard returns data from it."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.outputs.metrics import EXEC_SENT_UP, AgentMetrics, metric_names
from gpuguard.outputs.metrics_http import parse_address
from tests.support.metrics_pipeline import Pipeline
from tests.support.prometheus import exposition, prometheus

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "packaging" / "grafana-dashboard.json"


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


# the busy GPU of fake_gpus, labelled as dcgm-exporter labels it (sorted label pairs)
H100 = (
    ("Hostname", "gpu-node-7"),
    ("UUID", "GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c01"),
    ("gpu", "nvidia0"),
    ("modelName", "NVIDIA H100 80GB HBM3"),
)


def exported_names(metrics: AgentMetrics) -> set[str]:
    return {
        s.name
        for fam in text_string_to_metric_families(exposition(metrics).decode())
        for s in fam.samples
    }


@pytest.fixture
def fed(tmp_path):
    metrics = AgentMetrics(hostname="gpu-node-7")
    pipeline = Pipeline(metrics, tmp_path)
    pipeline.run_once()
    yield metrics, pipeline
    pipeline.close()


def test_metric_names_list_matches_what_is_exported(fed):
    metrics, _ = fed
    assert exported_names(metrics) == metric_names()  # each defined metric, no *_created


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text; version=1.0.0"])
def test_no_created_series_in_either_exposition_format(fed, accept):
    """Prometheus would store each *_created sample as a series of its own: none is served."""
    metrics, _ = fed
    server = metrics.serve("127.0.0.1:0")
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": accept}
        )
        body = urllib.request.urlopen(request, timeout=10).read().decode()
    finally:
        server.close()
    samples = [line.split("{")[0].split(" ")[0] for line in body.splitlines() if line[:1] != "#"]
    assert "gpuguard_findings_total" in samples and "gpuguard_events_total" in samples
    assert not [s for s in samples if s.endswith("_created")]


def test_every_metric_the_dashboard_queries_is_exported(fed):
    metrics, _ = fed
    queried = {
        name for expr in dashboard_exprs() for name in re.findall(r"\bgpuguard_[a-z_]+\b", expr)
    }
    assert queried, "the dashboard queries nothing"
    assert queried <= exported_names(metrics), sorted(queried - exported_names(metrics))
    # and the dashboard shows every kind of metric the agent has (nothing exported goes unseen)
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metric_names()}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in queried}
    assert base <= shown, sorted(base - shown)


def test_pipeline_values_land_in_the_right_series(fed):
    metrics, _ = fed
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(exposition(metrics).decode())
        for s in fam.samples
    }
    assert (
        samples[
            ("gpuguard_findings_total", (("rule", "net-pool-protocol"), ("verdict", "malicious")))
        ]
        == 1
    )
    assert samples[("gpuguard_events_total", (("kind", "gpu_ioctl"),))] == 73
    assert samples[("gpuguard_ring_lost_events_total", ())] == 2
    assert (
        samples[
            (
                "gpuguard_gpu_utilization_percent",
                H100,
            )
        ]
        == 98
    )
    assert samples[("gpuguard_gpu_power_watts", H100)] == pytest.approx(688.512)
    assert (
        samples[
            (
                "gpuguard_gpu_process_utilization_percent",
                tuple(sorted((*H100, ("comm", "xmrig"), ("pid", "4242")))),
            )
        ]
        == 97
    )
    assert samples[("gpuguard_sampler_errors_total", (("source", "nvml"),))] >= 1
    assert (
        samples[
            (
                "gpuguard_log_dropped_total",
                (("destination", "/dev/full"), ("reason", "write-failed")),
            )
        ]
        >= 1
    )
    assert samples[("gpuguard_reduced_mode", ())] == 1


def test_hostile_process_name_is_one_escaped_label(fed):
    metrics, _ = fed
    text = exposition(metrics).decode()
    lines = [line for line in text.splitlines() if 'pid="4343"' in line]
    assert len(lines) == 2  # utilisation and memory, one line each: no forged series
    assert all("\x1b" not in line and "evil{" not in line.split("}")[-1] for line in lines)
    assert all('comm="x\\\\n\\\\x1b]0;pwned\\\\x07\\"} evil{a=\\"1"' in line for line in lines), (
        lines
    )


def test_top_processes_are_bounded_and_replaced():
    metrics = AgentMetrics(top_processes=2)
    from gpuguard.events.gpu_snapshot import DeviceSample, ProcessGpuUsage

    def snap(pids):
        return GpuSnapshot(
            time=1.0,
            source="nvml",
            devices=[DeviceSample("nvidia", 0)],
            processes=[ProcessGpuUsage(pid, "nvidia", 0, sm_util=float(pid)) for pid in pids],
        )

    metrics.observe_snapshot(snap([1, 2, 3, 4]))
    assert {s.labels["pid"] for s in metrics.gpus.proc_util.collect()[0].samples} == {"3", "4"}
    metrics.observe_snapshot(snap([7]))
    assert {s.labels["pid"] for s in metrics.gpus.proc_util.collect()[0].samples} == {"7"}


def test_the_agents_running_totals_become_counters_that_only_move_forward():
    metrics = AgentMetrics()

    def value(name, **labels):
        return metrics.registry.get_sample_value(name, labels or None)

    totals = {
        "events_by_kind": {"exec": 10, "gpu_ioctl": 500},
        "ring_lost": {"events": 3, "payloads": 1},
        "intake": {"depth": 7, "dropped": {"sensor": 2}},
        "output": {"depth": 1, "lines": 40, "dropped": 0, "errors": 5},
        "sampler_errors": {"nvml": 1},
        "processes_tracked": 55,
        "findings": {"miner-binary-name/malicious": 2},
        "actions": {"kill/done": 1},
    }
    metrics.sync_totals(totals)
    metrics.sync_totals(totals)  # the same totals again: no double count
    assert value("gpuguard_events_total", kind="gpu_ioctl") == 500
    assert value("gpuguard_ring_lost_events_total") == 4
    assert value("gpuguard_queue_depth", stage="intake") == 7
    assert value("gpuguard_queue_dropped_total", stage="intake:sensor") == 2
    assert value("gpuguard_log_dropped_total", destination="log", reason="write-failed") == 5
    assert value("gpuguard_findings_total", rule="miner-binary-name", verdict="malicious") == 2
    assert value("gpuguard_actions_total", action="kill", status="done") == 1
    assert value("gpuguard_processes_tracked") == 55
    totals["events_by_kind"]["gpu_ioctl"] = 800
    metrics.sync_totals(totals)
    assert value("gpuguard_events_total", kind="gpu_ioctl") == 800
    totals["events_by_kind"]["gpu_ioctl"] = 100  # the agent restarted its counters
    metrics.sync_totals(totals)
    totals["events_by_kind"]["gpu_ioctl"] = 150
    metrics.sync_totals(totals)
    assert value("gpuguard_events_total", kind="gpu_ioctl") == 850


def test_served_over_http(fed):
    metrics, _ = fed
    server = metrics.serve("127.0.0.1:0")
    try:
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
            .read()
            .decode()
        )
    finally:
        server.close()
    assert "gpuguard_findings_total{" in body and "gpuguard_scoring_latency_seconds_bucket" in body


@pytest.mark.parametrize("address", ["127.0.0.1:0", "0.0.0.0:0"])
def test_the_idle_server_thread_sleeps_long_yet_close_ends_it_at_once(fed, address):
    """The serving thread does not wake twice a second to look for a shutdown: close wakes it
    (its thread is gone when close returns, well inside the serve loop's 60 s wait)."""
    metrics, _ = fed
    server = metrics.serve(address)
    urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5).read()
    server.close()
    assert not server._thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_bad_metrics_address_is_one_clear_error():
    assert parse_address("[::1]:9400") == ("::1", 9400)
    assert parse_address(":9400") == ("0.0.0.0", 9400)
    for bad in ("9400", "host:port", "h:99999"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return [r for r in body["data"]["result"] if r["value"][1] not in ("NaN", "+Inf", "-Inf")]


def test_real_prometheus_scrapes_the_exporter_and_every_dashboard_query_returns_data(tmp_path):
    metrics = AgentMetrics()
    pipeline = Pipeline(metrics, tmp_path)
    exporter = metrics.serve("127.0.0.1:0")
    stop = threading.Event()

    def keep_feeding():  # counters must move between scrapes for rate() to have data
        while not stop.is_set():
            pipeline.run_once()
            stop.wait(0.3)

    feeder = threading.Thread(target=keep_feeding, daemon=True)
    feeder.start()
    config = (
        f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: gpuguard\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    pending = {
        expr.replace("$__rate_interval", "15s").replace("$instance", ".*")
        for expr in dashboard_exprs()
    }
    try:
        with prometheus(tmp_path, config) as server:
            deadline = time.monotonic() + 25
            while pending and time.monotonic() < deadline:
                server.check_alive()
                for expr in sorted(pending):
                    try:
                        if _query(server.port, expr):
                            pending.discard(expr)
                    except OSError:
                        break  # not listening yet
                time.sleep(0.5)
            assert not pending, f"dashboard queries without data from Prometheus: {sorted(pending)}"
            # the variable the dashboard's host picker uses
            url = f"{server.api}/label/instance/values"
            assert (
                f"127.0.0.1:{exporter.port}"
                in json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]
            )
    finally:
        stop.set()
        feeder.join(5)
        exporter.close()
        pipeline.close()


def test_exec_filter_counts_become_counters_that_never_step_back():
    metrics = AgentMetrics()

    def samples() -> dict:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(exposition(metrics).decode())
            for s in fam.samples
        }

    execs = {"aggregated": 100, "sent_up": 10, "promoted_by_kernel": 2, "promoted_by_age": 3}
    execs |= {"promoted_as_ancestors": 1, "pending_full": 4, "cgroups_full": 0}
    metrics.sync_totals({"events_by_kind": {"exec": 99}, "execs": execs})
    got = samples()
    assert got[("gpuguard_execs_kept_in_kernel_total", ())] == 100
    assert got[("gpuguard_execs_seen_total", ())] == 104  # kept + the 4 sent up at exec
    sent = {w: got[("gpuguard_execs_sent_up_total", (("when", w),))] for w in EXEC_SENT_UP}
    assert sent == {"exec": 4, "kernel": 2, "age": 3, "ancestor": 1}
    assert got[("gpuguard_exec_filter_full_total", (("map", "pending"),))] == 4
    assert got[("gpuguard_exec_filter_full_total", (("map", "cgroups"),))] == 0
    # the kernel's promotion count read ahead of the records it sent up
    metrics.sync_totals({"execs": execs | {"promoted_by_kernel": 4}})
    got = samples()
    assert got[("gpuguard_execs_sent_up_total", (("when", "exec"),))] == 4
    assert got[("gpuguard_execs_seen_total", ())] == 104
    metrics.sync_totals({"execs": execs | {"sent_up": 14, "promoted_by_kernel": 4}})
    assert samples()[("gpuguard_execs_sent_up_total", (("when", "exec"),))] == 6


def test_every_per_gpu_and_per_pod_series_carries_dcgm_exporters_labels(tmp_path):
    """UUID, modelName and Hostname (dcgm-exporter's names) beside gpu on every series that names
    a GPU, and beside namespace, pod and container on the per-pod ones; the values are the
    GPU's own (the fake NVML's H100s) and the node's."""
    metrics = AgentMetrics(per_process_gpu=True, hostname="gpu-node-7")
    pipeline = Pipeline(metrics, tmp_path)
    try:
        pipeline.run_once()
    finally:
        pipeline.close()
    by_gpu: dict[str, set] = {}
    families = set()
    for fam in text_string_to_metric_families(exposition(metrics).decode()):
        for s in fam.samples:
            if "gpu" not in s.labels:
                continue
            families.add(fam.name)
            assert {"UUID", "modelName", "Hostname"} <= set(s.labels), (s.name, s.labels)
            assert s.labels["Hostname"] == "gpu-node-7"
            by_gpu.setdefault(s.labels["gpu"], set()).add((s.labels["UUID"], s.labels["modelName"]))
            if fam.name.startswith(("gpuguard_pod_", "gpuguard_process_gpu_")):
                assert {"namespace", "pod", "container"} <= set(s.labels), s.name
    assert by_gpu == {
        "nvidia0": {("GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c01", "NVIDIA H100 80GB HBM3")},
        "nvidia1": {("GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c02", "NVIDIA H100 80GB HBM3")},
    }
    # every GPU family: devices, top processes, pods, processes with their pod
    assert families == {
        "gpuguard_gpu_utilization_percent",
        "gpuguard_gpu_memory_used_bytes",
        "gpuguard_gpu_memory_total_bytes",
        "gpuguard_gpu_power_watts",
        "gpuguard_gpu_process_utilization_percent",
        "gpuguard_gpu_process_memory_bytes",
        "gpuguard_pod_gpu_sm_percent",
        "gpuguard_pod_gpu_memory_bytes",
        "gpuguard_process_gpu_sm_percent",
        "gpuguard_process_gpu_memory_bytes",
    }, families


def test_findings_are_exported_at_zero_for_every_rule_and_verdict_before_any_is_found():
    metrics = AgentMetrics()
    metrics.declare_findings(["miner-cmdline-stratum", "guard.fair-share"])
    value = metrics.registry.get_sample_value
    for rule in ("miner-cmdline-stratum", "guard.fair-share"):
        for verdict in ("clean", "suspicious", "malicious"):
            assert value("gpuguard_findings_total", {"rule": rule, "verdict": verdict}) == 0
    metrics.sync_totals({"findings": {"miner-cmdline-stratum/malicious": 1}})
    assert (
        value("gpuguard_findings_total", {"rule": "miner-cmdline-stratum", "verdict": "malicious"})
        == 1
    )
    metrics.declare_findings(["miner-cmdline-stratum"])  # a reload declares again: no reset
    assert (
        value("gpuguard_findings_total", {"rule": "miner-cmdline-stratum", "verdict": "malicious"})
        == 1
    )


def test_a_running_agent_exports_every_rule_at_zero_and_a_reloaded_rule_too(tmp_path):
    """In-process agent (reduced mode): its /metrics has each rule's finding counters at 0 from
    the start, and a rule a SIGHUP reload brings joins them."""
    from gpuguard.agent.config import AgentConfig
    from gpuguard.agent.pipeline import Agent
    from tests.support.agent_run import agent_running, until

    site = tmp_path / "site.yaml"
    site.write_text("version: 1\n")
    config = AgentConfig(
        sensor="proc",
        rules=[shipped_rules_file(), site],
        log_path=str(tmp_path / "agent.log"),
        status_path=tmp_path / "status.json",
        metrics_address="127.0.0.1:0",
        gpu_sources=[],
    )
    agent = Agent(config, install_signals=False, stderr=lambda line: None)

    def counters() -> dict[tuple[str, str], float]:
        """Every exported finding counter, by (rule, verdict).  An agent in reduced mode sweeps
        the whole host, so on a busy one another test's miner stand-in may already have moved
        one of them above 0: what is asserted is that each series exists from the start."""
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{agent.telemetry.server.port}/metrics", timeout=5
        ).read()
        return {
            (s.labels["rule"], s.labels["verdict"]): s.value
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
            if s.name == "gpuguard_findings_total"
        }

    with agent_running(agent):
        rules = {r.id for r in agent.opened.rules.current.rules}
        assert {(r, v) for r in rules for v in ("clean", "suspicious", "malicious")} <= set(
            counters()
        )
        assert ("host-gpu-memory-orphaned", "malicious") in counters()  # an agent host check
        assert ("site-launcher-rule", "malicious") not in counters()
        site.write_text(
            "version: 1\nrules:\n  - id: site-launcher-rule\n    description: a site rule\n"
            "    severity: low\n    weight: 5\n    condition: {signal: parent_name, is: xmrig-launcher}\n"
        )
        agent.request_reload()
        assert until(lambda: ("site-launcher-rule", "malicious") in counters(), timeout=20)
        # no process here has a parent named xmrig-launcher: a counter that starts, and stays, at 0
        assert counters()[("site-launcher-rule", "malicious")] == 0
