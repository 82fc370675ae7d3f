"""The agent's detect loop and its start-up and teardown: thin wiring, no detection logic.

Start-up is an ordered list of small steps (signals, rules, log, metrics,
sensor or reduced mode, correlator and detection engine, seed sweep,
producers, state file); teardown always runs, whatever step failed: producers
stop, what they queued is scored, a summary line is written, the YARA cache is
saved, the probes are detached, the log is flushed, the state file says the
agent stopped and the metrics endpoint closes.

The loop takes everything the producers queued (waiting on a condition, never
spinning), feeds the correlator, rescores the changed processes
(:class:`~gpuguard.detect.scoring.engine.DetectionEngine`), writes each process
finding's records as :class:`~gpuguard.agent.findings.ProcessFindings` decides
(a create when a verdict first crosses a threshold or a ``gpu-abuse`` rule
first matches, coalesced updates as the evidence grows, a close when the
process ends), hands creates and escalations to the action interface, runs
the GPU host checks
(:class:`~gpuguard.agent.host_findings.GpuHostFindings`, never acted on),
every few seconds checks the config's guard policies over the live processes
(reported the same way, with their own bookkeeping so rule and guard
verdicts of one process do not flap), refreshes
the state file and the metrics, expires old processes, lets the responder
lift expired blocks and reports drops.  The log and
the metrics are :class:`~gpuguard.agent.telemetry.AgentTelemetry`'s.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.agent import status_file
from gpuguard.agent.actions import ALERT_VERDICTS, make_responder
from gpuguard.agent.config import AgentConfig, load_config, with_overrides
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.exec_interest import exec_interest
from gpuguard.agent.findings import ProcessFindings, Write
from gpuguard.agent.host_findings import GpuHostFindings
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.memory import release_compiler_pages, return_freed_memory
from gpuguard.agent.producers import SamplerThread, SensorThread, SweepThread, sweep_once
from gpuguard.agent.telemetry import AgentTelemetry
from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.guard_policies import evaluate_guard_policies
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.events.agent_events import ActionOutcome, AgentLifecycle
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.sources.proc.cpu_usage import CpuActivitySampler, CpuSampler
from gpuguard.sources.proc.identity import first_sight, raise_fd_limit

HOUSEKEEPING_S = 10.0  # expire old processes and report drops this often
RULE_FILE_CHECK_S = 2.0  # look for changed rule files this often
GUARD_CHECK_S = 2.0  # evaluate the guard policies this often
BATCH_ITEMS = 2048  # items fed per pass of the loop (a stop waits for at most one batch)
FINAL_FEED_S = 0.5  # at stop, what is queued is fed for this long; the rest is counted as dropped
STATUS_HEARTBEAT = 3  # an unchanged state file is rewritten every this many status intervals
_STATUS_CLOCKS = frozenset(
    (
        "updated",
        "events_per_s",
        "samples",
        "sampler_seconds",
        "scoring_runs",
        "scoring_seconds",
        "sweeps",
        "sweep_seconds",
        "gpus",  # utilisation and power move with each sample: a new GPU shows at the heartbeat
    )
)
REDUCED_MODE_BLIND_SPOTS = (
    "processes that start and exit between two /proc sweeps (every {sweep:g} s) are not seen",
    "GPU ioctl counts and rates are not seen (rules on ioctl commands cannot match)",
    "network payloads (stratum logins, pool methods on the wire) are not seen",
    "connections that open and close between sweeps, or live in another network namespace, are not seen",
)


def rules_version(ruleset: Any) -> str:
    """A short digest of the rule files' contents: equal on every host with the same rules."""
    digest = hashlib.sha256()
    for path in list(ruleset.sources) + list(ruleset.yara_files):
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(str(path).encode())
    return digest.hexdigest()[:12]


def _stderr(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


class Agent:
    """One running agent.  ``run()`` blocks until SIGTERM/SIGINT (or :meth:`request_stop`)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        config_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        sampler_openers: dict[str, Callable[[], Any]] | None = None,
        install_signals: bool = True,
        proc_root: str = "/proc",
        stderr: Callable[[str], None] = _stderr,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}
        self.sampler_openers = sampler_openers
        self.install_signals = install_signals
        self.proc_root = proc_root
        self.stderr = stderr
        self.counters = AgentCounters(mode=config.mode)
        self.stop = threading.Event()
        self.ready = threading.Event()  # set once start-up finished (tests, selftest)
        self.intake = BoundedQueue(config.intake_queue, on_drop=self._intake_dropped)
        self.counters.intake_capacity = config.intake_queue
        self.rules: Any = None  # RuleSetHolder
        self.telemetry = AgentTelemetry(config, self.counters, stderr)  # the log and the metrics
        self.sensor: Any = None
        self.correlator: Any = None
        self.engine: Any = None  # DetectionEngine: rules and YARA over the correlator
        self.responder: Any = None
        self.threads: list[threading.Thread] = []
        # process findings: create, coalesced updates, close (gpuguard/agent/findings.py)
        self.findings = ProcessFindings(config.finding_update_interval_s, proc_root=proc_root)
        self._guard_reported: dict[
            ProcessKey, tuple
        ] = {}  # guard verdict and policies last written
        self._session_watched: set[ProcessKey] = set()  # given activity records for their score
        self._exec_marked: set[ProcessKey] = set()  # execs in full for their score (exec filter)
        # orphaned GPU memory, past GPU users, host tuning (read under the root that holds proc_root)
        self.host_findings = GpuHostFindings(
            config.host_check_interval_s, str(Path(proc_root).parent)
        )
        self._hup = False
        self._status_due = 0.0
        self._status_soon = False
        self._status_content: Any = None  # what the state file last said, less its clocks
        self._status_heartbeat = 0.0
        self._events_at_status = (time.monotonic(), 0)
        self.events_per_s = 0.0
        self._drops_reported = 0
        self.housekeeping_s = HOUSEKEEPING_S
        self.cpu_sampler = CpuSampler(proc_root)  # CPU windows of huge-page users and host tuners
        self.cpu_activity = CpuActivitySampler(proc_root)  # their runnable threads, FPU rounding

    # -- plumbing ---------------------------------------------------------------------
    def _intake_dropped(self, producer: str, count: int) -> None:
        self.counters.intake_dropped[producer] += count

    def emit(self, record: Any) -> None:
        """Queue a record for the log (any thread)."""
        self.telemetry.write(record)

    def lifecycle(self, action: str, message: str, **detail: Any) -> None:
        self.emit(AgentLifecycle(time=time.time(), action=action, message=message, detail=detail))

    def request_stop(self) -> None:
        self.stop.set()
        self.intake.wake()

    def request_reload(self) -> None:
        self._hup = True

    # -- start-up steps, in order ----------------------------------------------------------
    def _step_rules(self) -> None:
        from gpuguard.detect.ruleset.reload import RuleSetHolder

        self.rules = RuleSetHolder(self.config.rules, log=lambda line: None)
        self._note_rules()

    def _note_rules(self) -> None:
        # The digest is taken when a set is loaded: the files on disk may already be newer (and broken).
        if self.rules.generation != self.counters.rules_generation:
            self.counters.rules_version = rules_version(self.rules.current)
        self.counters.rules_generation = self.rules.generation
        self.counters.rules_error = self.rules.last_error

    def _step_log(self) -> None:
        self.telemetry.open_log()

    def _step_sensor(self) -> None:
        from gpuguard.sources.ebpf.probe_source import ProbeSettings
        from gpuguard.sources.ebpf.sensor import Sensor

        reason = "--sensor proc was asked for"
        if self.config.sensor != "proc":
            # The exec filter: plain short-lived execs stay in the kernel (counted per cgroup);
            # the names and directories the rules score at exec go up in full.
            sensor = Sensor(
                ProbeSettings(exec_filter=True),
                drain_interval=0.5,
                fpu=True,
                exec_names=exec_interest(self.rules.current),
            )
            try:
                sensor.start()
            except GpuguardError as exc:
                sensor.close()
                if self.config.sensor == "ebpf":
                    raise
                reason = f"eBPF sensor unavailable: {exc.one_line()}"
            else:
                self.sensor = sensor
                return_freed_memory()  # compiling left ~25 MB of LLVM heap free but mapped
                self.counters.sensor_mode = "ebpf"
                self.counters.probes_attached = _probes_attached(sensor)
                if sensor.fpu is not None and sensor.fpu.blind_spot:
                    self.counters.blind_spots = [sensor.fpu.blind_spot]
                    self.stderr(f"gpuguard: blind spot: {sensor.fpu.blind_spot}")
                return
        self.counters.sensor_mode = "proc"
        self.counters.blind_spots = [
            line.format(sweep=self.config.sweep_interval_s) for line in REDUCED_MODE_BLIND_SPOTS
        ]
        self.lifecycle(
            "degraded",
            f"reduced mode (/proc sweeps every {self.config.sweep_interval_s:g} s): {reason}",
            blind_spots=self.counters.blind_spots,
        )
        for line in self.counters.blind_spots:
            self.stderr(f"gpuguard: reduced mode blind spot: {line}")

    def _comm_of(self, pid: int) -> str | None:
        state = self.correlator.state_of(pid)
        return state.comm if state is not None else None

    def _step_correlator(self) -> None:
        from gpuguard.correlate.correlator import Correlator
        from gpuguard.detect.scoring.engine import DetectionEngine
        from gpuguard.sources.proc.process import collect_process_facts

        def facts_of(pid: int) -> Any:
            return collect_process_facts(pid, self.proc_root)

        generations = self.sensor.exit_generations if self.sensor is not None else None
        if generations is not None:
            raise_fd_limit()  # a pidfd is held per tracked process (at most max_processes)
        self.correlator = Correlator(
            facts_provider=facts_of,
            max_processes=self.config.max_processes,
            proc_root=self.proc_root,
            identify=first_sight(generations),
        )
        self.engine = DetectionEngine(
            self.correlator, self.rules.current, yara_scanner=self._yara_scanner(self.rules.current)
        )
        self.rules.on_change = self._use_ruleset
        self._make_responder()

    def _yara_scanner(self, ruleset: Any) -> Any:
        """YARA over each new executable, with the verdict cache ``scan`` keeps; None without YARA files."""
        if not ruleset.yara_files:
            return None
        from gpuguard.detect.yara.persistent import PersistentYaraScanner

        try:
            scanner = PersistentYaraScanner.for_files(ruleset.yara_files)
        except OSError as exc:
            self.lifecycle(
                "degraded", f"YARA scanning off: cannot read {exc.filename}: {exc.strerror}"
            )
            return None
        if scanner.note:
            self.lifecycle("degraded", f"YARA: {scanner.note}")
        return scanner

    def _use_ruleset(self, ruleset: Any) -> None:
        """A reloaded rule set: rescore everything; a changed YARA file list gets a new scanner."""
        engine = self.engine
        if [str(p) for p in ruleset.yara_files] != [str(p) for p in engine.ruleset.yara_files]:
            if engine.yara_scanner is not None:
                engine.yara_scanner.save()
            engine.yara_scanner = self._yara_scanner(ruleset)
        engine.set_ruleset(ruleset)
        if self.sensor is not None:
            self.sensor.set_exec_names(*exec_interest(ruleset))

    def _make_responder(self) -> None:
        """A responder for the current config; the previous one is closed first (its pinned blocks stay)."""
        settings = self.config.response
        if self.responder is not None:
            self.responder.close()
            self.responder = None
        # outcomes that come later (SIGKILL after the grace, hook results, kill-on-touch kills) are
        # counted and kept for the state file like those the responder returns at once
        self.responder = make_responder(
            settings,
            self.config.mode,
            self.config.dry_run,
            lambda outcome: self._record_outcomes([outcome]),
            self.sensor.exit_generations if self.sensor is not None else None,
        )
        self.counters.mode = self.config.mode

    def _known(self, pid: int, start_time: float) -> bool:
        return self.correlator.get(ProcessKey(pid, start_time)) is not None

    def _step_seed(self) -> None:
        """One /proc sweep before the loop: a miner that started before the agent is scored at once."""
        self._feed(sweep_once(self.counters, self._known, self.proc_root))
        self._score(time.time())

    def _step_producers(self) -> None:
        if self.sensor is not None:
            self.threads.append(
                SensorThread(self.sensor, self.intake, self.counters, self.stop, self.emit)
            )
        else:
            self.threads.append(
                SweepThread(
                    self.intake,
                    self.counters,
                    self.stop,
                    self.emit,
                    self._known,
                    self.config.sweep_interval_s,
                    self.proc_root,
                )
            )
        for source, opener in self._sampler_openers().items():
            self.threads.append(
                SamplerThread(
                    source,
                    opener,
                    self.intake,
                    self.counters,
                    self.stop,
                    self.emit,
                    interval=self.config.sample_interval_s,
                    accounting_interval=self.config.host_check_interval_s,
                    turn_accounting_on=self.config.nvml_accounting,
                )
            )
        for thread in self.threads:
            thread.start()

    def _sampler_openers(self) -> dict[str, Callable[[], Any]]:
        if self.sampler_openers is not None:
            return self.sampler_openers
        from gpuguard.sources.gpu.sampler import SourceUnavailable, open_samplers

        def opener(source: str) -> Callable[[], Any]:
            def open_one() -> Any:
                statuses: list[str] = []
                samplers = open_samplers(
                    [source], proc_root=self.proc_root, on_status=statuses.append
                )
                if not samplers:
                    raise SourceUnavailable(
                        statuses[0] if statuses else f"{source} is not available"
                    )
                return samplers[0]

            return open_one

        return {source: opener(source) for source in self.config.gpu_sources}

    def _step_metrics(self) -> None:
        self.telemetry.serve_metrics()

    def _step_signals(self) -> None:
        if not self.install_signals:
            return
        signal.signal(signal.SIGTERM, lambda signum, frame: self.request_stop())
        signal.signal(signal.SIGINT, lambda signum, frame: self.request_stop())
        signal.signal(signal.SIGHUP, lambda signum, frame: self.request_reload())

    def _step_started(self) -> None:
        ruleset = self.rules.current
        self.telemetry.started(self.config.mode)
        self.lifecycle(
            "start",
            f"agent started: mode {self.config.mode}{' (dry run)' if self.config.dry_run else ''}, "
            f"sensor {self.counters.sensor_mode}, {len(ruleset.rules)} rules "
            f"(version {self.counters.rules_version}), {len(self.correlator)} processes seeded",
            mode=self.config.mode,
            sensor=self.counters.sensor_mode,
            pid=os.getpid(),
            rules=[str(p) for p in ruleset.sources],
            blind_spots=self.counters.blind_spots,
            config=self.config.source or None,
        )
        release_compiler_pages()  # the probes are compiled: LLVM's ~80 MB of code can go
        self._write_status(time.time())
        self.ready.set()
        self.telemetry.watch(self.ready, self.threads)  # /readyz, /healthz

    # -- run ----------------------------------------------------------------------------
    def run(self) -> int:
        steps = (
            self._step_signals,
            self._step_rules,
            self._step_log,
            self._step_metrics,
            self._step_sensor,
            self._step_correlator,
            self._step_seed,
            self._step_producers,
            self._step_started,
        )
        try:
            for step in steps:
                if self.stop.is_set():
                    break
                step()
            self._loop()
        finally:
            self._teardown()
        return 0

    def _loop(self) -> None:
        next_housekeeping = next_rules_check = next_guard_check = next_host_check = (
            time.monotonic() + 1.0
        )
        while not self.stop.is_set():
            self.telemetry.loop_turned()  # /healthz liveness (and its fault-injection stall)
            # Bounded batches: under a flood a stop or reload waits for one batch, not the queue.
            items = self.intake.take_all(0.25, BATCH_ITEMS)
            now = time.time()
            self.counters.intake_depth = len(self.intake)
            self._feed(items)
            mono = time.monotonic()
            if self._hup:
                self._hup = False
                self._reload("SIGHUP")
            elif mono >= next_rules_check:
                next_rules_check = mono + RULE_FILE_CHECK_S
                self._check_rule_files()
            self._score(now)
            if mono >= next_guard_check:
                next_guard_check = mono + GUARD_CHECK_S
                self._check_guard_policies(now)
            if mono >= next_host_check:
                next_host_check = mono + self.config.host_check_interval_s
                self._check_host_findings(now)
            self.telemetry.sync_log()
            if mono >= next_housekeeping:
                next_housekeeping = mono + self.housekeeping_s
                self._housekeeping(now)
            if self._status_soon or mono >= self._status_due:
                self._write_status(now)

    def _final_feed(self) -> None:
        """At stop: feed what is queued for at most FINAL_FEED_S; count what is left (never silent)."""
        deadline = time.monotonic() + FINAL_FEED_S
        while time.monotonic() < deadline:
            items = self.intake.take_all(0, BATCH_ITEMS)
            if not items:
                return
            self._feed(items)
        left = len(self.intake.take_all(0))
        if left:
            self._intake_dropped("shutdown", left)

    def _feed(self, items: list) -> None:
        feed = self.correlator.feed
        observe = self.telemetry.observe_item
        keep, host_inputs = self.host_findings.observe, self.host_findings.INPUTS
        for item in items:
            try:
                feed(item)
            except Exception as exc:  # noqa: BLE001 - one malformed item must not stop detection
                self.lifecycle(
                    "fault",
                    f"could not correlate a {type(item).__name__}: {type(exc).__name__}: {exc}",
                )
            observe(item, self._comm_of)  # after feed: the correlator names the pids
            if (
                type(item) in host_inputs
            ):  # GPU snapshots and accounting only: sensor events pass by cheaply
                keep(item)
        self.counters.items_correlated += len(items)

    def _score(self, now: float) -> None:
        started = time.perf_counter()
        verdicts = self.engine.score(now)
        elapsed = time.perf_counter() - started
        self.counters.observe_scoring(elapsed)
        self.telemetry.observe_scoring(elapsed)
        self.counters.processes_tracked = len(self.correlator)
        self._watch_sessions(verdicts)
        self._mark_exec_interest(verdicts)
        get = self.correlator.get
        for verdict in verdicts:
            write = self.findings.scored(verdict, get(verdict.key), now)
            if write is not None:
                self._report_finding(verdict, now, act=write.act, write=write)
        self._write_lifecycle(now)

    def _write_lifecycle(self, now: float, final: bool = False) -> None:
        """The coalesced updates now due and the closes of processes that ended."""
        self.findings.update_interval_s = self.config.finding_update_interval_s  # SIGHUP-able
        for write in self.findings.poll(self.correlator.get, now, final):
            self._report_finding(write.verdict, now, act=False, write=write)

    def _watch_sessions(self, verdicts: list) -> None:
        """Processes scored at least ``sessions.watch_score`` get activity records for their connections
        (GPU holders have them from their first GPU open), once each."""
        threshold = self.config.session_watch_score
        if self.sensor is None or threshold <= 0:
            return
        for verdict in verdicts:
            if verdict.score >= threshold and verdict.key not in self._session_watched:
                self._session_watched.add(verdict.key)
                self.sensor.request_watch(verdict.pid)

    def _mark_exec_interest(self, verdicts: list) -> None:
        """A suspicious or malicious process gets its later execs, and its tree's, in full (the
        sensor's exec filter keeps plain ones in the kernel); once each.  Not every process with
        a score: a benign flood from /tmp would send its whole tree up."""
        if self.sensor is None:
            return
        for verdict in verdicts:
            if verdict.verdict in ALERT_VERDICTS and verdict.key not in self._exec_marked:
                self._exec_marked.add(verdict.key)
                self.sensor.request_interest(verdict.pid)

    def _check_guard_policies(self, now: float) -> None:
        """Guard verdicts, reported on first breach or when the verdict or the broken policies change."""
        policies = self.config.guard_policies
        if not policies:
            self._guard_reported.clear()
            return
        breached: dict[ProcessKey, tuple] = {}
        for verdict in evaluate_guard_policies(
            policies, list(self.correlator.unordered_states()), now
        ):
            said = (verdict.verdict, tuple(sorted({e.rule_id for e in verdict.evidence})))
            breached[verdict.key] = said
            if self._guard_reported.get(verdict.key) != said:
                self._report_finding(verdict, now)
        self._guard_reported = (
            breached  # a process back within every policy is reported again on a new breach
        )

    def _check_host_findings(self, now: float) -> None:
        """GPU host findings (orphaned memory: logged when it appears, changes materially or goes away,
        and kept for status and metrics; past heavy users: logged once).  Never handed to the responder:
        there is no offender process to stop safely."""
        thresholds = self.rules.current.thresholds
        try:
            records = self.host_findings.check(now, thresholds.suspicious, thresholds.malicious)
        except Exception as exc:  # noqa: BLE001 - a failing check is reported, detection goes on
            self.lifecycle("fault", f"GPU host checks failed: {type(exc).__name__}: {exc}")
            return
        for finding in records:
            self.emit(finding)
            if finding.activity != "close":
                self.counters.findings[(finding.rule_id, finding.verdict)] += 1
        if records:
            self.counters.host_findings = [
                {**row, "detail": escape_text(row["detail"])} for row in self.host_findings.active()
            ]
            self.counters.host_findings_active = self.host_findings.active_by_rule()
            self._status_soon = True

    def _report_finding(
        self, verdict: Any, now: float, act: bool = True, write: Write | None = None
    ) -> None:
        state = self.correlator.get(verdict.key)
        facts = state.facts if state is not None else None
        finding = finding_from_verdict(verdict, facts, self.rules.current, state)
        if write is not None:
            self.findings.stamp(finding, write, now)
        self.emit(finding)
        if write is not None and not write.counts:
            return  # a plain update or a close: written, not counted again, never acted on
        self.counters.findings[(finding.rule_id, verdict.verdict)] += 1
        found = time.time()  # after scoring: the moment the finding exists (time to detect)
        self.counters.last_findings.append(
            {
                "time": found,
                "pid": verdict.pid,
                "start_time": verdict.key.start_time,
                "comm": escape_text(verdict.comm),
                "verdict": verdict.verdict,
                "score": verdict.score,
                "rule_ids": finding.rule_ids,
                "allowlisted": verdict.allowlisted,
            }
        )
        self._status_soon = True
        if act and verdict.verdict in ALERT_VERDICTS and not verdict.allowlisted:
            try:
                outcomes = self.responder(verdict, state, now)
            except Exception as exc:  # noqa: BLE001 - a failing action is an outcome, not a crash
                outcomes = [
                    ActionOutcome(
                        time=now,
                        action=verdict.action,
                        status="failed",
                        pid=verdict.pid,
                        comm=verdict.comm,
                        verdict=verdict.verdict,
                        score=verdict.score,
                        reason=f"{type(exc).__name__}: {exc}",
                    )
                ]
            self._record_outcomes(outcomes)

    def _record_outcomes(self, outcomes: list[ActionOutcome]) -> None:
        """Count each action outcome, keep the latest for the state file, and log it."""
        for outcome in outcomes:
            self.counters.actions[(outcome.action, outcome.status)] += 1
            if outcome.pid:
                self.findings.note_action(
                    outcome.pid, outcome.start_time, outcome.action, outcome.status, outcome.time
                )
            if outcome.action == "kill-on-touch" and outcome.status == "done" and outcome.detail:
                if "touch" in outcome.detail:  # a kill (not a placement): by reason
                    self.counters.touch_kills[str(outcome.detail["touch"])] += 1
            self.counters.last_actions.append(
                {
                    "time": outcome.time,
                    "pid": outcome.pid,
                    "action": outcome.action,
                    "status": outcome.status,
                    "reason": escape_text(outcome.reason),
                }
            )
            self.emit(outcome)

    def _sweep_blocks(self, now: float) -> None:
        """The responder lifts expired blocks and stops again a suspended process something resumed.

        Only an acting agent (enforce, not a dry run) touches blocks: monitor mode never acts.
        """
        if not self.responder.acting:
            return
        try:
            outcomes = self.responder.sweep(now)
        except Exception as exc:  # noqa: BLE001 - a failing sweep is reported, detection goes on
            self.lifecycle("fault", f"lifting expired blocks failed: {type(exc).__name__}: {exc}")
            return
        self._record_outcomes(outcomes)

    def _sample_cpu_activity(self, now: float) -> None:
        """Runnable threads of the CPU-miner candidates and of every process the FPU probe saw
        leave round-to-nearest, as CpuActivity records (the CPU-miner rules read them)."""
        fpu_probe = self.sensor.fpu if self.sensor is not None else None
        fpu = fpu_probe.counts() if fpu_probe is not None and fpu_probe.loaded else None
        keys = set(self.correlator.cpu_candidates())
        gone = []
        for pid in fpu or ():
            state = self.correlator.state_of(pid)
            if state is None or state.exited:
                gone.append(pid)
            else:
                keys.add(state.key)
        if gone and fpu_probe is not None:
            fpu_probe.forget([pid for pid in gone if not os.path.exists(f"/proc/{pid}")])
        targets = {}
        for key in keys:
            state = self.correlator.get(key)
            if state is not None:
                targets[key] = (key.pid, state.comm)
        for event in self.cpu_activity.sample(targets, now, fpu):
            self.correlator.feed(event)

    def _housekeeping(self, now: float) -> None:
        self.correlator.expire(now)
        # CPU windows for huge-page users and host tuners (the CPU-miner rules read them)
        for key, percent in self.cpu_sampler.sample(self.correlator.cpu_candidates()).items():
            self.correlator.add_cpu_sample(key, now, percent)
        self._sample_cpu_activity(now)
        self._sweep_blocks(now)
        return_freed_memory()
        for key in [k for k in self._guard_reported if self.correlator.get(k) is None]:
            del self._guard_reported[key]
        self._session_watched = {
            k for k in self._session_watched if self.correlator.get(k) is not None
        }
        self._exec_marked = {k for k in self._exec_marked if self.correlator.get(k) is not None}
        drops = self.counters.drops_total()
        if drops > self._drops_reported:
            self.lifecycle(
                "drops",
                f"{drops - self._drops_reported} events or lines could not be handled "
                f"in the last {self.housekeeping_s:g} s (capacity exceeded)",
                ring_lost=dict(self.counters.ring_lost),
                intake_dropped=dict(self.counters.intake_dropped),
                output_dropped=self.counters.output_dropped,
            )
            self._drops_reported = drops

    def _check_rule_files(self) -> None:
        """A rule file changed on disk: the holder reloads it (or keeps the last good set); say which."""
        generation, error = self.rules.generation, self.rules.last_error
        self.rules.poll()
        self._note_rules()
        if self.rules.generation != generation:
            self._count_reload(True)
            self.lifecycle(
                "reload",
                f"rules reloaded (rule files changed): version {self.counters.rules_version}",
                generation=self.rules.generation,
            )
        elif self.rules.last_error and self.rules.last_error != error:
            self._count_reload(False)
            self.lifecycle(
                "reload-failed",
                "rules not reloaded (rule files changed); keeping the previous rules: "
                f"{self.rules.last_error}",
            )
            self.stderr(
                f"gpuguard: rules not reloaded; keeping the previous rules: {self.rules.last_error}"
            )

    def _reload(self, reason: str) -> None:
        """SIGHUP: read the config and the rules again; a broken file keeps the last good ones."""
        if self.config_path is not None or self.config.source:
            try:
                config = with_overrides(
                    load_config(self.config_path or Path(self.config.source)), **self.overrides
                )
            except GpuguardError as exc:
                self.counters.config_error = exc.one_line()
                self._count_reload(False)
                self.lifecycle(
                    "reload-failed",
                    f"config not reloaded ({reason}); keeping the previous settings: "
                    f"{exc.one_line()}",
                )
                self.stderr(
                    f"gpuguard: config not reloaded; keeping the previous settings: {exc.one_line()}"
                )
                config = self.config
            else:
                self.counters.config_error = None
                restart = [
                    name
                    for name in (
                        "sensor",
                        "log_path",
                        "log_format",
                        "log_max_bytes",
                        "log_keep",
                        "log_syslog_format",
                        "log_facility",
                        "log_limits",
                        "metrics_address",
                        "status_path",
                    )
                    if getattr(config, name) != getattr(self.config, name)
                ]
                if restart:
                    self.lifecycle(
                        "reload", f"changed settings need a restart to apply: {', '.join(restart)}"
                    )
                    for name in restart:
                        setattr(config, name, getattr(self.config, name))
                self.config = config
                self.rules.paths = (
                    [Path(p) for p in config.rules] if config.rules is not None else None
                )
                self._make_responder()
        if self.rules.reload(reason):
            self._note_rules()
            self._count_reload(True)
            self.lifecycle(
                "reload",
                f"rules reloaded ({reason}): {len(self.rules.current.rules)} rules, "
                f"version {self.counters.rules_version}",
                generation=self.rules.generation,
            )
        else:
            self._note_rules()
            self._count_reload(False)
            self.lifecycle(
                "reload-failed",
                f"rules not reloaded ({reason}); keeping the previous rules "
                f"(version {self.counters.rules_version}): {self.rules.last_error}",
            )
            self.stderr(
                f"gpuguard: rules not reloaded; keeping the previous rules: {self.rules.last_error}"
            )
        self._status_soon = True

    def _count_reload(self, ok: bool) -> None:
        self.telemetry.count_reload(ok, self.config.mode)

    # -- state file ---------------------------------------------------------------------
    def status_document(self, now: float, running: bool = True) -> dict[str, Any]:
        mono = time.monotonic()
        then, events_then = self._events_at_status
        if mono - then >= 1.0:
            self.events_per_s = (self.counters.events_total() - events_then) / (mono - then)
            self._events_at_status = (mono, self.counters.events_total())
        sources = [str(p) for p in self.rules.current.sources] if self.rules else []
        return status_file.status_document(
            self.counters, self.config, sources, self.events_per_s, now, running
        )

    def _write_status(self, now: float, running: bool = True) -> None:
        """Write the state file when what it says changed, or as a heartbeat every
        STATUS_HEARTBEAT intervals (readers call an older file stale): an idle agent rewrites
        nothing but that."""
        self._status_soon = False
        mono = time.monotonic()
        self._status_due = mono + self.config.status_interval_s
        self.telemetry.sync_metrics()
        document = self.status_document(now, running)
        content = _status_content(document)
        if running and content == self._status_content and mono < self._status_heartbeat:
            return
        self._status_content = content
        self._status_heartbeat = mono + STATUS_HEARTBEAT * self.config.status_interval_s
        try:
            status_file.write_status(self.config.status_path, document)
        except OSError as exc:
            self.counters.status_errors += 1
            if self.counters.last_status_error != exc.strerror:
                self.counters.last_status_error = exc.strerror or str(exc)
                self.stderr(
                    f"gpuguard: cannot write the state file {self.config.status_path}: {exc.strerror}"
                )

    # -- teardown (always runs) -------------------------------------------------------------
    def _teardown(self) -> None:
        self.stop.set()
        self.intake.wake()
        for thread in self.threads:
            thread.join(timeout=10)
        # The sensor's buffers are freed by its close: never while its thread may still be in
        # them (a loaded host can slow the final drain past 10 s; a freed ring would crash it).
        sensor_busy = any(t.is_alive() for t in self.threads if isinstance(t, SensorThread))
        if sensor_busy:
            for thread in self.threads:
                thread.join(timeout=30)
            sensor_busy = any(t.is_alive() for t in self.threads if isinstance(t, SensorThread))
        if self.correlator is not None:
            try:
                self._final_feed()
                self._score(time.time())
                self._write_lifecycle(time.time(), final=True)  # pending updates, last closes
            except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
                self.stderr(f"gpuguard: final scoring failed: {type(exc).__name__}: {exc}")
        if self.responder is not None:
            try:
                self.responder.close()  # waits for pending kills; pinned blocks stay (gpuguard blocks)
            except Exception as exc:  # noqa: BLE001 - the summary and cleanup still run
                self.stderr(f"gpuguard: closing the responder failed: {type(exc).__name__}: {exc}")
            self.responder = None
        c = self.counters
        summary = (
            f"agent stopped after {time.time() - c.started:.0f} s: {c.events_total()} events, "
            f"{sum(c.findings.values())} findings, {sum(c.actions.values())} actions, "
            f"drops: ring {sum(c.ring_lost.values())}, intake {sum(c.intake_dropped.values())}, "
            f"log {c.output_dropped}"
        )
        self.lifecycle(
            "stop",
            summary,
            events=c.events_total(),
            findings=sum(c.findings.values()),
            ring_lost=dict(c.ring_lost),
            intake_dropped=dict(c.intake_dropped),
        )
        scanner = self.engine.yara_scanner if self.engine is not None else None
        if scanner is not None:
            try:
                scanner.save()
            except OSError as exc:
                self.stderr(f"gpuguard: cannot save the YARA verdict cache: {exc.strerror}")
        if self.sensor is not None and sensor_busy:
            self.stderr("gpuguard: the sensor thread did not stop; the probes go with the process")
            self.sensor = None
        if self.sensor is not None:
            try:
                self.sensor.close()  # detaches every probe
            except Exception as exc:  # noqa: BLE001
                self.stderr(f"gpuguard: detaching the probes failed: {type(exc).__name__}: {exc}")
            self.sensor = None
        self.telemetry.close_log()  # writes out what is queued (the stop line included)
        if self.ready.is_set():
            self._write_status(time.time(), running=False)
        self.telemetry.close_metrics()
        if self.ready.is_set():  # a failed start-up says only its one error line
            self.stderr(f"gpuguard: {summary}")


def _status_content(document: dict[str, Any]) -> dict[str, Any]:
    """The state file less what moves with the clock alone (its time, rates, sample and
    scoring-pass counts): equal means nothing worth rewriting the file for happened."""
    content = {k: v for k, v in document.items() if k not in _STATUS_CLOCKS}
    counters = content.get("counters")
    if isinstance(counters, dict):
        content["counters"] = {k: v for k, v in counters.items() if k not in _STATUS_CLOCKS}
    return content


def _probes_attached(sensor: Any) -> int:
    bpf = getattr(sensor, "_bpf", None)
    if bpf is None:
        return 0
    return len(getattr(bpf, "tracepoint_fds", {})) + len(getattr(bpf, "raw_tracepoint_fds", {}))
