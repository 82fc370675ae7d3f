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

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.ruleset.load import ACTIONS
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.errors import Problems

_KEYS = (
    "id",
    "gpus",
    "allowed_users",
    "allowed_groups",
    "max_gpus_per_user",
    "max_gpu_memory_per_user",
    "allowed_hours",
    "verdict",
    "action",
    "weight",
)
_NVIDIA = re.compile(r"^/dev/nvidia(\d+)$")
_RENDER = re.compile(r"^/dev/dri/renderD(\d+)$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


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
        for key in entry:
            if key not in _KEYS:
                p.add(
                    at + (key,),
                    f"unknown key {key!r} (expected one of {', '.join(_KEYS)})",
                    key=True,
                )
        if not isinstance(entry.get("id"), str) or not entry["id"]:
            p.add(at + ("id",), "a policy needs a name")
        verdict = entry.get("verdict", "suspicious")
        if verdict not in ("suspicious", "malicious"):
            p.add(at + ("verdict",), f"{verdict!r} is not suspicious or malicious")
        action = entry.get("action", "alert")
        if action not in ACTIONS:
            p.add(at + ("action",), f"unknown action {action!r} (expected {', '.join(ACTIONS)})")
        policy = GuardPolicy(
            id=str(entry.get("id")),
            gpus=_ints(entry.get("gpus"), at + ("gpus",), p),
            allowed_users=_names(entry.get("allowed_users"), at + ("allowed_users",), p),
            allowed_groups=_names(entry.get("allowed_groups"), at + ("allowed_groups",), p),
            max_gpus_per_user=_count(
                entry.get("max_gpus_per_user"), at + ("max_gpus_per_user",), p
            ),
            max_gpu_memory_per_user=_size(
                entry.get("max_gpu_memory_per_user"), at + ("max_gpu_memory_per_user",), p
            ),
            allowed_hours=_hours(entry.get("allowed_hours"), at + ("allowed_hours",), p),
            verdict=verdict,
            action=action,
            weight=_count(entry.get("weight", 50), at + ("weight",), p) or 0,
        )
        if len(p.found) == found:
            policies.append(policy)
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
                score=min(100, sum(e.weight for e in evidence)),
                verdict=policy.verdict,
                evidence=evidence,
                action=policy.action,
                time=now,
                exe_deleted=bool(state.facts and state.facts.exe_deleted),
            )
        )
    return sorted(verdicts, key=lambda v: v.pid)


def _stronger(a: GuardPolicy, b: GuardPolicy) -> bool:
    rank = ("suspicious", "malicious")
    return (rank.index(a.verdict), ACTIONS.index(a.action)) > (
        rank.index(b.verdict),
        ACTIONS.index(b.action),
    )


def _in_hours(hour: int, hours: tuple[int, int]) -> bool:
    start, end = hours
    return start <= hour < end if start <= end else (hour >= start or hour < end)


def _ints(value: Any, at: tuple, p: Problems) -> frozenset[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        p.add(at, "expected a list of GPU indexes")
        return None
    return frozenset(value)


def _names(value: Any, at: tuple, p: Problems) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        p.add(at, "expected a list of names")
        return None
    return frozenset(value)


def _count(value: Any, at: tuple, p: Problems) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        p.add(at, f"expected a whole number >= 0, got {value!r}")
        return None
    return value


def _size(value: Any, at: tuple, p: Problems) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(str(value).strip())
    if not match:
        p.add(at, f"{value!r} is not a size like 40GiB or 20000MiB")
        return None
    unit = (match.group(2) or "")[:1].upper()
    return int(float(match.group(1)) * _UNITS[unit])


def _hours(value: Any, at: tuple, p: Problems) -> tuple[int, int] | None:
    if value is None:
        return None
    match = re.match(r"^(\d{1,2})-(\d{1,2})$", str(value).strip())
    if not match or not all(0 <= int(h) <= 24 for h in match.groups()):
        p.add(at, f"{value!r} is not an hour range like 08-20")
        return None
    return int(match.group(1)), int(match.group(2))
