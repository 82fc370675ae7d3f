"""The agent's Prometheus metrics: one registry the pipeline updates, served over HTTP.

Data flow: the agent calls the ``count_*`` / ``set_*`` / ``observe_*``
methods of :class:`AgentMetrics` as items pass each stage, or hands it the
cumulative totals it already keeps (:meth:`AgentMetrics.sync_totals`);
:meth:`AgentMetrics.serve` exposes them at ``http://HOST:PORT/metrics``.
Every metric is named ``gpuguard_*`` (see :func:`metric_names`); the Grafana
dashboard in ``packaging/grafana-dashboard.json`` queries only these (a test
checks it, and another has a real Prometheus scrape them).

Details: docs/internals.md, "metrics".
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.exposition import make_wsgi_app

from gpuguard import __version__
from gpuguard.detect.ruleset.model import VERDICTS
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.outputs.gpu_metrics import (
    DEFAULT_MAX_POD_SERIES,
    DEFAULT_TOP_PROCESSES,
    GpuSeries,
    label,
)
from gpuguard.outputs.metrics_http import AgentHealth, MetricsServer, serve
from gpuguard.outputs.web_config import WebConfig

# Scoring one dirty process takes tens of microseconds; a full rescore of thousands a few ms.
SCORING_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# gpuguard_execs_sent_up_total's "when", from the status file's ``execs`` keys
EXEC_SENT_UP = {
    "exec": None,  # at exec: the exec records sent up ("sent_up") less those promoted later
    "kernel": "promoted_by_kernel",
    "age": "promoted_by_age",
    "ancestor": "promoted_as_ancestors",
}


class AgentMetrics:
    """Every metric the agent exports, in a registry of its own (no process-wide globals)."""

    def __init__(
        self,
        top_processes: int = DEFAULT_TOP_PROCESSES,
        per_process_gpu: bool = False,
        max_pod_series: int = DEFAULT_MAX_POD_SERIES,
        hostname: str | None = None,
    ) -> None:
        # No *_created samples: Prometheus stores each as a series of its own, which doubled the
        # counters' series (193 of 408 samples), and nothing reads them: a counter's zero from the
        # start and gpuguard_agent_start_time_seconds give alerts what a created time would
        # (docs/deploy.md, "Metrics port").  prometheus_client keeps this switch process-wide;
        # the agent is its one user in the process.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Info(
            "gpuguard_agent", "The running agent: version, mode and sensor", registry=r
        )
        # An alert counts every malicious finding of an agent this young as new: its first
        # scrape may come after findings made at start (packaging/prometheus/gpuguard-alerts.yaml).
        self.started = Gauge(
            "gpuguard_agent_start_time_seconds", "When this agent started (Unix time)", registry=r
        )
        self.started.set(time.time())
        self.events = Counter(
            "gpuguard_events", "Sensor and sampler events taken in, by kind", ["kind"], registry=r
        )
        self.ring_lost = Counter(
            "gpuguard_ring_lost_events",
            "Events the kernel ring buffer lost (reader too slow)",
            registry=r,
        )
        self.queue_depth = Gauge(
            "gpuguard_queue_depth",
            "Items waiting in each pipeline stage's queue",
            ["stage"],
            registry=r,
        )
        self.queue_dropped = Counter(
            "gpuguard_queue_dropped", "Items a full stage queue dropped", ["stage"], registry=r
        )
        self.findings = Counter(
            "gpuguard_findings",
            "Findings reported, by top rule and verdict",
            ["rule", "verdict"],
            registry=r,
        )
        self.host_findings = Gauge(
            "gpuguard_host_findings_active",
            "GPU host findings active now (orphaned GPU memory), by rule",
            ["rule"],
            registry=r,
        )
        self.processes = Gauge(
            "gpuguard_processes_tracked", "Processes the correlator holds state for", registry=r
        )
        self.sampler_errors = Counter(
            "gpuguard_sampler_errors", "Sampler failures, by source", ["source"], registry=r
        )
        # per GPU, per top process and per pod (gpu_metrics.py)
        self.gpus = GpuSeries(r, top_processes, per_process_gpu, max_pod_series, hostname)
        self.scoring_latency = Histogram(
            "gpuguard_scoring_latency_seconds",
            "Time to score one batch of processes",
            buckets=SCORING_BUCKETS,
            registry=r,
        )
        self.rules = Info(
            "gpuguard_rules", "The loaded rules: version and content digest", registry=r
        )
        self.rules_loaded = Gauge(
            "gpuguard_rules_loaded_timestamp_seconds",
            "When the rules in use were loaded",
            registry=r,
        )
        self.reloads = Counter(
            "gpuguard_reloads", "Rules/config reloads, by result", ["result"], registry=r
        )
        self.reload_ok = Gauge(
            "gpuguard_config_last_reload_successful",
            "1 when the last reload of this part (config, rules) worked, 0 while a failed one stands",
            ["part"],
            registry=r,
        )
        for part in ("config", "rules"):
            self.reload_ok.labels(part).set(1)
        self.reduced_mode = Gauge(
            "gpuguard_reduced_mode",
            "1 when running without eBPF (periodic /proc sweeps)",
            registry=r,
        )
        self.blind_spots = Gauge(
            "gpuguard_blind_spot",
            "What reduced mode cannot see (1 per blind spot)",
            ["spot"],
            registry=r,
        )
        self.actions = Counter(
            "gpuguard_actions",
            "Response actions, by action and status",
            ["action", "status"],
            registry=r,
        )
        self.touch_kills = Counter(
            "gpuguard_touch_kills",
            "Processes kill-on-touch killed, by reason (exec, gpu-open, connect)",
            ["reason"],
            registry=r,
        )
        for reason in ("exec", "gpu-open", "connect"):
            self.touch_kills.labels(reason)  # exported at 0: an alert sees the first kill
        # rule by rule (respond.intent): what a rule's matches would have had enforce do (held
        # back: monitor mode, the rule in monitor mode, refused, a dry run), and what they did
        self.rule_would_act = Counter(
            "gpuguard_rule_would_act",
            "Acting steps a rule's matches planned and enforce did not take, by rule and action",
            ["rule", "action"],
            registry=r,
        )
        self.rule_acted = Counter(
            "gpuguard_rule_acted",
            "Acting steps enforce took through a rule in enforce mode, by rule and action",
            ["rule", "action"],
            registry=r,
        )
        self.stage_work = Counter(
            "gpuguard_stage_work",
            "What each agent stage did, by stage and kind of work (status: counters.stages)",
            ["stage", "work"],
            registry=r,
        )
        self.blocks = Gauge(
            "gpuguard_blocks_active",
            "Blocks the response left in place (gpuguard blocks), by kind",
            ["kind"],
            registry=r,
        )
        self.log_records = Counter(
            "gpuguard_log_records",
            "Log records written, by destination",
            ["destination"],
            registry=r,
        )
        self.log_dropped = Counter(
            "gpuguard_log_dropped",
            "Log records lost (queue full or destination failed)",
            ["destination", "reason"],
            registry=r,
        )
        # the sensor's exec filter (gpuguard/sources/ebpf/exec_filter.py): what it kept in the kernel
        self.execs_seen = Counter(
            "gpuguard_execs_seen",
            "Execs the eBPF sensor saw: those its exec filter kept in the kernel plus those sent "
            "up in full at exec (an exec the ring buffer lost is in "
            "gpuguard_ring_lost_events_total instead)",
            registry=r,
        )
        self.execs_kept = Counter(
            "gpuguard_execs_kept_in_kernel",
            "Execs the exec filter kept in the kernel at exec, counted per cgroup instead of sent "
            "up (plain execs of processes that do not matter); one that lives, connects, opens a "
            "GPU or asks for huge pages is sent up later and counted in gpuguard_execs_sent_up_total",
            registry=r,
        )
        self.execs_sent_up = Counter(
            "gpuguard_execs_sent_up",
            "Exec records that reached the agent, by when: at exec (a process that matters, or a "
            "name or directory the rules list), promoted later by the kernel (a kept process "
            "connected, opened a GPU or asked for huge pages), by age (it lived past the "
            "filter's age), or as the ancestor of a process that showed up",
            ["when"],
            registry=r,
        )
        self.exec_filter_full = Counter(
            "gpuguard_exec_filter_full",
            "Execs the exec filter had no room for: map pending (sent up in full instead) or "
            "cgroups (a new cgroup's execs counted only here)",
            ["map"],
            registry=r,
        )
        for when in EXEC_SENT_UP:
            self.execs_sent_up.labels(when)
        for name in ("pending", "cgroups"):
            self.exec_filter_full.labels(name)
        self._lock = threading.Lock()
        self._log_seen: dict[str, tuple[int, int, int]] = {}
        self._blind: set[str] = set()
        self._host_rules: set[str] = set()
        self._totals: dict[tuple[int, tuple[str, ...]], float] = {}
        self._execs_at_exec = 0
        self.info.info(
            {"version": __version__, "mode": "monitor", "sensor": "unknown", "headers": "none"}
        )
        self.reduced_mode.set(0)

    # -- agent state -----------------------------------------------------------------
    def set_agent(self, mode: str, sensor: str, headers: str = "") -> None:
        """``headers``: the kernel-header source the probes compiled against ("none" in reduced mode)."""
        labels = {"version": __version__, "mode": mode, "sensor": sensor}
        self.info.info({**labels, "headers": headers or "none"})

    def set_rules(self, version: str, digest: str, loaded_at: float | None = None) -> None:
        """The rules in use: ``version`` (short, for dashboards) and the full ``digest``."""
        self.rules.info({"version": str(version), "digest": digest})
        if loaded_at is not None:
            self.rules_loaded.set(loaded_at)

    def count_reload(self, ok: bool) -> None:
        self.reloads.labels("ok" if ok else "failed").inc()

    def set_reload_state(self, *, config_ok: bool, rules_ok: bool) -> None:
        """Whether the config and the rules on disk are the ones in force (0: a reload failed)."""
        self.reload_ok.labels("config").set(1 if config_ok else 0)
        self.reload_ok.labels("rules").set(1 if rules_ok else 0)

    def set_blind_spots(self, spots: Iterable[str]) -> None:
        """Reduced mode's blind spots (empty: full eBPF sensing)."""
        spots = {label(s) for s in spots}
        with self._lock:
            for gone in self._blind - spots:
                self.blind_spots.remove(gone)
            for spot in spots:
                self.blind_spots.labels(spot).set(1)
            self._blind = spots
        self.reduced_mode.set(1 if spots else 0)

    # -- pipeline ----------------------------------------------------------------------
    def count_event(self, kind: str, n: int = 1) -> None:
        self.events.labels(kind).inc(n)

    def set_queue(self, stage: str, depth: int) -> None:
        self.queue_depth.labels(stage).set(depth)

    def set_processes(self, n: int) -> None:
        self.processes.set(n)

    def observe_scoring(self, seconds: float) -> None:
        self.scoring_latency.observe(seconds)

    def declare_findings(self, rules: Iterable[str]) -> None:
        """gpuguard_findings_total at 0 for each verdict of each rule that can name a finding: a
        counter that first appears at 1 gives increase() no step to see, so an alert on it would
        miss the first finding of each rule after every start (docs/deploy.md, "Alerts")."""
        for rule in rules:
            for verdict in VERDICTS:
                self.findings.labels(rule, verdict)

    def count_sampler_error(self, source: str, n: int = 1) -> None:
        self.sampler_errors.labels(source).inc(n)

    def observe_log(self, writer: Any) -> None:
        """Copy a :class:`~gpuguard.outputs.log_writer.LogWriter`'s counters (call it periodically)."""
        name = writer.destination
        now = (writer.written, writer.dropped, writer.errors)
        with self._lock:
            before = self._log_seen.get(name, (0, 0, 0))
            self._log_seen[name] = now
        for value, previous, metric in zip(
            now,
            before,
            (
                self.log_records.labels(name),
                self.log_dropped.labels(name, "queue-full"),
                self.log_dropped.labels(name, "write-failed"),
            ),
            strict=False,
        ):
            if value > previous:
                metric.inc(value - previous)
        self.set_queue(f"log:{name}", writer.queue_depth)
        if hasattr(writer.sink, "spooled"):  # a TCP syslog spool: lines waiting for the collector
            self.set_queue(f"spool:{name}", writer.spooled)

    def observe_snapshot(
        self, snapshot: GpuSnapshot, comm_of: Any = None, pod_of: Any = None
    ) -> None:
        """One sampler snapshot into the GPU series (:meth:`GpuSeries.observe`); its ``errors``
        count as sampler errors."""
        if snapshot.errors:
            self.count_sampler_error(snapshot.source, len(snapshot.errors))
        self.gpus.observe(snapshot, comm_of, pod_of)

    # -- cumulative totals ---------------------------------------------------------------
    def _advance(self, metric: Any, labels: tuple[str, ...], total: float) -> None:
        """Bring a counter up to ``total`` (a count the agent keeps itself); a smaller total
        (the agent's counters were reset) becomes the new base instead of a negative step."""
        key = (id(metric), labels)
        with self._lock:
            before = self._totals.get(key, 0.0)
            self._totals[key] = total
        if total > before:
            (metric.labels(*labels) if labels else metric).inc(total - before)

    def sync_totals(self, totals: dict[str, Any]) -> None:
        """Counters and gauges from the agent's own running totals.

        ``totals`` is the ``counters`` object of the agent's status file: ``events_by_kind``
        {kind: n}, ``ring_lost`` {what: n}, ``intake`` {depth, dropped {producer: n}},
        ``output`` {depth, lines, dropped, errors}, ``sampler_errors`` {source: n},
        ``processes_tracked``, ``findings`` {"RULE/VERDICT": n}, ``actions``
        {"ACTION/STATUS": n}, ``touch_kills`` {reason: n}, ``rule_would_act`` / ``rule_acted`` {"RULE/ACTION": n},
        ``host_findings_active`` {rule: n},
        ``execs`` (the exec filter's counts, :meth:`_sync_execs`), ``stages`` {stage: {work: n}}
        (each stage's own counts, named by the stage).  Missing keys are left alone.
        """
        for kind, n in (totals.get("events_by_kind") or {}).items():
            self._advance(self.events, (str(kind),), n)
        if "ring_lost" in totals:
            self._advance(self.ring_lost, (), sum((totals["ring_lost"] or {}).values()))
        for stage in ("intake", "output"):
            part = totals.get(stage) or {}
            if "depth" in part:
                self.set_queue(stage, part["depth"])
            dropped = part.get("dropped")
            if isinstance(dropped, dict):
                for producer, n in dropped.items():
                    self._advance(self.queue_dropped, (f"{stage}:{producer}",), n)
            elif dropped is not None:
                self._advance(self.queue_dropped, (stage,), dropped)
        output = totals.get("output") or {}
        if "lines" in output:
            self._advance(self.log_records, ("log",), output["lines"])
        if "errors" in output:
            self._advance(self.log_dropped, ("log", "write-failed"), output["errors"])
        for source, n in (totals.get("sampler_errors") or {}).items():
            self._advance(self.sampler_errors, (str(source),), n)
        if "processes_tracked" in totals:
            self.set_processes(totals["processes_tracked"])
        for key, n in (totals.get("findings") or {}).items():
            rule, _, verdict = str(key).rpartition("/")
            self._advance(self.findings, (rule, verdict), n)
        for key, n in (totals.get("actions") or {}).items():
            action, _, status = str(key).rpartition("/")
            self._advance(self.actions, (action, status), n)
        for reason, n in (totals.get("touch_kills") or {}).items():
            self._advance(self.touch_kills, (str(reason),), n)
        for name, metric in (
            ("rule_would_act", self.rule_would_act),
            ("rule_acted", self.rule_acted),
        ):
            for key, n in (totals.get(name) or {}).items():
                rule, _, action = str(key).rpartition("/")
                self._advance(metric, (rule, action), n)
        if "host_findings_active" in totals:
            self.set_host_findings(totals["host_findings_active"] or {})
        if totals.get("execs"):
            self._sync_execs(totals["execs"])
        for stage, counts in (totals.get("stages") or {}).items():
            for work, n in counts.items():
                self.stage_work.labels(str(stage), str(work))  # exported at 0 too
                self._advance(self.stage_work, (str(stage), str(work)), n)

    def _sync_execs(self, execs: dict[str, Any]) -> None:
        """The exec filter's counts (the status file's ``execs``: ``aggregated``, ``sent_up``,
        ``promoted_by_kernel``, ``promoted_by_age``, ``promoted_as_ancestors``, ``pending_full``,
        ``cgroups_full``), all taken at one moment by the sensor."""
        promoted = {when: int(execs.get(key, 0)) for when, key in EXEC_SENT_UP.items() if key}
        # the kernel's promotion count may be ahead of the records read: never step back
        at_exec = self._execs_at_exec = max(
            self._execs_at_exec, int(execs.get("sent_up", 0)) - sum(promoted.values())
        )
        kept = int(execs.get("aggregated", 0))
        self._advance(self.execs_kept, (), kept)
        self._advance(self.execs_seen, (), kept + at_exec)
        for when, n in {"exec": at_exec, **promoted}.items():
            self._advance(self.execs_sent_up, (when,), n)
        self._advance(self.exec_filter_full, ("pending",), int(execs.get("pending_full", 0)))
        self._advance(self.exec_filter_full, ("cgroups",), int(execs.get("cgroups_full", 0)))

    def set_blocks(self, by_kind: dict[str, int], kinds: Iterable[str] = ()) -> None:
        """Blocks in place by kind; every kind in ``kinds`` reads 0 when it has none."""
        for kind in set(kinds) | set(by_kind):
            self.blocks.labels(label(kind)).set(by_kind.get(kind, 0))

    def set_host_findings(self, active: dict[str, int]) -> None:
        """Active host findings by rule; a rule with none left reads 0 (not absent: alerts see it drop)."""
        with self._lock:
            self._host_rules |= set(active)
            rules = set(self._host_rules)
        for rule in rules:
            self.host_findings.labels(rule).set(active.get(rule, 0))

    # -- export ------------------------------------------------------------------------
    def serve(
        self,
        address: str,
        health: AgentHealth | None = None,
        web: WebConfig | None = None,
        on_problem: Any = None,
        before_scrape: Callable[[], None] | None = None,
    ) -> MetricsServer:
        """Serve these metrics on ``HOST:PORT`` (:func:`gpuguard.outputs.metrics_http.serve`);
        ``before_scrape`` runs (in the request's thread) before each answer is rendered."""
        app = make_wsgi_app(self.registry)
        if before_scrape is not None:
            render = app

            def app(environ: dict, start_response: Callable) -> Any:
                before_scrape()
                return render(environ, start_response)

        return serve(address, app, health, web, on_problem)


# The samples each kind of metric serves (no *_created: see AgentMetrics.__init__).
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> frozenset[str]:
    """The sample names (what Prometheus stores) of every metric defined in ``registry``."""
    return frozenset(
        family.name + suffix
        for family in registry.collect()
        for suffix in SAMPLE_SUFFIXES[family.type]
    )


@functools.cache
def metric_names(per_process_gpu: bool = False) -> frozenset[str]:
    """What the exporter serves, read from the definitions above; ``per_process_gpu``: with the
    series ``metrics.per_process_gpu: true`` adds."""
    return sample_names(AgentMetrics(per_process_gpu=per_process_gpu).registry)
