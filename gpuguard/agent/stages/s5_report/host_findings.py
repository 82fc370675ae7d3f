"""The agent's host findings (orphaned GPU memory, past GPU users, host tuning), kept as a live set.

Data flow: the GPU snapshots and NVML accounting records the samplers queue
(:meth:`GpuHostFindings.observe`, called as the detect loop feeds them) ->
every ``sampling.host_check_interval_s`` the host checks
:mod:`gpuguard.detect.host.check_list` lists for the agent (one list with ``gpuguard scan``)
-> :meth:`GpuHostFindings.check` returns what changed as
:class:`~gpuguard.outputs.finding.Finding` records.

Details: docs/internals.md, "host_findings".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuguard.detect.host.check_list import AGENT, HostInputs, run_host_checks
from gpuguard.detect.host.checks import HostFinding, apply_thresholds
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.outputs.finding import Finding, finding_from_host
from gpuguard.sources.host.observation import gpu_pid_states

# Past heavy users are history, not a condition that ends: each is written once (while accounting
# still remembers the pid it is not repeated), never listed as active and never resolved.
EVENT_RULES = frozenset({"host-gpu-past-heavy-user"})
# Host state read directly (no sample race): reported on the first check that finds it.
TUNING_RULES = frozenset({"host-msr-writes-enabled", "host-hugepages-reserved"})
MATERIAL_GROWTH = 0.25  # re-report a finding whose amount grew by more than this fraction
ACCOUNTING_KEEP_CHECKS = (
    3  # an accounting record not re-read for this many check intervals is forgotten
)


@dataclass(slots=True)
class _Reported:
    finding: HostFinding  # as last reported
    since: float  # when it was first reported


def _key(finding: HostFinding) -> tuple[str, str]:
    return finding.rule_id, finding.subject


class GpuHostFindings:
    """The host findings now active, and what the samplers last said (see the module docstring)."""

    INPUTS = frozenset({GpuSnapshot, GpuAccounting})  # the item types :meth:`observe` keeps

    def __init__(self, interval_s: float, tuning_root: str | None = None) -> None:
        self.interval_s = interval_s
        self.tuning_root = (
            tuning_root  # where /sys and /proc are read for host tuning; None: not checked
        )
        self._snapshots: dict[str, GpuSnapshot] = {}  # newest live snapshot per source
        self._accounting: dict[tuple[str, int, int], tuple[float, GpuAccounting]] = {}
        self._active: dict[tuple[str, str], _Reported] = {}
        # found once, waiting for a check over newer snapshots: a process that exits between a
        # sample and the check looks like a vanished holder until the next sample
        self._pending: dict[tuple[str, str], int] = {}  # key -> snapshots seen when first found
        self._snapshots_seen = 0
        self._told: set[tuple[str, str]] = set()  # EVENT_RULES findings written, while still found

    def observe(self, item: object) -> None:
        """Keep the newest live GPU snapshot of each source and the accounting records."""
        if type(item) is GpuSnapshot:
            if not any(d.extra.get("history") for d in item.devices):
                self._snapshots[item.source] = item
                self._snapshots_seen += 1
        elif type(item) is GpuAccounting:
            self._accounting[(item.vendor, item.device_index, item.pid)] = (time.monotonic(), item)

    def accounting(self) -> list[GpuAccounting]:
        """The accounting records still current (re-read within the last few check intervals)."""
        horizon = time.monotonic() - ACCOUNTING_KEEP_CHECKS * self.interval_s
        return [record for seen, record in list(self._accounting.values()) if seen >= horizon]

    def _forget_old_accounting(self) -> None:
        horizon = time.monotonic() - ACCOUNTING_KEEP_CHECKS * self.interval_s
        for key in [k for k, (seen, _) in self._accounting.items() if seen < horizon]:
            del self._accounting[key]

    def check(self, now: float, thresholds: Thresholds) -> list[Finding]:
        """Run the checks; the records to write for what appeared, changed materially or went away."""
        snapshots = list(self._snapshots.values())
        view = self._snapshots_seen
        self._forget_old_accounting()
        accounting = self.accounting()
        # Without a sample the GPU checks do not run: what the GPU findings said still stands.
        inputs = HostInputs(tuning_root=self.tuning_root)
        if snapshots:
            inputs.snapshots, inputs.pid_states = snapshots, gpu_pid_states(snapshots)
            inputs.accounting = accounting
        found = run_host_checks(AGENT, inputs)  # the checks detect.host.check_list lists for it
        apply_thresholds(found, thresholds)
        out: list[Finding] = []
        seen: set[tuple[str, str]] = set()
        pending: dict[tuple[str, str], int] = {}
        told: set[tuple[str, str]] = set()
        for finding in found:
            key = _key(finding)
            if key in seen:
                continue
            seen.add(key)
            if finding.rule_id in EVENT_RULES:
                if key not in self._told:
                    out.append(finding_from_host(finding, "create", now))
                told.add(key)
                continue
            previous = self._active.get(key)
            if previous is None:
                first_view = self._pending.get(key, view)
                if (
                    first_view == view and finding.rule_id not in TUNING_RULES
                ):  # not yet confirmed by a newer sample
                    pending[key] = first_view
                    continue
                self._active[key] = _Reported(finding, now)
                out.append(finding_from_host(finding, "create", now))
            elif _material_change(previous.finding, finding):
                previous.finding = finding
                out.append(finding_from_host(finding, "update", now))
        for key in [
            k for k in self._active if k not in seen and (snapshots or k[0] in TUNING_RULES)
        ]:
            out.append(finding_from_host(self._active.pop(key).finding, "close", now))
        self._pending, self._told = pending, told
        return out

    def active(self) -> list[dict]:
        """The active findings for the state file (``gpuguard status``), oldest first."""
        rows = []
        for reported in sorted(self._active.values(), key=lambda r: r.since):
            f = reported.finding
            rows.append(
                {
                    "rule_id": f.rule_id,
                    "since": reported.since,
                    "device": f.device,
                    "memory_bytes": f.amount,
                    "owner_pid": f.pid,
                    "verdict": f.verdict,
                    "detail": f.detail,
                }
            )
        return rows

    def active_by_rule(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for rule_id, _ in self._active:
            counts[rule_id] = counts.get(rule_id, 0) + 1
        return counts


def _material_change(before: HostFinding, after: HostFinding) -> bool:
    """Worth a new record: the amount grew by more than MATERIAL_GROWTH, or a likely owner is
    named that the last record did not name.  An owner no longer named is not news: its
    accounting record was only not re-read in time (a sampler late on a busy host), and the
    finding would otherwise flap, an update without the owner, then one with it again."""
    if after.pid is not None and after.pid != before.pid:
        return True
    if after.amount is None or before.amount is None:
        return after.amount is not None and before.amount is None
    return after.amount > before.amount * (1 + MATERIAL_GROWTH)
