"""`gpuguard scan`: a one-shot, read-only audit of this host for miners and GPU abuse.

Wiring only, in data-flow order (docs/scan.md explains each check).

Details: docs/internals.md, "scan".
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

from gpuguard.commands.options import add_rules_option, seconds
from gpuguard.errors import GpuguardError
from gpuguard.outputs.records import SCAN_FORMATS

HELP = "audit this host once for miners and GPU abuse (read-only)"
FORMATS = ("table", *SCAN_FORMATS)  # table: the console report; the rest: one JSON document
MAX_CPU_SAMPLE_S = 10.0
MAX_GPU_WINDOW_S = 600.0
DEFAULT_GPU_WINDOW_S = 3.0
MAX_CPU_WINDOW_S = 60.0
DEFAULT_CPU_WINDOW_S = 3.0


def _choices_help(choices: list[str]) -> str:
    """``a, b or c``."""
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="same as --format json (ECS findings)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help=_choices_help(
            ["table (default)", *(f"{n} ({f.scan_help})" for n, f in SCAN_FORMATS.items())]
        ),
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also scan process memory with the YARA rules (slower; progress on a terminal)",
    )
    add_rules_option(
        parser,
        "rules file to use instead of the default set; repeat to layer files "
        "(list rules/miner-rules.yaml first to extend the shipped rules)",
    )
    parser.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="filesystem root for autostart files, /etc/ld.so.preload and device nodes (default /)",
    )
    parser.add_argument(
        "--cpu-sample",
        type=seconds("--cpu-sample", zero_means="measures no CPU window", maximum=MAX_CPU_SAMPLE_S),
        default=0.5,
        metavar="SECONDS",
        help="window over which every process's CPU use is measured (default 0.5)",
    )
    parser.add_argument(
        "--gpu-window",
        type=seconds("--gpu-window", zero_means="samples no GPU", maximum=MAX_GPU_WINDOW_S),
        default=DEFAULT_GPU_WINDOW_S,
        metavar="SECONDS",
        help="sample every GPU process, and the TCP counters of its connections, once a second "
        f"for this long while the scan runs, for the behaviour rules (default "
        f"{DEFAULT_GPU_WINDOW_S:g}; 60 gives them a full minute and shows a 15 s share "
        "cadence; docs/gpus.md, docs/scan.md)",
    )
    parser.add_argument(
        "--cpu-window",
        type=seconds("--cpu-window", zero_means="loads no FPU probe", maximum=MAX_CPU_WINDOW_S),
        default=DEFAULT_CPU_WINDOW_S,
        metavar="SECONDS",
        help="when a process has a thread that never sleeps (or one paused from outside), watch "
        "the SSE rounding modes its threads are switched out in for this long with the FPU "
        f"probe, for RandomX's pattern (default {DEFAULT_CPU_WINDOW_S:g}; longer, up to 3x, while "
        "one has too few context switches to judge; 0: off; needs CAP_BPF and CAP_PERFMON; docs/scan.md)",
    )
    parser.add_argument(
        "--no-yara", action="store_true", help="skip YARA scanning of executables and memory"
    )


# ---- option checks ----------------------------------------------------------------


def _output_format(args: argparse.Namespace) -> str:
    if args.json and args.format not in (None, "json"):
        raise GpuguardError(
            f"--json and --format {args.format} contradict each other", "give one of them"
        )
    return "json" if args.json else (args.format or "table")


def _check_options(args: argparse.Namespace) -> None:
    if not os.path.isdir(args.root):
        raise GpuguardError(
            f"--root {args.root} is not a directory", "point --root at a filesystem tree, e.g. /"
        )
    if args.deep and args.no_yara:
        raise GpuguardError(
            "--deep scans memory with YARA, so it cannot be combined with --no-yara",
            "drop one of them",
        )


# ---- engine glue -----------------------------------------------------------------


def _vocabulary(ruleset):
    from gpuguard.detect.host.checks import MinerVocabulary

    def words(name: str) -> list[str]:
        return [str(v).lower() for v in ruleset.lists.get(name, [])]

    return MinerVocabulary(
        miner_names=frozenset(words("miner_names")),
        url_schemes=frozenset(words("stratum_schemes")),
        pool_domains=tuple(words("pool_domains")),
        miner_flags=frozenset(words("miner_flags")),
    )


def _yara_scanner(ruleset, args: argparse.Namespace, notes: list[str]):
    if args.no_yara or not ruleset.yara_files:
        return None
    from gpuguard.detect.yara.persistent import PersistentYaraScanner

    try:
        scanner = PersistentYaraScanner.for_files(ruleset.yara_files)
    except OSError as exc:
        raise GpuguardError(
            f"cannot read YARA file {exc.filename}: {exc.strerror}",
            "fix the yara: entries of the rules file",
        ) from None
    if scanner.note:
        notes.append(scanner.note)
    return scanner


def _deep_scan(correlator, scanner, err_console, show_progress: bool) -> int:
    """YARA over each process's memory; returns how many processes could not be read."""
    states = [s for s in correlator.states() if s.facts is not None and not s.facts.kernel_thread]
    failures = 0

    def scan_one(state) -> None:
        nonlocal failures
        errors_before = scanner.stats["errors"]
        result = scanner.scan_memory(state.pid)
        if scanner.stats["errors"] > errors_before and not result:
            failures += 1
        state.add_yara_result(result.rules, result.tags)

    if show_progress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(
            TextColumn("scanning memory"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        ) as progress:
            task = progress.add_task("memory", total=len(states))
            for state in states:
                scan_one(state)
                progress.advance(task)
    else:
        for state in states:
            scan_one(state)
    return failures


# ---- host checks -----------------------------------------------------------------


def _read_ld_so_preload(root: str) -> str | None:
    path = os.path.join(root, "etc/ld.so.preload")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    finally:
        os.close(fd)


def _probe_hidden_pids(obs, limitations: list[str]):
    """Hidden pids, with their facts added to ``obs`` so the rules score them like any process."""
    from gpuguard.sources.gpu.fd_holders import holders_of_pid
    from gpuguard.sources.proc.hidden_pids import find_hidden_pids
    from gpuguard.sources.proc.process import collect_process_facts

    hidden = find_hidden_pids(obs.listed_pids, {f.ppid for f in obs.facts.values()}, obs.gpu_pids())
    limitations.extend(hidden.unavailable)
    for entry in hidden.hidden:
        facts = collect_process_facts(entry.pid)
        if facts is not None:
            obs.facts[entry.pid] = facts
            obs.holders.holders.extend(holders_of_pid(entry.pid) or [])
    return hidden


def _host_findings(args, ruleset, obs, hidden, limitations: list[str], notes: list[str]):
    from gpuguard.detect.host import checks as host_checks
    from gpuguard.detect.host.check_list import SCAN, HostInputs, run_host_checks
    from gpuguard.sources.host.gpu_stack import collect_gpu_stack
    from gpuguard.sources.host.persistence import collect_autostart_files

    stack = collect_gpu_stack(root=args.root)
    sampler_said_nvml = any(n.startswith("NVML") for n in notes)
    notes.extend(n for n in stack.unavailable if not (sampler_said_nvml and n.startswith("NVML")))
    autostart = collect_autostart_files(args.root)
    if autostart.unreadable:
        limitations.append(
            f"could not read {len(autostart.unreadable)} autostart files or directories "
            f"(e.g. {autostart.unreadable[0]}); run as root to see them"
        )
    for partly in autostart.partly_read:
        limitations.append(f"read only part of autostart file {partly}")
    inputs = HostInputs(
        autostart_files=autostart.files,
        vocabulary=_vocabulary(ruleset),
        ld_so_preload=_read_ld_so_preload(args.root) or "",
        gpu_stack=stack,
        hidden_pids=hidden.hidden,
        snapshots=obs.snapshots,
        pid_states=obs.gpu_pid_states(),
        accounting=obs.accounting,
        tuning_root=args.root,
    )
    findings = run_host_checks(SCAN, inputs)  # the one list the agent reads too
    host_checks.apply_thresholds(findings, ruleset.thresholds)
    counters = {
        "autostart_files": len(autostart.files),
        "hidden_pid_candidates": hidden.candidates_checked,
    }
    return findings, stack, counters


def _look_at_sessions(obs, correlator, verdicts, limitations: list[str], now: float) -> int:
    """tcp_info of the established connections of every process that scored anything (one
    read, no window; GPU holders watched over the window already have theirs), fed to the
    correlator; returns how many records were fed (0: nothing to score again)."""
    from gpuguard.sources.net.session_window import one_look

    watched = {s.pid for s in obs.sessions}
    pids = {
        v.pid
        for v in verdicts
        if v.score > 0 and v.pid in obs.connections.by_pid and v.pid not in watched
    }
    if not pids:
        return 0

    def header_of(pid: int) -> tuple[str, int]:
        facts = obs.facts[pid]
        return facts.comm, max(facts.uid, 0)

    def age_of(pid: int) -> float:
        started = obs.facts[pid].start_time
        return now - started if started else 0.0

    records, unreadable = one_look(pids, header_of, age_of, now)
    limitations.extend(f"could not read {line}; run as root to see them" for line in unreadable)
    for record in records:
        correlator.feed(record)
    return len(records)


def _rounding_lines(obs, window_s: float, limitations: list[str], notes: list[str]) -> None:
    """What the FPU window could not do: not loaded where candidates were, or cut short."""
    from gpuguard.events.rounding_modes import MIN_LOOKS

    candidates = len(set(obs.cpu_activity) | set(obs.paused))
    window = obs.rounding
    if not candidates or window_s <= 0:
        return
    if window.blind_spot:
        limitations.append(
            f"{window.blind_spot}: {candidates} processes with a thread that never sleeps were "
            "not checked for RandomX's rounding-mode pattern"
        )
    elif window.short:
        notes.append(
            f"the CPU window ran {window.observed_s:.1f} s (of {window_s:g} s asked, at most "
            f"{window_s * 3:g}): {window.short} processes that left round-to-nearest still had "
            f"too few context switches to judge their rounding-mode pattern (fewer than "
            f"{MIN_LOOKS}, or too few to tell even shares from a test suite's; a lone thread on "
            "an idle core is switched out only a few times a second); a longer --cpu-window, "
            "e.g. 30, or the agent judges them"
        )
    elif window.extended:
        notes.append(
            f"the CPU window ran {window.observed_s:.1f} s (of {window_s:g} s asked) until "
            "every process that left round-to-nearest had enough context switches to judge"
        )


# ---- the command -----------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    # One short pass that builds ~100 objects per process and frees them on exit: the cycle
    # collector would walk them again and again (~0.5x a bare psutil walk) and find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if collecting:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    fmt = _output_format(args)
    _check_options(args)
    from rich.console import Console

    from gpuguard.correlate.correlator import Correlator
    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.scoring.engine import DetectionEngine
    from gpuguard.outputs.finding import finding_from_host, finding_from_verdict
    from gpuguard.outputs.jsonl import dumps_document
    from gpuguard.outputs.scan_report import ScanReport, render_console, scan_document
    from gpuguard.sources.host.observation import limitation_lines, observe_host
    from gpuguard.sources.proc.config_files import CwdWithoutConfigs, attach_config_files

    ruleset = load_ruleset(args.rules)
    started = time.time()
    notes: list[str] = []
    scanner = _yara_scanner(ruleset, args, notes)

    obs = observe_host(
        cpu_sample_s=args.cpu_sample, gpu_window_s=args.gpu_window, fpu_window_s=args.cpu_window
    )
    notes.extend(obs.gpu_status)
    if obs.gpu_window_skipped:
        notes.append(
            f"the {args.gpu_window:g} s GPU window was skipped: no GPU sampler works here and "
            "no process holds a GPU device, so there was nothing to watch"
        )
    limitations = limitation_lines(obs)
    _rounding_lines(obs, args.cpu_window, limitations, notes)
    hidden = _probe_hidden_pids(obs, limitations)
    if scanner is not None:
        scanner.environ_read = obs.environs  # read with the facts: not read again

    # config files read here, each working directory without any looked up once (not per process)
    correlator = Correlator(facts_provider=obs.facts.get)
    engine = DetectionEngine(correlator, ruleset, yara_scanner=scanner)
    empty_cwds = CwdWithoutConfigs()
    for facts in sorted(obs.facts.values(), key=lambda f: (f.start_time, f.pid)):
        correlator.feed(attach_config_files(facts, empty_cwds=empty_cwds))
    for event in obs.events():
        correlator.feed(event)
    for snapshot in obs.snapshots:
        correlator.feed(snapshot)
    for record in obs.accounting:
        correlator.feed(record)

    err_console = Console(file=sys.stderr, highlight=False)
    if args.deep and scanner is not None:
        unreadable = _deep_scan(correlator, scanner, err_console, show_progress=sys.stderr.isatty())
        if unreadable:
            limitations.append(
                f"could not read the memory of {unreadable} processes; run as root to see them"
            )
    if scanner is not None:
        scanner.save()
        if scanner.note and scanner.note not in notes:
            notes.append(scanner.note)

    now = time.time()
    verdicts = engine.score(now)  # every process is new: all are scored
    if _look_at_sessions(obs, correlator, verdicts, limitations, now):
        # Only the processes whose sessions were read are scored again: their new verdicts
        # replace their first ones, every other process keeps its own.
        again = {v.key: v for v in engine.score(now)}
        verdicts = [again.pop(v.key, v) for v in verdicts] + list(again.values())
    findings = []
    for verdict in verdicts:
        state = correlator.get(verdict.key)
        if verdict.score > 0 and state is not None:
            findings.append(finding_from_verdict(verdict, state.facts, ruleset))

    host_findings, stack, host_counters = _host_findings(
        args, ruleset, obs, hidden, limitations, notes
    )
    findings += [finding_from_host(h) for h in host_findings]

    counters = {
        "processes": len(obs.facts),
        "gpu_handles": len(obs.holders.holders),
        "connections": sum(len(c) for c in obs.connections.by_pid.values()),
        "gpu_snapshots": len(obs.snapshots),
        "gpu_sessions": len(obs.sessions),
        "gpu_accounting_records": len(obs.accounting),
        "cpu_window_candidates": len(obs.rounding.activity),
        **host_counters,
    }
    if scanner is not None:
        counters.update({f"yara_{k}": v for k, v in scanner.stats.items()})
    report = ScanReport(
        started=started,
        finished=time.time(),
        findings=findings,
        gpu_stack=stack,
        processes_scanned=len(obs.facts),
        suspicious_threshold=ruleset.thresholds.suspicious,
        malicious_threshold=ruleset.thresholds.malicious,
        limitations=limitations,
        notes=notes,
        counters=counters,
        options={
            "deep": args.deep,
            "yara": not args.no_yara,
            "root": args.root,
            "cpu_sample_s": args.cpu_sample,
            "gpu_window_s": args.gpu_window,
            "gpu_window_observed_s": round(obs.gpu_window_s, 1),
            "gpu_window_skipped": obs.gpu_window_skipped,
            "cpu_window_s": args.cpu_window,
            "cpu_window_observed_s": round(obs.rounding.observed_s, 1),
            "cpu_window_load_s": round(obs.rounding.load_s, 2),
            "rules": [str(p) for p in ruleset.sources],
        },
    )
    if fmt == "table":
        # A pipe or file gets wide lines rather than an 80-column wrap.
        width = None if sys.stdout.isatty() else 160
        render_console(report, Console(file=sys.stdout, highlight=False, width=width))
    else:
        sys.stdout.write(dumps_document(scan_document(report, fmt)) + "\n")
    sys.stdout.flush()
    return report.exit_code
