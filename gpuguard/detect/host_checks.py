"""Host-level findings: what is wrong with the host rather than with one process.

Data flow: facts from ``gpuguard.sources`` (autostart files, GPU stack,
device-node permissions, hidden-pid probe, ld.so.preload) -> the checks below
-> :class:`HostFinding` rows with ``host-*`` rule ids.  The rules themselves
are data (:data:`HOST_RULES`: id, name, description, severity, score, ATT&CK
technique); each check only decides *whether* a rule fires and with what
evidence.  Miner names, URL schemes and pool domains come from the loaded
rule set (:class:`MinerVocabulary`), so ``gpuguard scan`` and the agent share
one list.  Per-process behaviour (masquerading, deleted executables, pool
connections, GPU use) is the scoring engine's job, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuguard.sources.hidden_pids import HiddenPid
from gpuguard.sources.host_gpu_stack import GPU_MODULES, DeviceNode, GpuStackFacts
from gpuguard.sources.persistence import AutostartFile

MAX_MATCHES_PER_FILE = 3
MAX_LINE_CHARS = 300


@dataclass(slots=True, frozen=True)
class HostRule:
    id: str
    name: str
    description: str
    score: int  # 0-100, same scale as the process verdicts (severity follows from it)
    category: tuple[str, ...]  # ECS event.category values
    techniques: tuple[tuple[str, str], ...]  # (ATT&CK id, name)


RESOURCE_HIJACKING = ("T1496", "Resource Hijacking")

HOST_RULES: dict[str, HostRule] = {
    rule.id: rule
    for rule in (
        HostRule(
            "host-persistence-miner",
            "Autostart entry launches a miner",
            "A systemd unit, cron table, shell profile or rc.local names a known miner, "
            "a mining-pool URL scheme or a pool domain, so a miner comes back after a reboot or kill.",
            85,
            ("configuration", "file"),
            (
                RESOURCE_HIJACKING,
                ("T1053.003", "Scheduled Task/Job: Cron"),
                ("T1543.002", "Create or Modify System Process: Systemd Service"),
                ("T1546.004", "Event Triggered Execution: Unix Shell Configuration Modification"),
            ),
        ),
        HostRule(
            "host-hidden-process",
            "Process hidden from /proc listings",
            "The kernel knows a process that a /proc directory listing does not show: "
            "a readdir hook (preload or kernel rootkit) is hiding it, as miners' droppers do.",
            95,
            ("process", "intrusion_detection"),
            (("T1014", "Rootkit"), ("T1564", "Hide Artifacts"), RESOURCE_HIJACKING),
        ),
        HostRule(
            "host-ld-so-preload",
            "System-wide preload library configured",
            "/etc/ld.so.preload loads a library into every dynamically linked program; "
            "preload rootkits use it to hide miner processes and files.",
            70,
            ("configuration", "library"),
            (("T1574.006", "Hijack Execution Flow: Dynamic Linker Hijacking"),),
        ),
        HostRule(
            "host-raw-memory-node-exposed",
            "Raw memory or PCI BAR node open to all users",
            "/dev/mem or a PCI BAR resource file is readable or writable by every user: "
            "any process can read or corrupt GPU and host memory directly.",
            70,
            ("configuration", "host"),
            (("T1068", "Exploitation for Privilege Escalation"),),
        ),
        HostRule(
            "host-gpu-node-world-writable",
            "GPU device node open to all users",
            "Every local user (and every container that maps the node) can open this GPU "
            "device and run work on it; the NVIDIA driver installs its nodes 0666 by default, "
            "so this is a hardening note on shared hosts.",
            20,
            ("configuration", "host"),
            (RESOURCE_HIJACKING,),
        ),
        HostRule(
            "host-kernel-forced-module",
            "Kernel module force-loaded or force-unloaded",
            "The kernel taint shows a module loaded or removed with force (version checks "
            "bypassed), a habit of kernel rootkit installers.",
            50,
            ("driver", "host"),
            (("T1547.006", "Boot or Logon Autostart Execution: Kernel Modules and Extensions"),),
        ),
        HostRule(
            "host-untrusted-kernel-module",
            "Unsigned or out-of-tree non-GPU kernel module",
            "A loaded module that is not a GPU driver taints the kernel as unsigned (E) or "
            "out-of-tree (O); kernel rootkits that hide miners load this way.",
            45,
            ("driver", "host"),
            (
                ("T1547.006", "Boot or Logon Autostart Execution: Kernel Modules and Extensions"),
                ("T1014", "Rootkit"),
            ),
        ),
        HostRule(
            "host-gpu-driver-mismatch",
            "NVML library and NVIDIA kernel module disagree",
            "The user-space NVML library reports a different driver version than the loaded "
            "kernel module: a swapped or shimmed libnvidia-ml can hide GPU processes.",
            40,
            ("driver", "host"),
            (("T1574", "Hijack Execution Flow"),),
        ),
    )
}


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


def miner_reasons(line: str, vocabulary: MinerVocabulary) -> list[str]:
    """Why ``line`` launches a miner: named miners, pool URL schemes, pool domains, miner flags."""
    reasons: list[str] = []
    lowered = line.lower()
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
        for number, line in f.lines:  # comments were left out by the reader (sources.persistence)
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


def apply_thresholds(findings: Iterable[HostFinding], suspicious: float, malicious: float) -> None:
    """Give each finding the verdict its score earns under the rule set's thresholds."""
    for finding in findings:
        score = finding.score
        finding.verdict = (
            "malicious" if score >= malicious else "suspicious" if score >= suspicious else "clean"
        )
