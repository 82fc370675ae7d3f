"""Guard policies: per-user and per-group GPU limits, evaluated into verdicts with actions.

What GPU managers promise and do not enforce: which users or groups may use
which GPUs, how many GPUs and how much GPU memory one user may hold, and the
hours GPUs may be used.  The ``guard_policies:`` section of the agent config
lists them; :func:`evaluate_guard_policies` checks every live process that
uses a GPU and returns a :class:`Verdict` (with :class:`Evidence` naming the
policy and what broke it) for each process in breach, carrying the policy's
verdict and action, so the responder treats it like any rule finding.

GPUs are known by index from the device paths a process opened
(``/dev/nvidiaN``, ``/dev/dri/renderD(128+N)``); GPU memory is the latest
sample the correlator holds for the process.
"""

from __future__ import annotations

import grp
import pwd
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.config.schema import Key, Section, check, field_default
from gpuguard.correlate.state import ProcessState
from gpuguard.detect.ruleset.load import ACTIONS
from gpuguard.detect.ruleset.model import ALERT_VERDICTS, VERDICT_RANK
from gpuguard.detect.scoring.rule import score_of
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.errors import Problems

_NVIDIA = re.compile(r"^/dev/nvidia(\d+)$")
_RENDER = re.compile(r"^/dev/dri/renderD(\d+)$")


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    id: str
    gpus: frozenset[int] | None = None  # GPU indexes it covers (None: every GPU)
    allowed_users: frozenset[str] | None = None
    allowed_groups: frozenset[str] | None = None
    max_gpus_per_user: int | None = None
    max_gpu_memory_per_user: int | None = None  # bytes
    allowed_hours: tuple[int, int] | None = None  # [start, end) in local hours; wraps past midnight
    verdict: str = "suspicious"
    action: str = "alert"
    weight: int = 50


GUARD_POLICY_SCHEMA = Section(
    "guard_policies",
    (
        Key("id", "text", "the policy's name (findings: rule.id guard.<id>)", shows='""'),
        Key("gpus", "indexes", "GPU indexes it covers (default: every GPU)"),
        Key("allowed_users", "names", "users allowed on those GPUs"),
        Key("allowed_groups", "names", "groups (primary or supplementary) allowed on them"),
        Key("max_gpus_per_user", "whole", "GPUs one user may hold", low=0),
        Key("max_gpu_memory_per_user", "size", "GPU memory one user may hold (40GiB, 20000MiB)"),
        Key("allowed_hours", "hours", 'local hours "08-20" [start, end); may wrap past midnight'),
        Key("verdict", "choice", " | ".join(ALERT_VERDICTS), choices=ALERT_VERDICTS),
        Key("action", "choice", "any action of the rules file", choices=ACTIONS, noun="action"),
        Key("weight", "whole", "the score a breach adds", low=0),
    ),
    "one entry per policy",
    model=GuardPolicy,
)

_OPTIONAL = {k.key for k in GUARD_POLICY_SCHEMA.keys if field_default(GuardPolicy, k.name) is None}


def parse_guard_policies(
    section: Any, *, source: str, problems: Problems | None = None
) -> tuple[GuardPolicy, ...]:
    """Validate the ``guard_policies:`` list (an unknown key or bad value names itself and ``source``).

    With ``problems`` collecting, every problem is recorded there and a policy with one is
    left out; otherwise the first one is raised.
    """
    if section is None:
        return ()
    p = problems or Problems(source)
    if not isinstance(section, list):
        p.add(("guard_policies",), "expected a list of policies")
        return ()
    policies = []
    for i, entry in enumerate(section):
        at = ("guard_policies", i)
        found = len(p.found)
        if not isinstance(entry, Mapping):
            p.add(at, "expected a mapping")
            continue
        if not isinstance(entry.get("id"), str) or not entry["id"]:
            p.add(at + ("id",), "a policy needs a name")
        # id: checked above; null: the key's default (every GPU, no limit), as before
        given = {k: v for k, v in entry.items() if k != "id" and not (v is None and k in _OPTIONAL)}
        values = check(given, GUARD_POLICY_SCHEMA, at, p.add)
        if len(p.found) == found:
            policies.append(GuardPolicy(id=entry["id"], **values))
    return tuple(policies)


def gpu_indexes(state: ProcessState) -> set[int]:
    out = set()
    for path in state.gpu_paths:
        if match := _NVIDIA.match(path):
            out.add(int(match.group(1)))
        elif (match := _RENDER.match(path)) and int(match.group(1)) >= 128:
            out.add(int(match.group(1)) - 128)
    return out


class _Groups:
    """Group names of a uid (primary and supplementary), looked up once per evaluation."""

    def __init__(self) -> None:
        self._cache: dict[int, frozenset[str]] = {}

    def of(self, uid: int, username: str) -> frozenset[str]:
        if uid not in self._cache:
            names = set()
            try:
                entry = pwd.getpwuid(uid)
                names.add(grp.getgrgid(entry.pw_gid).gr_name)
                username = username or entry.pw_name
            except KeyError:
                pass
            names.update(g.gr_name for g in grp.getgrall() if username and username in g.gr_mem)
            self._cache[uid] = frozenset(names)
        return self._cache[uid]


def evaluate_guard_policies(
    policies: Iterable[GuardPolicy], states: Iterable[ProcessState], now: float
) -> list[Verdict]:
    """A verdict for each live process in breach of a policy (one per process, evidence from every policy)."""
    policies = tuple(policies)
    if not policies:
        return []
    users: dict[int, list[tuple[ProcessState, set[int]]]] = defaultdict(list)
    for state in states:
        if state.exited or state.facts is None or state.facts.uid < 0:
            continue
        indexes = gpu_indexes(state)
        if indexes:
            users[state.facts.uid].append((state, indexes))
    groups = _Groups()
    hour = time.localtime(now).tm_hour
    found: dict[int, tuple[ProcessState, list[Evidence], GuardPolicy]] = {}
    for policy in policies:
        for uid, procs in users.items():
            covered = [(s, ix if policy.gpus is None else ix & policy.gpus) for s, ix in procs]
            covered = [(s, ix) for s, ix in covered if ix]
            if not covered:
                continue
            username = covered[0][0].facts.username or str(uid)
            per_process: list[tuple[ProcessState, str]] = []
            if policy.allowed_users is not None or policy.allowed_groups is not None:
                allowed = (
                    policy.allowed_users is not None and username in policy.allowed_users
                ) or (
                    policy.allowed_groups is not None
                    and bool(groups.of(uid, username) & policy.allowed_groups)
                )
                if not allowed:
                    per_process += [
                        (s, f"user {username} is not allowed on GPU {sorted(ix)}")
                        for s, ix in covered
                    ]
            if policy.allowed_hours is not None and not _in_hours(hour, policy.allowed_hours):
                start, end = policy.allowed_hours
                per_process += [
                    (s, f"GPU use at hour {hour}, outside {start:02d}-{end:02d}")
                    for s, _ in covered
                ]
            if policy.max_gpus_per_user is not None:
                used = set().union(*(ix for _, ix in covered))
                if len(used) > policy.max_gpus_per_user:
                    per_process += [
                        (
                            s,
                            f"user {username} uses {len(used)} GPUs (max {policy.max_gpus_per_user})",
                        )
                        for s, _ in covered
                    ]
            if policy.max_gpu_memory_per_user is not None:
                total = sum(int(s.gpu_memory.latest or 0) for s, _ in covered)
                if total > policy.max_gpu_memory_per_user:
                    per_process += [
                        (
                            s,
                            f"user {username} holds {total >> 20} MiB of GPU memory "
                            f"(max {policy.max_gpu_memory_per_user >> 20} MiB)",
                        )
                        for s, _ in covered
                    ]
            for state, detail in per_process:
                kept = found.setdefault(id(state), (state, [], policy))
                kept[1].append(
                    Evidence(
                        f"guard.{policy.id}",
                        "guard_policy",
                        detail,
                        policy.weight,
                        "high",
                        ("guard-policy",),
                        f"guard policy {policy.id}: {detail}",
                    )
                )
                if _stronger(policy, kept[2]):
                    found[id(state)] = (state, kept[1], policy)
    verdicts = []
    for state, evidence, policy in found.values():
        evidence.sort(key=lambda e: (-e.weight, e.rule_id, e.detail))
        verdicts.append(
            Verdict(
                key=state.key,
                pid=state.pid,
                comm=state.comm,
                exe=state.exe,
                score=score_of(evidence),
                verdict=policy.verdict,
                evidence=evidence,
                action=policy.action,
                time=now,
                exe_deleted=bool(state.facts and state.facts.exe_deleted),
            )
        )
    return sorted(verdicts, key=lambda v: v.pid)


def _stronger(a: GuardPolicy, b: GuardPolicy) -> bool:
    return (VERDICT_RANK[a.verdict], ACTIONS.index(a.action)) > (
        VERDICT_RANK[b.verdict],
        ACTIONS.index(b.action),
    )


def _in_hours(hour: int, hours: tuple[int, int]) -> bool:
    start, end = hours
    return start <= hour < end if start <= end else (hour >= start or hour < end)
