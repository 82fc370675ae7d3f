"""Findings and records the output tests render: one from a real replay, hostile-named ones, a huge one, every kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpuguard.detect.host.gpu_checks  # noqa: F401 - registers the GPU host rules
from gpuguard.detect.cases import replay
from gpuguard.detect.host.checks import HostFinding, apply_thresholds
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.cap import ScoreCap
from gpuguard.detect.scoring.score import Evidence
from gpuguard.events.agent_events import (
    ACTION_STATUSES,
    LIFECYCLE_ACTIONS,
    ActionOutcome,
    AgentLifecycle,
)
from gpuguard.outputs.ecs import (
    _ACTION_ECS_TYPE,
)
from gpuguard.outputs.finding import (
    Destination,
    Finding,
    GpuUse,
    ProcessInfo,
    finding_from_host,
    finding_from_verdict,
)
from gpuguard.outputs.scan_report import ScanReport
from gpuguard.sources.host.gpu_stack import GpuStackFacts

# Newline (forged second line), ESC/BEL (terminal), invalid UTF-8 (a lone 0xff byte kept by
# surrogateescape), CEF's separators | = \, and the line breaks JSON leaves alone.
HOSTILE = "kw\nCEF:0|forged|x|1|2|3|10|act=fake\r\x1b]0;pwned\x07 a=b|c\\d \udcff \u2028\x85end"


HOST = {
    "hostname": "gpu-node-7",
    "name": "gpu-node-7",
    "architecture": "x86_64",
    "os": {"type": "linux"},
}


def replayed_miner_finding() -> Finding:
    """The malicious finding of the golden stratum-miner case, replayed through the shipped rules."""
    ruleset = load_ruleset([shipped_rules_file()])
    verdicts, correlator = replay(
        Path(__file__).resolve().parents[1] / "cases" / "miner_stratum_cmdline" / "capture.ggrec",
        ruleset,
    )
    (verdict,) = [v for v in verdicts if v.verdict == "malicious"]
    state = correlator.get(verdict.key)
    return finding_from_verdict(verdict, state.facts, ruleset, state)


def hostile_finding(score: float = 95, verdict: str = "malicious") -> Finding:
    return Finding(
        kind="process",
        rule_id="miner-binary-name",
        rule_name="miner-binary-name",
        rule_description="known miner | program = name",
        score=score,
        verdict=verdict,
        explanation=f"pid 66 {HOSTILE} score {score}",
        process=ProcessInfo(
            pid=66,
            name=HOSTILE,
            executable=f"/tmp/{HOSTILE}",
            command_line=[HOSTILE, "-o"],
            start_time=1_700_000_000.5,
            ppid=1,
            user_id=0,
            user_name="root",
            container_id="c" * 64,
            pod_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        ),
        created=1_700_000_100.0,
    )


def hostile_records() -> list:
    return [
        hostile_finding(),
        ActionOutcome(
            time=1_700_000_101.0,
            action="kill",
            status="done",
            pid=66,
            start_time=1_700_000_000.5,
            comm=HOSTILE,
            exe=f"/tmp/{HOSTILE}",
            verdict="malicious",
            score=95,
            rule_ids=["miner-binary-name"],
            reason=f"killed {HOSTILE}",
            detail={"signal": HOSTILE},
        ),
        AgentLifecycle(
            time=1_700_000_102.0,
            action="fault",
            message=f"cannot write {HOSTILE}",
            detail={"path": HOSTILE},
        ),
    ]


CMDLINE = ["/opt/m/" + "A" * 100_000] + [f"--opt{i}=\x1b\udcff" for i in range(10_000)]


EXE = "/tmp/" + "e\\" * 32_768  # 64 KiB, full of backslashes


NAME = "x\x1b]0;pwned\x07\udcfe|=\\\n" * 200


def huge_finding() -> Finding:
    return Finding(
        kind="process",
        rule_id="miner-binary-name",
        rule_name="miner-binary-name",
        rule_description="known miner",
        score=95,
        verdict="malicious",
        explanation="pid 66 xmrig score 95 malicious",
        evidence=[
            Evidence(f"rule-{i:03d}", "sig", f"detail {i} " + "d" * 300, i % 50, "")
            for i in range(500)
        ],
        process=ProcessInfo(
            pid=66,
            name=NAME,
            executable=EXE,
            command_line=list(CMDLINE),
            start_time=1_700_000_000.5,
            ppid=1,
            user_name="root",
            user_id=0,
        ),
        created=1_700_000_100.0,
    )


EVIL_NAME = "\x1b]0;pwned\x07[bold red]x[/]"


def process_finding(score: float = 80, verdict: str = "malicious") -> Finding:
    return Finding(
        kind="process",
        rule_id="miner-cmdline-stratum",
        rule_name="miner-cmdline-stratum",
        rule_description="stratum URL in cmdline",
        score=score,
        verdict=verdict,
        explanation=f"pid 4242 {EVIL_NAME} score {score:.0f} {verdict}",
        evidence=[
            Evidence(
                "miner-cmdline-stratum",
                "cmdline_url_schemes",
                "cmdline_url_schemes=stratum+tcp",
                40,
                "critical",
                ("T1496",),
                "stratum URL in cmdline",
            ),
            Evidence(
                "masquerade-kernel-thread",
                "comm",
                f"comm={EVIL_NAME}",
                40,
                "high",
                ("T1036",),
                "kernel-thread name on a user-space program",
            ),
        ],
        categories=["process", "intrusion_detection"],
        techniques=[("T1496", "Resource Hijacking"), ("T1036", "Masquerading")],
        process=ProcessInfo(
            pid=4242,
            name=EVIL_NAME,
            executable="/dev/shm/.x/kworker",
            executable_deleted=True,
            command_line=["/dev/shm/.x/kworker", "-o", "stratum+tcp://pool:3333"],
            start_time=1_700_000_000.25,
            ppid=1,
            parent_name="systemd",
            parent_executable="/usr/lib/systemd/systemd",
            user_id=1000,
            user_name="bob",
            container_id="a" * 64,
            container_runtime="containerd",
            pod_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            cpu_percent=99.5,
        ),
    )


def scan_report(findings: list[Finding]) -> ScanReport:
    return ScanReport(
        started=1_700_000_000.0,
        finished=1_700_000_001.5,
        findings=findings,
        gpu_stack=GpuStackFacts(taint=0),
        processes_scanned=123,
        suspicious_threshold=40,
        malicious_threshold=75,
        limitations=[
            "could not read /proc/PID/exe for 3 processes owned "
            "by other users; run as root to see them"
        ],
    )


def lifecycle_findings() -> list[Finding]:
    """One process finding's create, update and close records, with everything a responder needs."""
    out = []
    for activity, sequence in (("create", 0), ("update", 1), ("close", 2)):
        finding = hostile_finding()
        finding.activity, finding.sequence = activity, sequence
        finding.finding_id = "gpuguard-" + "a" * 31
        finding.run_id = "3f2a9c1b7e44"  # the agent run's
        finding.process.ppid = 40
        finding.process.parent_name = HOSTILE
        finding.process.ancestors = [
            {"pid": 40, "name": HOSTILE, "executable": f"/bin/{HOSTILE}"},
            {"pid": 30, "name": "sshd", "executable": "/usr/sbin/sshd"},
            {"pid": 1, "name": "systemd", "executable": "/usr/lib/systemd/systemd"},
        ]
        finding.process.exe_sha256 = "ab" * 32
        finding.process.pod_name, finding.process.pod_namespace = "trainer-7", "ml-team"
        finding.process.container_name = "worker"
        finding.destinations = [Destination("127.0.0.1", 3333, 2, "pool.example.org")]
        finding.evidence = [
            Evidence("miner-cmdline-stratum", "cmdline", HOSTILE, 40, "critical", ("T1496",)),
            Evidence("net-pool-protocol", "payload", "stratum", 50, "critical", ("T1496",)),
        ]
        if activity != "create":
            finding.changes = ["gpu", "destination", "rules"]
            finding.gpu = GpuUse(["nvidia"], ["/dev/nvidia0"], 97.5, 6 << 30, 12, 8 << 30, True)
        if activity == "close":
            finding.process.exit_code = 137
            finding.totals = {
                "started": 1_700_000_000.5, "ended": 1_700_000_300.0, "age_s": 299.5,
                "gpu_s": 250.0, "gpu_memory_peak": 6 << 30, "bytes_out": 4096, "bytes_in": 9000,
                "actions": [{"action": "kill", "status": "done", "time": 1_700_000_101.0}],
                "actions_total": 1, "records": 3, "destination": "127.0.0.1:3333",
            }  # fmt: skip
        out.append(finding)
    return out


def capped_finding() -> Finding:
    """A busy worker's finding: three generic facts, 45, held at 39."""
    finding = hostile_finding(39, "clean")
    finding.score_cap = ScoreCap(39 + 6, 39, f"generic evidence only ({HOSTILE}, net-pool-port)")
    return finding


def record_corpus(miner: Finding) -> list[Any]:
    """Every kind of record the output tests render: findings, each action and lifecycle step."""
    host_gpu = HostFinding(
        "host-gpu-memory-orphaned",
        subject="nvidia gpu0",
        detail="nvidia gpu0: 8.0 GiB held by no process",
        device="nvidia gpu0",
        amount=8 << 30,
        pid=77,
        process_name=HOSTILE,
    )
    host_file = HostFinding(
        "host-persistence-miner", "/etc/cron.d/x", "cron starts a miner", ["/etc/cron.d/x:1: x"]
    )
    apply_thresholds([host_gpu, host_file], Thresholds(40, 75))
    dialled = hostile_finding()
    dialled.destinations = [Destination("pool.example", 3333, 4, HOSTILE)]
    records: list[Any] = [
        miner,
        *hostile_records(),
        hostile_finding(10, "clean"),
        hostile_finding(50, "suspicious"),
        capped_finding(),
        dialled,
        huge_finding(),
        process_finding(),
        *lifecycle_findings(),
        *(finding_from_host(h, a, 5.0) for h in (host_gpu, host_file) for a in ("create", "update", "close")),
    ]  # fmt: skip
    for action in (*_ACTION_ECS_TYPE, "other"):
        for status in ACTION_STATUSES:
            records.append(
                ActionOutcome(
                    time=3.0,
                    action=action,
                    status=status,
                    pid=66,
                    start_time=1.5,
                    comm="x",
                    exe="/x",
                    verdict="malicious",
                    score=90,
                    rule_ids=["r"],
                    reason="why",
                    block_id="blk-1" if action == "block-egress" else None,
                    detail={"addresses": ["10.0.0.1"]} if action == "block-egress" else {},
                )  # fmt: skip
            )
        records.append(ActionOutcome(time=3.0, action=action, status="failed"))  # no target
    records += [
        AgentLifecycle(time=4.0, action=a, message=HOSTILE, detail={"n": 1})
        for a in LIFECYCLE_ACTIONS
    ]
    return records
