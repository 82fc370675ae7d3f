"""The agent's outputs besides actions: its SIEM log and Prometheus metrics, fed from its counters.

:class:`AgentTelemetry` owns the :class:`~gpuguard.outputs.log_writer.LogWriter`
(opened from the config's ``log.*`` keys) and, with a metrics address, the
:class:`~gpuguard.outputs.metrics.AgentMetrics` exporter and its HTTP server.
The detect loop calls it.

Details: docs/internals.md, "telemetry".
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.log_writer import LogWriter, open_log
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.outputs.metrics_http import AgentHealth, MetricsServer
from gpuguard.outputs.web_config import load_web_config
from gpuguard.sources.proc.pod_names import PodNames, PodRef

STALL_ENV = "GPUGUARD_FAULT_STALL_LOOP"
SCRAPE_SYNC_WAIT_S = 0.5  # a scrape waits this long at most for the loop's fresh totals
STALL_MAX_S = 3600.0  # a forgotten stall file does not hold the loop for ever

_DESTINATIONS = "a file path, - (stdout), or syslog[:unix:PATH|udp:HOST:PORT|tcp:HOST:PORT]"


def finding_rules(ruleset: Any, config: AgentConfig) -> list[str]:
    """Every rule id an agent finding can be named after: the enabled rules, the config's guard
    policies (``guard.ID``) and the GPU host checks the agent runs."""
    from gpuguard.detect.host.check_list import AGENT, HOST_CHECKS

    host = [rule for check in HOST_CHECKS if AGENT in check.runs_in for rule in check.rules]
    guards = [f"guard.{policy.id}" for policy in config.guard_policies]
    return [rule.id for rule in ruleset.rules] + guards + host


def log_fault_line(fault: AgentLifecycle, destination: str) -> str:
    """One stderr line for a log writer fault, saying what failed and that detection goes on."""
    detail = fault.detail
    if detail.get("recovered"):
        return fault.message
    number = detail.get("errno")
    if not isinstance(number, int):
        return f"{fault.message}; detection goes on"
    what = "stdout" if destination in ("-", "stdout") else escape_text(destination)
    hint = {errno.EPIPE: "the reader of stdout went away", errno.ENOSPC: "the disk is full"}.get(
        number, os.strerror(number)
    )
    return f"cannot write the log to {what} ({hint}); records are lost until it works again, detection goes on"


class AgentTelemetry:
    """The log writer and the metrics exporter of one agent; see the module docstring."""

    def __init__(
        self, config: AgentConfig, counters: AgentCounters, stderr: Callable[[str], None]
    ) -> None:
        self.config, self.counters, self.stderr = config, counters, stderr
        self.writer: LogWriter | None = None
        self.metrics: AgentMetrics | None = None
        self.server: MetricsServer | None = None
        self.health = AgentHealth(config.health_stall_s)
        self._stall_file = os.environ.get(STALL_ENV) or None
        self.pod_names = PodNames()  # pod and container names from the kubelet's log links
        self.proc_root = "/proc"
        # Records start-up makes before the start record (a degraded line, the first sweep's
        # findings): held so the start record is the run's first; at most one per process the
        # first sweep finds, for the seconds start-up takes.
        self._held: list | None = []
        self._held_lock = threading.Lock()
        # /metrics asks the detect loop for fresh totals (it alone may read the counters whole);
        # nudge_loop ends the loop's wait (the agent sets it)
        self.nudge_loop: Callable[[], None] | None = None
        self._sync_wanted = threading.Event()
        self._synced = threading.Event()

    # -- start-up -----------------------------------------------------------------------
    def open_log(self) -> None:
        c = self.config
        try:
            self.writer = open_log(
                c.log_path,
                c.log_format,
                queue_size=c.output_queue,
                max_bytes=c.log_max_bytes,
                keep=c.log_keep,
                syslog_format=c.log_syslog_format,
                facility=c.log_facility,
                spool_dir=c.log_spool_dir,
                spool_max_bytes=c.log_spool_max_bytes,
                limits=OutputLimits(**c.log_limits),
            )
        except ValueError as exc:
            raise GpuguardError(
                f"cannot use the agent log {escape_text(c.log_path)!r}: {exc}",
                f"give --log (or log.path) {_DESTINATIONS}",
            ) from None
        self.counters.output_capacity = c.output_queue

    def serve_metrics(self, finding_rules: Iterable[str] = ()) -> None:
        """Serve /metrics at the configured address (none configured: nothing to do), with every
        (rule, verdict) of ``finding_rules`` exported at 0 from the start."""
        address = self.config.metrics_address
        if not address:
            return
        c = self.config
        web = load_web_config(Path(c.metrics_web_config)) if c.metrics_web_config else None
        metrics = AgentMetrics(per_process_gpu=c.per_process_gpu, max_pod_series=c.max_pod_series)
        metrics.started.set(self.counters.started)  # the start record's time too
        metrics.declare_findings(finding_rules)
        try:
            self.server = metrics.serve(
                address,
                self.health,
                web,
                on_problem=lambda line: self.stderr(f"gpuguard: {line}"),
                before_scrape=self._fresh_for_scrape,
            )
        except ValueError as exc:
            raise GpuguardError(
                str(exc), "give --metrics-address (or metrics.address) as HOST:PORT"
            ) from None
        except OSError as exc:
            port = address.rpartition(":")[2]
            if exc.errno == errno.EADDRINUSE:
                raise GpuguardError(
                    f"cannot serve metrics on {address}: Address already in use "
                    f"(another program listens on port {port})",
                    f"set metrics.address in {c.source or '/etc/gpuguard/agent.yaml'} "
                    "(or --metrics-address) to a free port",
                ) from None
            raise GpuguardError(
                f"cannot serve metrics on {address}: {exc.strerror or exc}",
                "choose another address for metrics.address (or --metrics-address)",
            ) from None
        self.metrics = metrics
        counters = self.counters
        metrics.set_rules(counters.rules_version, counters.rules_digest, loaded_at=time.time())

    def declare_findings(self, finding_rules: Iterable[str]) -> None:
        """Rules a reload brought: their finding counters start at 0 (an alert sees the first)."""
        if self.metrics is not None:
            self.metrics.declare_findings(finding_rules)

    def started(self, mode: str) -> None:
        """Start-up is done: the sensor mode and reduced mode's blind spots are known."""
        if self.metrics is not None:
            self.metrics.set_agent(mode, self.counters.sensor_mode, self.counters.headers)
            self.metrics.set_blind_spots(self.counters.blind_spots)

    def watch(self, ready: Any, threads: list) -> None:
        """Start-up is done: /readyz and /healthz follow ``ready`` (an Event) and the producers."""
        counters = self.counters
        sensor = next((t for t in threads if t.name == "gpuguard-sensor"), None)
        samplers = [t for t in threads if hasattr(t, "unavailable")]

        def ready_reason() -> str | None:
            if not ready.is_set():
                return "starting"
            if counters.sensor_mode != "proc" and counters.probes_attached <= 0:
                return "no probes attached and reduced mode not declared"
            waiting = [
                t.source
                for t in samplers
                if t.sampler is None
                and t.unavailable is None
                and not counters.sampler_errors.get(t.source)
            ]
            if waiting:
                return f"GPU samplers not opened yet: {', '.join(waiting)}"
            return None

        self.health.ready_reason = ready_reason
        if sensor is not None and counters.probes_attached > 0:
            self.health.sensor_alive = sensor.is_alive
            self.health.sensor_polled = lambda: sensor.polled_at or self.health.loop_at

    # -- the loop -----------------------------------------------------------------------
    def loop_turned(self) -> None:
        """One detect-loop cycle (liveness); the fault-injection stall, when asked for, is here."""
        self.health.loop_turned()
        if self._stall_file is not None and os.path.exists(self._stall_file):
            self.stderr(
                f"gpuguard: fault injection: detect loop stalled while {self._stall_file} exists"
            )
            until = time.monotonic() + STALL_MAX_S
            while os.path.exists(self._stall_file) and time.monotonic() < until:
                time.sleep(0.1)

    def write(self, record: Any) -> None:
        if self._held is not None:
            with self._held_lock:
                if self._held is not None:
                    self._held.append(record)
                    return
        if self.writer is not None:
            self.writer.write(record)

    @property
    def holding(self) -> bool:
        """Whether records still wait for the run's start record."""
        return self._held is not None

    def release(self, first: Any = None) -> None:
        """Write ``first`` (the run's start or start-failed record), then the records start-up
        made before it, in their order; from now on records go straight to the log."""
        with self._held_lock:
            held, self._held = self._held, None
            if self.writer is not None:
                for record in [first] if first is not None else []:
                    self.writer.write(record)
                for record in held or []:
                    self.writer.write(record)

    def sync_log(self) -> None:
        """The writer's counts into the counters; its faults on stderr, counted.  None goes to the
        log: a failure note sent to the destination that failed would feed the failure, and the
        writer marks a gap in the log itself (the first record the destination takes again)."""
        writer = self.writer
        if writer is None:
            return
        c = self.counters
        c.output_lines, c.output_dropped = writer.written, writer.dropped
        c.output_errors, c.output_depth = writer.errors + writer.render_errors, writer.queue_depth
        c.output_spooled = writer.spooled
        for fault in writer.take_faults():
            line = log_fault_line(fault, self.config.log_path)
            if not fault.detail.get("recovered"):
                c.log_faults += 1
                c.last_output_error = line
            self.stderr(f"gpuguard: {line}")

    def flush_log(self, timeout: float) -> None:
        """Let the writer take what is queued (at most ``timeout`` s), then sync its counts."""
        if self.writer is not None:
            self.writer.flush(timeout)
        self.sync_log()

    def observe_item(self, item: Any, comm_of: Callable[[int], str | None]) -> None:
        """A GPU snapshot just fed to the correlator (which names its pids) into the GPU gauges."""
        if self.metrics is not None and type(item) is GpuSnapshot:
            self.metrics.count_event("gpu_snapshot")
            self.metrics.observe_snapshot(item, comm_of=comm_of, pod_of=self._pod_of)

    def _pod_of(self, pid: int) -> PodRef | None:
        return self.pod_names.of_pid(pid, self.proc_root)

    def observe_scoring(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_scoring(seconds)

    def _fresh_for_scrape(self) -> None:
        """A scrape is being answered (the metrics thread): the detect loop syncs the totals on its
        next turn, which this nudges; at most SCRAPE_SYNC_WAIT_S, then the last totals are served
        (a loop busy with a long batch).  An idle agent so syncs per scrape, not per turn."""
        if self.nudge_loop is None:
            return
        self._synced.clear()
        self._sync_wanted.set()
        self.nudge_loop()
        self._synced.wait(SCRAPE_SYNC_WAIT_S)

    def sync_metrics_if_wanted(self) -> None:
        """The detect loop's side of :meth:`_fresh_for_scrape` (once per turn)."""
        if self._sync_wanted.is_set():
            self._sync_wanted.clear()
            self.sync_metrics()
            self._synced.set()

    def sync_metrics(self) -> None:
        """The agent's running totals into the exporter; the log's own counts come from the writer
        (observe_log), so the status file's ``output`` totals are left out (no double count)."""
        metrics = self.metrics
        if metrics is None:
            return
        totals = self.counters.snapshot()
        totals.pop("output", None)
        metrics.sync_totals(totals)
        self._sync_blocks(metrics)
        if self.writer is not None:
            metrics.observe_log(self.writer)

    def _sync_blocks(self, metrics: AgentMetrics) -> None:
        """Blocks in place, from the response's block records (a few small files)."""
        from gpuguard.respond.actions import BLOCK_KINDS
        from gpuguard.respond.blocks import BlockStore

        try:
            blocks = BlockStore(self.config.response.state_dir).load()
        except GpuguardError:
            return
        by_kind: dict[str, int] = {}
        for block in blocks:
            by_kind[block.kind] = by_kind.get(block.kind, 0) + 1
        metrics.set_blocks(by_kind, BLOCK_KINDS)

    def count_reload(self, ok: bool, mode: str) -> None:
        if self.metrics is not None:
            self.metrics.count_reload(ok)
            self.metrics.set_reload_state(
                config_ok=self.counters.config_error is None,
                rules_ok=self.counters.rules_error is None,
            )
            if ok:
                c = self.counters
                self.metrics.set_rules(c.rules_version, c.rules_digest, loaded_at=time.time())
            self.metrics.set_agent(mode, self.counters.sensor_mode, self.counters.headers)

    # -- teardown -----------------------------------------------------------------------
    def close_log(self) -> None:
        """Write out what is queued (the stop line included) and close the destination."""
        if self.writer is not None:
            self.writer.close()
            self.sync_log()

    def close_metrics(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
