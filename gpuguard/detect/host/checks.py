"""Host-level findings: what is wrong with the host rather than with one process.

Data flow: facts from ``gpuguard.sources`` (autostart files, GPU stack,
device-node permissions, hidden-pid probe, ld.so.preload) -> the checks below
-> :class:`HostFinding` rows with ``host-*`` rule ids.  The rules themselves
are data (:data:`gpuguard.detect.host.rules.HOST_RULES`: id, name, description,
score, ATT&CK technique); each check only decides *whether* a rule fires and with what
evidence.  Miner names, URL schemes and pool domains come from the loaded
rule set (:class:`MinerVocabulary`), so ``gpuguard scan`` and the agent share
one list.  Per-process behaviour (masquerading, deleted executables, pool
connections, GPU use) is the scoring engine's job, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from gpuguard.detect.host.rules import HOST_RULES, HostRule
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.detect.scoring.rule import verdict_for
from gpuguard.sources.host.gpu_stack import GPU_MODULES, DeviceNode, GpuStackFacts
from gpuguard.sources.host.persistence import AutostartFile
from gpuguard.sources.proc.hidden_pids import HiddenPid

MAX_MATCHES_PER_FILE = 3
MAX_LINE_CHARS = 300


@dataclass(slots=True)
class HostFinding:
    """One fired host rule with the evidence behind it (one finding per subject)."""

    rule_id: str
    subject: str  # path, pid or module the finding is about (attacker-chosen text possible)
    detail: str  # one line: why it fired
    evidence: list[str] = field(default_factory=list)
    pid: int | None = None  # the process concerned (for GPU memory: the holder or likely owner)
    process_name: str | None = None
    verdict: str = "clean"  # set from the rule set's thresholds by :func:`apply_thresholds`
    device: str | None = (
        None  # GPU host findings: the device, e.g. "nvidia gpu0 (00000000:18:00.0)"
    )
    amount: int | None = None  # bytes concerned: GPU memory, reserved huge pages

    @property
    def rule(self) -> HostRule:
        return HOST_RULES[self.rule_id]

    @property
    def score(self) -> int:
        return self.rule.score

    def explain(self) -> str:
        return f"{self.rule_id}: {self.detail}"


@dataclass(slots=True, frozen=True)
class MinerVocabulary:
    """What names a miner, taken from the rule set's lists (lower-case)."""

    miner_names: frozenset[str]
    url_schemes: frozenset[str]  # e.g. "stratum+tcp"
    pool_domains: tuple[str, ...]  # suffixes, e.g. "supportxmr.com"
    miner_flags: frozenset[str] = frozenset()  # e.g. "--donate-level"


# ---- autostart files -------------------------------------------------------------

_TOKEN_SPLIT = re.compile(r"[\s/=\"'`;&|()<>,:]+")
_URL_SCHEME = re.compile(r"([a-z][a-z0-9+.\-]{1,30})://", re.I)
_HOSTNAME = re.compile(r"[a-z0-9][a-z0-9\-]{0,62}(?:\.[a-z0-9\-]{1,63})+", re.I)


@lru_cache(maxsize=8)
def _could_match(vocabulary: MinerVocabulary) -> re.Pattern[str]:
    """What every line with a reason contains (a miner name, ``://`` or a pool domain), so the
    thousands of autostart lines without any are passed over with one search each."""
    words = sorted({*vocabulary.miner_names, *vocabulary.pool_domains}, key=len, reverse=True)
    return re.compile("|".join(["://", *(re.escape(w) for w in words)]))


def miner_reasons(line: str, vocabulary: MinerVocabulary) -> list[str]:
    """Why ``line`` launches a miner: named miners, pool URL schemes, pool domains, miner flags."""
    reasons: list[str] = []
    lowered = line.lower()
    if not _could_match(vocabulary).search(lowered):
        return reasons
    tokens = [t for t in _TOKEN_SPLIT.split(lowered) if t]
    names = sorted({t for t in tokens if t in vocabulary.miner_names})
    if names:
        reasons.append("miner " + ", ".join(names))
    schemes = sorted(
        {s.lower() for s in _URL_SCHEME.findall(line) if s.lower() in vocabulary.url_schemes}
    )
    if schemes:
        reasons.append("pool URL " + ", ".join(f"{s}://" for s in schemes))
    domains = set()
    for host in _HOSTNAME.findall(lowered):
        for suffix in vocabulary.pool_domains:
            if host == suffix or host.endswith("." + suffix):
                domains.add(suffix)
    if domains:
        reasons.append("pool domain " + ", ".join(sorted(domains)))
    flags = sorted({t for t in lowered.split() if t.split("=", 1)[0] in vocabulary.miner_flags})
    if flags and reasons:  # a flag alone (-o, -u) is too common to fire on
        reasons.append("miner flag " + ", ".join(f.split("=", 1)[0] for f in flags))
    return reasons


def check_autostart_files(
    files: Iterable[AutostartFile], vocabulary: MinerVocabulary
) -> list[HostFinding]:
    findings = []
    for f in files:
        matches: list[str] = []
        reasons_seen: list[str] = []
        # comments were left out by the reader (sources.host.persistence)
        for number, line in f.lines:
            reasons = miner_reasons(line, vocabulary)
            if reasons:
                snippet = line.strip()[:MAX_LINE_CHARS]
                matches.append(f"{f.path}:{number}: {snippet}")
                reasons_seen.extend(r for r in reasons if r not in reasons_seen)
                if len(matches) >= MAX_MATCHES_PER_FILE:
                    break
        if matches:
            findings.append(
                HostFinding(
                    "host-persistence-miner",
                    subject=f.path,
                    detail=f"{f.kind} {f.path} starts a miner ({'; '.join(reasons_seen)})",
                    evidence=matches,
                )
            )
    return findings


def check_ld_so_preload(text: str | None, path: str = "/etc/ld.so.preload") -> list[HostFinding]:
    """A non-empty /etc/ld.so.preload (``text`` is its content, None when absent)."""
    if text is None:
        return []
    libraries = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    if not libraries:
        return []
    return [
        HostFinding(
            "host-ld-so-preload",
            subject=path,
            detail=f"{path} preloads {', '.join(libraries[:5])}"
            + (f" and {len(libraries) - 5} more" if len(libraries) > 5 else ""),
            evidence=libraries[:20],
        )
    ]


# ---- GPU stack --------------------------------------------------------------------


def _mode_text(node: DeviceNode) -> str:
    return f"{node.path} mode {node.mode:04o} owner {node.uid}:{node.gid}"


def check_device_nodes(nodes: Iterable[DeviceNode]) -> list[HostFinding]:
    findings = []
    for node in nodes:
        if node.device_class in ("mem", "pci-bar"):
            if node.world_writable or node.world_readable:
                access = "writable" if node.world_writable else "readable"
                findings.append(
                    HostFinding(
                        "host-raw-memory-node-exposed",
                        subject=node.path,
                        detail=f"{node.path} is world-{access} (mode {node.mode:04o})",
                        evidence=[_mode_text(node)],
                    )
                )
        elif node.world_writable:
            findings.append(
                HostFinding(
                    "host-gpu-node-world-writable",
                    subject=node.path,
                    detail=f"{node.device_class} node {node.path} is world-writable (mode {node.mode:04o})",
                    evidence=[_mode_text(node)],
                )
            )
    return findings


def check_kernel(stack: GpuStackFacts) -> list[HostFinding]:
    findings = []
    forced = [f for f in stack.taint_flags if f.letter in ("F", "R")]
    if forced:
        findings.append(
            HostFinding(
                "host-kernel-forced-module",
                subject="kernel",
                detail="kernel taint " + ", ".join(f"{f.letter} ({f.meaning})" for f in forced),
                evidence=[f"/proc/sys/kernel/tainted = {stack.taint}"],
            )
        )
    for module in stack.modules:
        if module.name in GPU_MODULES:
            continue
        letters = [c for c in module.taint if c in ("E", "O")]
        if letters:
            what = " and ".join({"E": "unsigned", "O": "out-of-tree"}[c] for c in letters)
            findings.append(
                HostFinding(
                    "host-untrusted-kernel-module",
                    subject=module.name,
                    detail=f"module {module.name} is {what} (taint {module.taint})",
                    evidence=[f"/sys/module/{module.name}/taint = {module.taint}"],
                )
            )
    nvml = stack.driver_versions.get("nvml")
    kernel = stack.driver_versions.get("nvidia-kernel") or stack.driver_versions.get(
        "nvidia-module"
    )
    if nvml and kernel and nvml != kernel:
        findings.append(
            HostFinding(
                "host-gpu-driver-mismatch",
                subject="nvidia",
                detail=f"NVML reports driver {nvml}, the kernel module is {kernel}",
                evidence=[f"nvml {nvml}", f"kernel {kernel}"],
            )
        )
    return findings


def check_hidden_pids(hidden: Iterable[HiddenPid]) -> list[HostFinding]:
    return [
        HostFinding(
            "host-hidden-process",
            subject=str(h.pid),
            detail=f"pid {h.pid} ({h.name}) exists but is missing from the /proc listing "
            f"(seen in {', '.join(h.sources)})",
            evidence=[f"/proc/{h.pid}/status readable", *(f"seen in {s}" for s in h.sources)],
            pid=h.pid,
            process_name=h.name,
        )
        for h in hidden
    ]


def apply_thresholds(findings: Iterable[HostFinding], thresholds: Thresholds) -> None:
    """Give each finding the verdict its score earns under the rule set's thresholds."""
    for finding in findings:
        finding.verdict = verdict_for(finding.score, thresholds)
