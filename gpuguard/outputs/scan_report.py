"""What ``gpuguard scan`` prints: the console report and the one JSON document.

Data flow: a :class:`ScanReport` (findings in the shape of
:mod:`gpuguard.outputs.finding`, GPU-stack facts, what could not be seen,
counters) -> either rich tables on a console (:func:`render_console`) or one
JSON document ``{"scanner", "host", "summary", "findings"}`` whose findings are
ECS alerts (:func:`scan_document` with ``"json"``) or OCSF Detection Findings
(``"ocsf"``).

Console cells are :class:`rich.text.Text` built from :func:`escape_text`
output, never markup strings: a process named ``[red]x`` or ``\\x1b]0;...``
prints literally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuguard import __version__
from gpuguard.escape import escape_text
from gpuguard.outputs.bounds import OutputLimits, bound_document
from gpuguard.outputs.ecs import host_fields, iso_time
from gpuguard.outputs.finding import Finding
from gpuguard.outputs.output_format import SCAN_DATASET, Target
from gpuguard.outputs.records import SCAN_FORMATS
from gpuguard.sources.host.gpu_stack import GpuStackFacts

VERDICT_STYLE = {"malicious": "bold red", "suspicious": "yellow", "clean": "green"}
MAX_EXPLANATION = 400
LIMITS = OutputLimits()  # the log records' field caps; a scan document has no per-record budget


@dataclass(slots=True)
class ScanReport:
    started: float
    finished: float
    findings: list[Finding]  # process and host findings, any order
    gpu_stack: GpuStackFacts
    processes_scanned: int
    suspicious_threshold: float
    malicious_threshold: float
    limitations: list[str] = field(default_factory=list)  # "could not see ..." lines
    notes: list[str] = field(default_factory=list)  # sources that do not work here (no NVML, ...)
    options: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings,
            key=lambda f: (
                -f.score,
                f.kind != "process",
                f.process.pid if f.process else 0,
                f.rule_id,
            ),
        )

    def count(self, verdict: str) -> int:
        return sum(1 for f in self.findings if f.verdict == verdict)

    @property
    def alerting(self) -> bool:
        """Something reached the suspicious threshold (exit code 1)."""
        return any(f.is_alert for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.alerting else 0

    def summary_line(self) -> str:
        return (
            f"scanned {self.processes_scanned} processes in {self.finished - self.started:.2f} s: "
            f"{self.count('malicious')} malicious, {self.count('suspicious')} suspicious, "
            f"{sum(1 for f in self.findings if f.verdict == 'clean')} below threshold; "
            f"{len(self.limitations)} blind spots"
        )


# ---- console ---------------------------------------------------------------------


def _text(value: object, style: str = "") -> Text:
    return Text(escape_text(value), style=style)


def _process_cell(finding: Finding) -> Text:
    p = finding.process
    if p is None:
        return _text(finding.subject or "host")
    label = f"{p.name}"
    if p.executable:
        label += f" ({p.executable}{' (deleted)' if p.executable_deleted else ''})"
    if p.container_id:
        label += f" [container {p.container_id[:12]}]"
    return _text(label)


def _findings_table(title: str, findings: list[Finding], show_pid: bool) -> Table:
    table = Table(title=title, title_justify="left", expand=False, show_lines=False)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    if show_pid:
        table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("process" if show_pid else "subject", overflow="fold", max_width=48)
    table.add_column("why", overflow="fold")
    for f in findings:
        row = [Text(f"{f.score:.0f}"), _text(f.verdict, VERDICT_STYLE.get(f.verdict, ""))]
        if show_pid:
            row.append(Text(str(f.process.pid) if f.process else "-"))
        row += [_process_cell(f), _text(f.reasons[:MAX_EXPLANATION])]
        table.add_row(*row)
    return table


def _stack_lines(stack: GpuStackFacts) -> list[str]:
    lines = []
    if stack.driver_versions:
        lines.append(
            "GPU drivers: "
            + ", ".join(f"{k} {v}" for k, v in sorted(stack.driver_versions.items()))
        )
    else:
        lines.append("GPU drivers: none found")
    gpu_modules = stack.gpu_modules
    lines.append(
        "GPU kernel modules: "
        + (
            ", ".join(
                f"{m.name}{' (taint ' + m.taint + ')' if m.taint else ''}" for m in gpu_modules
            )
            or "none loaded"
        )
    )
    if stack.taint is not None:
        flags = ", ".join(f"{f.letter} {f.meaning}" for f in stack.taint_flags) or "not tainted"
        lines.append(f"kernel taint {stack.taint}: {flags}")
    for device in stack.nvml_devices:
        lines.append(
            f"GPU {device.index} {device.name or ''}: persistence mode "
            f"{_on_off(device.persistence_mode)}, accounting mode {_on_off(device.accounting_mode)}"
        )
    if stack.device_nodes:
        open_nodes = [n for n in stack.device_nodes if n.world_writable]
        lines.append(
            f"GPU device nodes: {len(stack.device_nodes)}, world-writable: "
            + (", ".join(n.path for n in open_nodes) if open_nodes else "none")
        )
    else:
        lines.append("GPU device nodes: none")
    return lines


def _on_off(value: bool | None) -> str:
    return "unknown" if value is None else "on" if value else "off"


def render_console(report: ScanReport, console: Console) -> None:
    findings = report.sorted_findings()
    processes = [f for f in findings if f.kind == "process"]
    hosts = [f for f in findings if f.kind == "host"]
    if processes:
        console.print(_findings_table("Processes", processes, show_pid=True))
    else:
        console.print(Text("Processes: no process shows any miner or GPU-abuse evidence"))
    console.print()
    if hosts:
        console.print(_findings_table("Host checks", hosts, show_pid=False))
    else:
        console.print(
            Text(
                "Host checks: persistence, hidden processes, preload, kernel and device nodes all passed"
            )
        )
    for line in _stack_lines(report.gpu_stack):
        console.print(_text(line), highlight=False)
    for line in report.notes:
        console.print(_text(f"note: {line}", "dim"), highlight=False)
    for line in report.limitations:
        console.print(_text(f"not seen: {line}", "yellow"), highlight=False)
    console.print()
    style = "bold red" if report.count("malicious") else "yellow" if report.alerting else "green"
    console.print(_text(report.summary_line(), style), highlight=False)


# ---- JSON ------------------------------------------------------------------------


def summary_fields(report: ScanReport) -> dict[str, Any]:
    stack = report.gpu_stack
    return {
        "processes_scanned": report.processes_scanned,
        "findings": len(report.findings),
        "malicious": report.count("malicious"),
        "suspicious": report.count("suspicious"),
        "below_threshold": report.count("clean"),
        "highest_score": max((f.score for f in report.findings), default=0.0),
        "thresholds": {
            "suspicious": report.suspicious_threshold,
            "malicious": report.malicious_threshold,
        },
        "exit_code": report.exit_code,
        "duration_s": round(report.finished - report.started, 3),
        "could_not_see": list(report.limitations),
        "notes": list(report.notes),
        "counters": dict(report.counters),
        "gpu_stack": {
            "driver_versions": dict(stack.driver_versions),
            "gpu_modules": [
                {"name": m.name, "taint": m.taint, "version": m.version} for m in stack.gpu_modules
            ],
            "kernel_taint": stack.taint,
            "kernel_taint_flags": [f.letter for f in stack.taint_flags],
            "device_nodes": [
                {
                    "path": n.path,
                    "class": n.device_class,
                    "mode": f"{n.mode:04o}",
                    "uid": n.uid,
                    "gid": n.gid,
                }
                for n in stack.device_nodes
            ],
            "nvml_devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "persistence_mode": d.persistence_mode,
                    "accounting_mode": d.accounting_mode,
                }
                for d in stack.nvml_devices
            ],
        },
    }


def scan_document(report: ScanReport, fmt: str) -> dict[str, Any]:
    """``{"scanner", "host", "summary", "findings"}``; findings in ``fmt`` (a ``scan --format``)."""
    host = host_fields()
    output = SCAN_FORMATS[fmt]
    target = Target(host, host["hostname"], SCAN_DATASET)
    findings = [
        bound_document(output.finding(f, report.finished, target), LIMITS, output.mark_path)
        for f in report.sorted_findings()
    ]
    schema = dict(output.scan_schema)
    return {
        "scanner": {
            "name": "gpuguard",
            "version": __version__,
            "command": "scan",
            "started": iso_time(report.started),
            "finished": iso_time(report.finished),
            "pid": os.getpid(),
            "euid": os.geteuid(),
            "options": dict(report.options),
            "schema": schema,
        },
        "host": host,
        "summary": summary_fields(report),
        "findings": findings,
    }
