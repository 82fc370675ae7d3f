"""The agent's outputs besides actions: its SIEM log and its Prometheus metrics, and how its counters reach them.

:class:`AgentTelemetry` owns the :class:`~gpuguard.outputs.log_writer.LogWriter`
(opened from the config's ``log.*`` keys) and, with a metrics address, the
:class:`~gpuguard.outputs.metrics.AgentMetrics` exporter and its HTTP server.
The detect loop calls it:

* :meth:`~AgentTelemetry.write` for every record (never blocks or raises);
* :meth:`~AgentTelemetry.sync_log` on every pass: the writer's counts into
  :class:`~gpuguard.agent.counters.AgentCounters`, and its faults on stderr (a
  broken log cannot carry its own fault), counted and kept for ``status``;
* :meth:`~AgentTelemetry.observe_item` / :meth:`~AgentTelemetry.observe_scoring`
  as items are fed and scored, :meth:`~AgentTelemetry.sync_metrics` on every
  state-file tick, :meth:`~AgentTelemetry.count_reload` on reloads.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.log_writer import LogWriter, open_log
from gpuguard.outputs.metrics import AgentMetrics, MetricsServer

_DESTINATIONS = "a file path, - (stdout), or syslog[:unix:PATH|udp:HOST:PORT|tcp:HOST:PORT]"


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

    def serve_metrics(self) -> None:
        """Serve /metrics at the configured address (none configured: nothing to do)."""
        address = self.config.metrics_address
        if not address:
            return
        metrics = AgentMetrics()
        try:
            self.server = metrics.serve(address)
        except ValueError as exc:
            raise GpuguardError(
                str(exc), "give --metrics-address (or metrics.address) as HOST:PORT"
            ) from None
        except OSError as exc:
            raise GpuguardError(
                f"cannot serve metrics on {address}: {exc.strerror or exc}",
                "choose a free port for --metrics-address (or metrics.address)",
            ) from None
        self.metrics = metrics
        metrics.set_rules(self.counters.rules_version, loaded_at=time.time())

    def started(self, mode: str) -> None:
        """Start-up is done: the sensor mode and reduced mode's blind spots are known."""
        if self.metrics is not None:
            self.metrics.set_agent(mode, self.counters.sensor_mode)
            self.metrics.set_blind_spots(self.counters.blind_spots)

    # -- the loop -----------------------------------------------------------------------
    def write(self, record: Any) -> None:
        if self.writer is not None:
            self.writer.write(record)

    def sync_log(self, into_log: bool = True) -> None:
        """The writer's counts into the counters; its faults on stderr, counted.  Only the note
        that a destination works again is written to the log (it names the gap's losses): a
        failure note sent to the destination that failed would feed the failure."""
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
            if into_log and fault.detail.get("recovered"):
                writer.write(fault)

    def observe_item(self, item: Any, comm_of: Callable[[int], str | None]) -> None:
        """A GPU snapshot just fed to the correlator (which names its pids) into the GPU gauges."""
        if self.metrics is not None and type(item) is GpuSnapshot:
            self.metrics.count_event("gpu_snapshot")
            self.metrics.observe_snapshot(item, comm_of=comm_of)

    def observe_scoring(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_scoring(seconds)

    def sync_metrics(self) -> None:
        """The agent's running totals into the exporter; the log's own counts come from the writer
        (observe_log), so the status file's ``output`` totals are left out (no double count)."""
        metrics = self.metrics
        if metrics is None:
            return
        totals = self.counters.snapshot()
        totals.pop("output", None)
        metrics.sync_totals(totals)
        if self.writer is not None:
            metrics.observe_log(self.writer)

    def count_reload(self, ok: bool, mode: str) -> None:
        if self.metrics is not None:
            self.metrics.count_reload(ok)
            if ok:
                self.metrics.set_rules(self.counters.rules_version, loaded_at=time.time())
            self.metrics.set_agent(mode, self.counters.sensor_mode)

    # -- teardown -----------------------------------------------------------------------
    def close_log(self) -> None:
        """Write out what is queued (the stop line included) and close the destination."""
        if self.writer is not None:
            self.writer.close()
            self.sync_log(into_log=False)

    def close_metrics(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
