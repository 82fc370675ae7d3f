"""The agent's counters: one plain object every reader (status file, metrics, summary line) reads.

Writers are the agent's threads; each field has one writer stage, so plain
``+=`` on ints and dict items is enough (CPython's GIL makes each update
atomic enough for counters).  Readers take :meth:`AgentCounters.snapshot`.
"""

from __future__ import annotations

import secrets
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

# Scoring latency histogram bucket upper bounds, seconds (Prometheus-style, cumulative on export).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAST_FINDINGS = 20
RULE_PROCESSES = 3  # process names the status listing keeps per rule


def _counts() -> defaultdict:
    return defaultdict(int)


def new_run_id() -> str:
    """This agent run's id (48 random bits): in every record id, so no two runs on a host
    write the same one."""
    return secrets.token_hex(6)


@dataclass
class AgentCounters:
    """Everything the agent counts.  Field meanings are in docs/agent.md ("Counters")."""

    started: float = field(default_factory=time.time)
    run_id: str = field(default_factory=new_run_id)
    mode: str = "monitor"
    sensor_mode: str = ""  # "ebpf" or "proc" (reduced)
    blind_spots: list[str] = field(default_factory=list)
    probes_attached: int = 0
    headers: str = ""  # the kernel headers the probes compiled against: kind
    headers_why: str = ""  # where they are and why those (kernel_headers.HeaderSource)
    rules_version: str = ""  # the first characters of rules_digest
    rules_digest: str = ""  # SHA-256 of the rule files as loaded
    rules_generation: int = 0
    rules_error: str | None = None  # the last reload that failed, until one succeeds
    config_error: str | None = None  # the agent config's last failed reload, until one succeeds
    # intake: everything that reaches the correlator
    events_by_kind: defaultdict = field(default_factory=_counts)  # sensor events by kind
    ring_lost: defaultdict = field(default_factory=_counts)  # kernel-side losses by what
    intake_dropped: defaultdict = field(
        default_factory=_counts
    )  # by producer: sensor, sampler, sweep
    intake_depth: int = 0
    # the sensor's exec filter: execs kept in the kernel (total, top cgroups) and those sent up later
    execs: dict = field(default_factory=dict)
    # the FPU rounding-mode probe's gate: attached now, re-attaches, the spin watch's looks
    fpu_probe: dict = field(default_factory=dict)
    intake_capacity: int = 0
    # samplers
    samples: defaultdict = field(default_factory=_counts)  # by source
    sampler_errors: defaultdict = field(default_factory=_counts)  # by source
    sampler_seconds: defaultdict = field(
        default_factory=lambda: defaultdict(float)
    )  # thread CPU by source
    sweeps: int = 0
    sweep_seconds: float = 0.0
    # detect
    items_correlated: int = 0
    processes_tracked: int = 0
    scoring_runs: int = 0
    scoring_latency_buckets: list[int] = field(
        default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1)
    )
    scoring_latency_sum: float = 0.0
    findings: defaultdict = field(default_factory=_counts)  # by (rule_id, verdict)
    actions: defaultdict = field(default_factory=_counts)  # by (action, status)
    touch_kills: defaultdict = field(default_factory=_counts)  # kill-on-touch kills by reason
    # rule by rule (respond.intent): acting steps a rule's matches planned, by (rule, action):
    # held back (monitor mode, the rule in monitor mode, refused, a dry run) or taken
    rule_would_act: defaultdict = field(default_factory=_counts)
    rule_acted: defaultdict = field(default_factory=_counts)
    rule_processes: dict = field(default_factory=dict)  # rule -> the latest process names (3)
    last_findings: deque = field(default_factory=lambda: deque(maxlen=LAST_FINDINGS))
    last_actions: deque = field(default_factory=lambda: deque(maxlen=LAST_FINDINGS))
    host_findings: list = field(default_factory=list)  # active GPU host findings (rows for status)
    host_findings_active: dict = field(default_factory=dict)  # rule_id -> active count
    # output
    output_lines: int = 0
    output_dropped: int = 0
    output_errors: int = 0
    output_spooled: int = 0  # lines waiting in the TCP syslog spool for the collector
    output_depth: int = 0
    output_capacity: int = 0
    log_faults: int = 0  # times the log destination started failing (or a record broke)
    last_output_error: str = ""  # the last of those, as reported on stderr
    status_errors: int = 0  # state file writes that failed
    last_status_error: str = ""
    # each stage's own work counts (its ``counts``), by stage name, as the stages were built
    stages: dict[str, dict[str, int]] = field(default_factory=dict)
    # latest GPU view for metrics: (vendor, index) -> {"util":, "memory_used":, "memory_total":, "power_w":}
    gpus: dict = field(default_factory=dict)

    def observe_scoring(self, seconds: float) -> None:
        self.scoring_runs += 1
        self.scoring_latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.scoring_latency_buckets[i] += 1
                return
        self.scoring_latency_buckets[-1] += 1

    def count_intent(self, per_rule: dict, taken: set[str], enforcing: tuple, name: str) -> None:
        """One verdict's acting steps by rule: ``taken`` (done, through a rule in ``enforcing``)
        or held back; ``name``: the process, for the status listing."""
        for rule, steps in per_rule.items():
            for step in steps:
                if step in taken and rule in enforcing:
                    self.rule_acted[(rule, step)] += 1
                else:
                    self.rule_would_act[(rule, step)] += 1
            if steps:
                names = self.rule_processes.setdefault(rule, deque(maxlen=RULE_PROCESSES))
                if name not in names:
                    names.append(name)

    def events_total(self) -> int:
        return sum(self.events_by_kind.values())

    def drops_total(self) -> int:
        return (
            sum(self.ring_lost.values()) + sum(self.intake_dropped.values()) + self.output_dropped
        )

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy (the status file's ``counters``)."""
        return {
            "events_by_kind": dict(self.events_by_kind),
            "ring_lost": dict(self.ring_lost),
            "intake": {
                "depth": self.intake_depth,
                "capacity": self.intake_capacity,
                "dropped": dict(self.intake_dropped),
            },
            "output": {
                "depth": self.output_depth,
                "capacity": self.output_capacity,
                "lines": self.output_lines,
                "dropped": self.output_dropped,
                "errors": self.output_errors,
                "spooled": self.output_spooled,
                "faults": self.log_faults,
            },
            "execs": dict(self.execs),
            "fpu_probe": dict(self.fpu_probe),
            "samples": dict(self.samples),
            "sampler_errors": dict(self.sampler_errors),
            "sampler_seconds": {k: round(v, 4) for k, v in self.sampler_seconds.items()},
            "sweeps": self.sweeps,
            "sweep_seconds": round(self.sweep_seconds, 3),
            "items_correlated": self.items_correlated,
            "processes_tracked": self.processes_tracked,
            "scoring_runs": self.scoring_runs,
            "scoring_seconds": round(self.scoring_latency_sum, 4),
            "findings": {f"{rule}/{verdict}": n for (rule, verdict), n in self.findings.items()},
            "actions": {f"{action}/{status}": n for (action, status), n in self.actions.items()},
            "touch_kills": dict(self.touch_kills),
            "rule_would_act": {f"{r}/{a}": n for (r, a), n in self.rule_would_act.items()},
            "rule_acted": {f"{r}/{a}": n for (r, a), n in self.rule_acted.items()},
            "host_findings_active": dict(self.host_findings_active),
            "stages": {name: dict(counts) for name, counts in self.stages.items()},
        }
