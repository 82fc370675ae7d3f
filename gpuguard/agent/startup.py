"""The agent's start-up: small steps, each a function of the agent (:class:`.host.AgentHost`).

signals, log (first, so a refused start is logged), capabilities (enforce mode's), rules,
metrics, sensor (or reduced mode), stages (built once, with what the steps before opened),
findings the last run left open, seed sweep, producers, started (the start record, stamped
with the agent's start time and written before what start-up logged, the first state file,
ready).  The pipeline runs them in order; the teardown always runs after them, however far
they got, and logs a refused start as ``start-failed``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from gpuguard.agent.capabilities import check_enforce_capabilities
from gpuguard.agent.host import StartRefused
from gpuguard.agent.memory import release_compiler_pages
from gpuguard.agent.reload import load_rules
from gpuguard.agent.stages.s1_produce.opening import start_sensor
from gpuguard.agent.telemetry import finding_rules
from gpuguard.agent.wiring import Wired, wire
from gpuguard.events.agent_events import AgentLifecycle

if TYPE_CHECKING:
    from gpuguard.agent.host import AgentHost
    from gpuguard.detect.ruleset.reload import RuleSetHolder


def signals(agent: AgentHost) -> None:
    if not agent.install_signals:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: agent.request_stop())
    signal.signal(signal.SIGINT, lambda signum, frame: agent.request_stop())
    signal.signal(signal.SIGHUP, lambda signum, frame: agent.request_reload())


def capabilities(agent: AgentHost) -> None:
    """Enforce mode without a capability its actions need: one line, before anything starts."""
    check_enforce_capabilities(agent.ctx.config)


def rules(agent: AgentHost) -> None:
    agent.opened.rules = load_rules(agent.ctx)


def log(agent: AgentHost) -> None:
    agent.ctx.telemetry.open_log()


def metrics(agent: AgentHost) -> None:
    ctx = agent.ctx
    ctx.telemetry.serve_metrics(finding_rules(_rules(agent).current, ctx.config))


def sensor(agent: AgentHost) -> None:
    agent.opened.sensor = start_sensor(agent.ctx, _rules(agent).current)


def stages(agent: AgentHost) -> None:
    """The stages, built once: correlator, engine, YARA, responder and what they feed back."""
    agent.opened.wired = wire(agent.parts, _rules(agent), agent.opened.sensor)


def findings(agent: AgentHost) -> None:
    """The findings the last run left open, before the first scoring: continued, not new."""
    _wired(agent).stages.report.resume()


def seed(agent: AgentHost) -> None:
    """One /proc sweep before the loop: a miner that started before the agent is scored at once."""
    s = _wired(agent).stages
    agent.feed(s.produce.seed(s.correlate.known))
    agent.score_and_report(time.time())


def producers(agent: AgentHost) -> None:
    s = _wired(agent).stages
    s.produce.start_threads(s.correlate.known)


def start_record(agent: AgentHost, interrupted: bool = False) -> AgentLifecycle:
    """The run's first record, stamped with the agent's start time (also first on a timeline
    sorted by time); ``interrupted``: a stop came during start-up, and what start-up had not
    learnt yet is left out."""
    ctx, opened = agent.ctx, agent.opened
    config, counters = ctx.config, ctx.counters
    ruleset = opened.rules.current if opened.rules is not None else None
    said = [f"mode {config.mode}{' (dry run)' if config.dry_run else ''}"]
    if counters.sensor_mode:
        headers = f" (kernel headers: {counters.headers_why})" if counters.headers else ""
        said.append(f"sensor {counters.sensor_mode}{headers}")
    if ruleset is not None:
        said.append(f"{len(ruleset.rules)} rules (version {counters.rules_version})")
    if opened.wired is not None and not interrupted:
        said.append(f"{len(opened.wired.stages.correlate.correlator)} processes seeded")
    lead = "agent started, and stopped during start-up" if interrupted else "agent started"
    return AgentLifecycle(
        time=counters.started,
        action="start",
        message=f"{lead}: {', '.join(said)}",
        detail=dict(
            mode=config.mode,
            sensor=counters.sensor_mode or None,
            headers=counters.headers or None,
            pid=os.getpid(),
            run_id=counters.run_id,
            rules=[str(p) for p in ruleset.sources] if ruleset is not None else None,
            blind_spots=counters.blind_spots,
            config=config.source or None,
            interrupted=interrupted or None,
        ),
    )


def started(agent: AgentHost) -> None:
    ctx, s = agent.ctx, _wired(agent).stages
    ctx.telemetry.started(ctx.config.mode)
    ctx.telemetry.release(start_record(agent))  # then what start-up logged before it
    release_compiler_pages()  # the probes are compiled: LLVM's ~80 MB of code can go
    s.emit.status.write(time.time())
    agent.ready.set()
    ctx.telemetry.watch(agent.ready, s.produce.threads)  # /readyz, /healthz


STEPS = (
    signals,
    log,
    capabilities,
    rules,
    metrics,
    sensor,
    stages,
    findings,
    seed,
    producers,
    started,
)


def run(agent: AgentHost) -> None:
    """The steps in order, until a stop is asked for; a step that raises is noted on the agent
    (``refused``: the teardown logs it as ``start-failed``) and the error goes on."""
    for step in STEPS:
        if agent.ctx.stop.is_set():
            return
        try:
            step(agent)
        except Exception as exc:
            agent.refused = StartRefused(step.__name__, exc)
            raise


def _rules(agent: AgentHost) -> RuleSetHolder:
    rules = agent.opened.rules
    if rules is None:
        raise RuntimeError("start-up steps out of order: the rules step comes first")
    return rules


def _wired(agent: AgentHost) -> Wired:
    wired = agent.opened.wired
    if wired is None:
        raise RuntimeError("start-up steps out of order: the stages step comes first")
    return wired
