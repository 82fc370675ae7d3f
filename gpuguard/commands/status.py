"""`gpuguard status`: is an agent running here, and what is it seeing (from its state file)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpuguard.agent.config import DEFAULT_STATUS_PATH
from gpuguard.commands.options import add_state_file_option

HELP = (
    "show whether the agent runs, its mode, rules, probes, event rate, drops, last findings "
    "and active host findings"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_state_file_option(parser, f"the agent's state file (default {DEFAULT_STATUS_PATH})")
    parser.add_argument("--json", action="store_true", help="print the state document as JSON")


def render(doc: dict, alive: bool, why: str, now: float) -> list[str]:
    from gpuguard.escape import escape_text

    rules = doc.get("rules", {})
    drops = doc.get("drops", {})
    lines = [
        f"agent:      {'running' if alive else 'not running'} ({why}), pid {doc.get('pid')}, "
        f"up {now - float(doc.get('started', now)):.0f} s",
        f"mode:       {doc.get('mode')}{' (dry run)' if doc.get('dry_run') else ''}",
        f"sensor:     {doc.get('sensor')}, {doc.get('probes_attached', 0)} probes attached",
        f"headers:    {escape_text((doc.get('headers') or {}).get('detail') or 'none (no probes compiled)')}",
        f"rules:      version {rules.get('version')} (generation {rules.get('generation')})"
        + (f"; last reload FAILED: {escape_text(rules['error'])}" if rules.get("error") else ""),
        f"events:     {doc.get('events_per_s', 0)}/s, {doc.get('events_total', 0)} in all; "
        f"{doc.get('processes_tracked', 0)} processes tracked",
        f"drops:      ring {sum(drops.get('ring_lost', {}).values())}, intake {sum(drops.get('intake', {}).values())}, "
        f"log {drops.get('output', 0)} (log write errors {drops.get('output_errors', 0)})",
    ]
    config = doc.get("config") or {}
    if config.get("error"):
        lines.insert(3, f"config:     last reload FAILED: {escape_text(config['error'])}")
    log = doc.get("log", {})
    if log.get("faults"):
        lines.append(f"log faults: {log['faults']}, last: {escape_text(log.get('last_error', ''))}")
    for spot in doc.get("blind_spots", []):
        lines.append(f"blind spot: {escape_text(spot)}")
    findings = doc.get("last_findings", [])
    lines.append(f"last findings ({len(findings)}):" if findings else "last findings: none")
    for f in reversed(findings[-10:]):
        when = time.strftime("%H:%M:%S", time.localtime(float(f.get("time", 0))))
        lines.append(
            f"  {when} pid {f.get('pid')} {escape_text(f.get('comm', ''))}: {f.get('verdict')} "
            f"score {f.get('score')} ({', '.join(escape_text(r) for r in f.get('rule_ids', [])[:4])})"
        )
    acting = doc.get("rules_acting", [])
    lines.append(
        "rule by rule, enforce would act / acted:" if acting else "rule by rule: nothing to act on"
    )
    for row in acting:

        def steps(counts: dict) -> str:
            return ", ".join(f"{escape_text(a)} {n}" for a, n in counts.items()) or "-"

        names = ", ".join(escape_text(n) for n in row.get("processes", []))
        lines.append(
            f"  {escape_text(row.get('rule', '')):34} would act: {steps(row.get('would_act', {}))}; "
            f"acted: {steps(row.get('acted', {}))}" + (f" ({names})" if names else "")
        )
    hosts = doc.get("host_findings", [])
    lines.append(f"active host findings ({len(hosts)}):" if hosts else "active host findings: none")
    for h in hosts:
        since = time.strftime("%H:%M:%S", time.localtime(float(h.get("since", 0))))
        lines.append(
            f"  since {since} {escape_text(h.get('rule_id', ''))}: {escape_text(h.get('detail', ''))}"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    from gpuguard.agent.status_file import agent_alive, read_status

    doc = read_status(args.state_file)
    now = time.time()
    alive, why = agent_alive(doc, now)
    if args.json:
        json.dump(
            {**doc, "alive": alive, "alive_reason": why}, sys.stdout, indent=2, ensure_ascii=True
        )
        sys.stdout.write("\n")
    else:
        print("\n".join(render(doc, alive, why, now)))
    return 0 if alive else 3
