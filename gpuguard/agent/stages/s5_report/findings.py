"""Process findings over their life: one id, coalesced and rate-limited updates, a close with totals.

The policy (create, coalesced updates, escalation, close with totals) is what the detect
loop asks of :class:`ProcessFindings`; guard-policy records get their own id (:meth:`ProcessFindings.stamp_guard`).
Findings an earlier run left open (:mod:`gpuguard.agent.stages.s5_report.finding_ledger`) are continued: same
id, numbered on, the record that picks one up marked ``continued``.

Details: docs/internals.md, "findings".
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.model import VERDICT_RANK
from gpuguard.outputs.finding import Finding
from gpuguard.sources.proc.pod_names import PodNames

GPU_ABUSE_TAG = "gpu-abuse"
DEFAULT_UPDATE_INTERVAL_S = 30.0
POLL_S = 0.5  # open findings are checked for growth and exits this often
FORGOTTEN_CHECK_S = 10.0  # a process the correlator forgot (idle, evicted) is looked up this often
MAX_ACTIONS = 16  # actions a close record lists (the count is kept beyond)
MAX_SESSIONS = 64  # connections whose byte counts a finding keeps
GUARD_KEYS = 4096  # processes whose guard-policy record count is remembered


def finding_id(hostname: str, pid: int, start_time: float, kind: str = "process") -> str:
    """The id of the finding about one process on one host (40 characters, CEF's externalId);
    ``kind`` "guard" for its guard-policy finding, which has an id of its own."""
    text = f"{hostname}|{kind}-finding|{pid}|{start_time:.2f}"
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"gpuguard-{digest[:31]}"


@dataclass(frozen=True, slots=True)
class Said:
    """What one record said about a process, to compare with what is known now."""

    verdict: str
    rule_ids: frozenset[str]
    destinations: frozenset[tuple[str, int]]
    gpu: frozenset[str]  # device paths and classes
    exe: str

    @classmethod
    def of(cls, verdict: Any, state: ProcessState | None) -> Said:
        rules = frozenset(e.rule_id for e in verdict.evidence)
        if state is None:
            return cls(verdict.verdict, rules, frozenset(), frozenset(), verdict.exe or "")
        return cls(
            verdict.verdict,
            rules,
            frozenset(state.connections),
            frozenset(state.gpu_paths) | frozenset(state.gpu_device_classes),
            state.exe,
        )

    def growth(self, now: Said) -> list[str]:
        """What grew materially since this record: "verdict", "rules", "destination", "gpu", "exec"."""
        changes = []
        if now.verdict != self.verdict:
            changes.append("verdict")
        if now.rule_ids - self.rule_ids:
            changes.append("rules")
        if now.destinations - self.destinations:
            changes.append("destination")
        if now.gpu - self.gpu:
            changes.append("gpu")
        if now.exe and now.exe != self.exe:
            changes.append("exec")
        return changes


@dataclass(frozen=True, slots=True)
class Carried:
    """A finding an earlier agent run left open: its process and the last record's number."""

    key: ProcessKey
    sequence: int


@dataclass(slots=True)
class OpenFinding:
    """One process finding not yet closed."""

    finding_id: str
    key: ProcessKey
    verdict: Any  # the latest verdict
    said: Said  # what the latest record said
    written_at: float  # monotonic time of the latest record
    rank: int  # the highest verdict rank it has had (acted on once each)
    sequence: int = -1  # the latest record's number
    opened: float = 0.0
    actions: list[dict[str, Any]] = field(default_factory=list)
    actions_total: int = 0
    gpu_since: float | None = None
    gpu_memory_peak: int | None = None
    sessions: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    exe_sha256: str | None = None
    hashed_exe: str | None = None  # the executable path exe_sha256 is of
    glance: tuple = ()  # what poll last compared (see ProcessFindings.poll)
    verdicts: int = 0  # verdicts seen (a new one may hold new rule ids)
    alive_checked: float = float("-inf")  # when a process the correlator forgot was last looked up
    continued: bool = False  # an earlier run left it open: this run picked it up


@dataclass(slots=True)
class Write:
    """A record to write now for one finding."""

    finding: OpenFinding
    verdict: Any
    activity: str  # create | update | close
    sequence: int
    act: bool = False  # an escalation (or the create): hand it to the responder
    counts: bool = False  # a create or a verdict change: counted as a finding
    changes: list[str] = field(default_factory=list)
    totals: dict[str, Any] | None = None
    exit_code: int | None = None
    at: float = 0.0  # wall time of the write: an update's or close's record time
    continued: bool = False  # the record that picks up a finding an earlier run left open


class ProcessFindings:
    """The open process findings and the lifecycle policy of the module docstring."""

    def __init__(
        self,
        update_interval_s: float = DEFAULT_UPDATE_INTERVAL_S,
        hostname: str | None = None,
        exe_hash: Callable[[int, tuple | None], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pod_names: PodNames | None = None,
        wall: Callable[[], float] = time.time,
        run_id: str | None = None,
    ) -> None:
        self.update_interval_s = update_interval_s
        self.run_id = run_id  # the agent run's id: in every record id (unique across restarts)
        self.hostname = hostname or socket.gethostname()
        # the reader of a running image's hash (sources.proc.files.ExeHashes.of), called lazily
        # for a finding's records (the enrich stage set it already where the allowlist pins one)
        self.exe_hash = exe_hash
        self.clock = clock  # the rate limit's (monotonic)
        self.wall = wall  # a record's time, read at the same moment as the rate limit's
        self.pod_names = pod_names or PodNames()  # the kubelet's names of pods and containers
        self._open: dict[ProcessKey, OpenFinding] = {}
        # closed while the correlator still holds the process: a later verdict (a reload, a
        # parent's change) never opens its finding again (forget_closed prunes it)
        self._closed: set[ProcessKey] = set()
        self._next_poll = 0.0
        self._guard_records: OrderedDict[ProcessKey, int] = OrderedDict()  # records written
        self.carried: dict[str, Carried] = {}  # findings an earlier run left open, not picked up
        self._carried_keys: set[ProcessKey] = set()  # their processes (a cheap test per verdict)
        self.changed = False  # the open set or a record number moved since the ledger was saved

    def __len__(self) -> int:
        return len(self._open)

    def get(self, key: ProcessKey) -> OpenFinding | None:
        return self._open.get(key)

    def scored(self, verdict: Any, state: ProcessState | None, now: float) -> Write | None:
        """A new verdict: the create or escalation to write now, else None (growth waits for :meth:`poll`)."""
        rank = VERDICT_RANK.get(verdict.verdict, 0)
        found = self._open.get(verdict.key)
        if found is None:
            if verdict.key in self._closed:
                return None  # ended and closed: the dead are not judged again
            abuse = any(GPU_ABUSE_TAG in e.tags for e in verdict.evidence)
            # a finding an earlier run left open continues whatever the verdict now (a restarted
            # agent may not see again what convicted it, e.g. a pool login): it gets its close
            if rank == 0 and not abuse and verdict.key not in self._carried_keys:
                return None
            found = OpenFinding(
                finding_id(self.hostname, verdict.key.pid, verdict.key.start_time),
                verdict.key,
                verdict,
                Said.of(verdict, state),
                self.clock(),
                rank,
                opened=now,
            )
            carried = self.carried.pop(found.finding_id, None)
            if carried is not None and carried.key == verdict.key:
                found.sequence, found.continued = carried.sequence, True  # numbered on
                self._carried_keys.discard(carried.key)
            self._open[verdict.key] = found
            self._observe(found, state, now)
            return self._write(found, verdict, "create", state, act=rank > 0, counts=True)
        found.verdict = verdict
        found.verdicts += 1
        if rank <= found.rank:
            return None
        found.rank = rank
        grown = found.said.growth(Said.of(verdict, state))
        changes = ["escalation", *(c for c in grown if c != "verdict")]
        return self._write(found, verdict, "update", state, changes, act=True, counts=True)

    def poll(
        self, state_of: Callable[[ProcessKey], ProcessState | None], now: float, final: bool = False
    ) -> list[Write]:
        """Closes for ended processes and the coalesced updates now due (``final``: all pending ones)."""
        mono = self.clock()
        if not final and mono < self._next_poll:
            return []
        self._next_poll = mono + POLL_S
        out = []
        for key, found in list(self._open.items()):
            state = state_of(key)
            if state is None:  # the correlator forgot it: ended, or idle or evicted and running
                if final or mono < found.alive_checked + FORGOTTEN_CHECK_S:
                    continue
                found.alive_checked = mono
                if _running(key):  # not ended: its finding stays open (it may come back)
                    continue
            if state is None or state.exited:
                del self._open[key]
                if state is not None:
                    self._closed.add(key)
                out.append(self._close(found, state, now))
                continue
            self._observe(found, state, now)
            if not final and mono - found.written_at < self.update_interval_s:
                continue
            # the tables only grow: unchanged sizes, verdict and image mean nothing new to compare
            glance = (
                found.verdicts,
                len(state.connections),
                len(state.gpu_paths),
                len(state.gpu_device_classes),
                state.exe,
            )
            if glance == found.glance:
                continue
            found.glance = glance
            changes = found.said.growth(Said.of(found.verdict, state))
            if changes:
                counts = "verdict" in changes
                out.append(
                    self._write(found, found.verdict, "update", state, changes, counts=counts)
                )
        return out

    def forget_closed(self, state_of: Callable[[ProcessKey], ProcessState | None]) -> None:
        """Forget the closed findings of processes the correlator no longer holds, and the
        carried ones whose process ended before this run picked them up (housekeeping)."""
        self._closed = {key for key in self._closed if state_of(key) is not None}
        for fid, carried in list(self.carried.items()):
            if not _running(carried.key):
                del self.carried[fid]
                self._carried_keys.discard(carried.key)
                self.changed = True

    def carry(self, carried: dict[str, Carried]) -> None:
        """Findings an earlier run left open (its ledger): one picked up here is continued."""
        self.carried = {f: c for f, c in carried.items() if _running(c.key)}
        self._carried_keys = {c.key for c in self.carried.values()}
        self.changed = True

    def ledger(self) -> dict[str, Carried]:
        """What a later run needs to continue the open findings: this run's, and the carried
        ones not picked up yet (a second restart soon after the first loses none)."""
        self.changed = False
        out = dict(self.carried)
        for found in self._open.values():
            out[found.finding_id] = Carried(found.key, found.sequence)
        return out

    def note_action(
        self, pid: int, start_time: float, action: str, status: str, when: float
    ) -> None:
        """An action outcome about a process with an open finding (its close record lists them)."""
        found = self._open.get(ProcessKey(pid, start_time))
        if found is None:
            return
        found.actions_total += 1
        if len(found.actions) < MAX_ACTIONS:
            found.actions.append({"action": action, "status": status, "time": round(when, 3)})

    def stamp(self, finding: Finding, write: Write) -> Finding:
        """Put the lifecycle on a record built from the verdict: id, number, activity, growth, totals.

        An update or close is timed at its write, the moment the rate limit counts from: the
        pass's start, which a slow enrichment makes earlier, would put two updates less than
        an interval apart."""
        finding.finding_id = write.finding.finding_id
        finding.run_id = self.run_id
        finding.continued = write.continued
        finding.sequence = write.sequence
        finding.activity = write.activity
        finding.changes = list(write.changes)
        finding.totals = write.totals
        if write.activity != "create":
            finding.created = write.at  # about now, not the verdict's time
        if finding.process is not None:
            finding.process.exe_sha256 = write.finding.exe_sha256 or finding.process.exe_sha256
            if write.exit_code is not None:
                finding.process.exit_code = write.exit_code
            self._name_pod(finding)
        return finding

    def stamp_guard(self, finding: Finding, key: ProcessKey) -> Finding:
        """A guard-policy record: its finding id (one per process life) and its number in it."""
        sequence = self._guard_records.pop(key, -1) + 1
        self._guard_records[key] = sequence
        if len(self._guard_records) > GUARD_KEYS:
            self._guard_records.popitem(last=False)
        finding.finding_id = finding_id(self.hostname, key.pid, key.start_time, "guard")
        finding.run_id = self.run_id
        finding.sequence = sequence
        return finding

    # -- inside ------------------------------------------------------------------------
    def _name_pod(self, finding: Finding) -> None:
        """The pod's and container's names and the image (those the facts lack, when the node
        knows them now), and the ones still unknown."""
        p = finding.process
        if p is None or not (p.pod_uid or p.container_id):
            return
        if not (p.pod_namespace and p.pod_name and p.container_image):
            ref = self.pod_names.lookup(p.pod_uid, p.container_id)
            p.pod_namespace = p.pod_namespace or ref.namespace or None
            p.pod_name = p.pod_name or ref.pod or None
            p.container_name = p.container_name or ref.container or None
            p.container_image = p.container_image or ref.image or None
        known = {
            "namespace": p.pod_namespace,
            "pod": p.pod_name,
            "container": p.container_name,
            "image": p.container_image,
        }
        p.kubernetes_unknown = [name for name, value in known.items() if not value]

    def _write(
        self,
        found: OpenFinding,
        verdict: Any,
        activity: str,
        state: ProcessState | None,
        changes: list[str] | None = None,
        *,
        act: bool = False,
        counts: bool = False,
    ) -> Write:
        found.said = Said.of(verdict, state)
        found.written_at, at = self.clock(), self.wall()
        found.sequence += 1
        self.changed = True
        if state is not None and not state.exited:
            self._hash(found, state)
        continued = found.continued and activity == "create"
        return Write(
            found,
            verdict,
            activity,
            found.sequence,
            act,
            counts,
            changes or [],
            at=at,
            continued=continued,
        )

    def _close(self, found: OpenFinding, state: ProcessState | None, now: float) -> Write:
        if state is not None:
            self._observe(found, state, now)
        write = self._write(found, found.verdict, "close", state)
        write.totals = self._totals(found, state, now)
        write.exit_code = state.exit_code if state is not None else None
        return write

    def _hash(self, found: OpenFinding, state: ProcessState) -> None:
        """The sha256 of the running image, once per executable: the enrich stage's where the
        allowlist pinned one, else read now through ``exe_hash``."""
        if state.exe == found.hashed_exe:
            return
        found.hashed_exe = state.exe
        if state.exe_sha256:
            found.exe_sha256 = state.exe_sha256
        elif self.exe_hash is not None:
            identity = state.facts.exe_identity if state.facts is not None else None
            found.exe_sha256 = self.exe_hash(state.pid, identity)

    def _observe(self, found: OpenFinding, state: ProcessState | None, now: float) -> None:
        """Keep what the close record totals: GPU hold time, peak GPU memory, bytes per connection."""
        if state is None:
            return
        if found.gpu_since is None and (state.gpu_paths or state.gpu_device_classes):
            found.gpu_since = now
        memory = state.gpu_memory.latest
        lifetime = state.gpu_lifetime
        for value in (memory, lifetime.max_memory if lifetime is not None else None):
            if value is not None and (
                found.gpu_memory_peak is None or value > found.gpu_memory_peak
            ):
                found.gpu_memory_peak = int(value)
        for fd, activity in state.sessions.items():
            ident = (fd, activity.remote)
            if ident in found.sessions or len(found.sessions) < MAX_SESSIONS:
                before = found.sessions.get(ident, (0, 0))
                found.sessions[ident] = (
                    max(before[0], activity.stack_bytes_out or activity.bytes_out or 0),
                    max(before[1], activity.bytes_in or 0),
                )

    def _totals(self, found: OpenFinding, state: ProcessState | None, now: float) -> dict[str, Any]:
        ended = state.exited_at if state is not None and state.exited_at else now
        started = found.key.start_time
        destination = _top_destination(state)
        remote = _remote_text(destination) if destination else None
        chosen = [v for (fd, r), v in found.sessions.items() if remote is None or r == remote]
        totals: dict[str, Any] = {
            "started": started,
            "ended": ended,
            "age_s": round(max(0.0, ended - started), 3),
            "gpu_s": round(max(0.0, ended - found.gpu_since), 3) if found.gpu_since else 0.0,
            "gpu_memory_peak": found.gpu_memory_peak,
            "bytes_out": sum(v[0] for v in chosen),
            "bytes_in": sum(v[1] for v in chosen),
            "actions": list(found.actions),
            "actions_total": found.actions_total,
            "records": found.sequence + 1,
        }
        if remote:
            totals["destination"] = remote
        return totals


def _running(key: ProcessKey) -> bool:
    """The process ``key`` still runs (same pid and start time): the correlator forgot it idle."""
    try:
        return round(psutil.Process(key.pid).create_time(), 2) == round(key.start_time, 2)
    except (psutil.Error, OSError):
        return False


def _top_destination(state: ProcessState | None) -> tuple[str, int] | None:
    if state is None or not state.connections:
        return None
    return sorted(state.connections.items(), key=lambda item: (-item[1], item[0]))[0][0]


def _remote_text(endpoint: tuple[str, int]) -> str:
    """``ConnActivity.remote``'s spelling of an endpoint: ``1.2.3.4:443``, ``[::1]:443``."""
    address, port = endpoint
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
