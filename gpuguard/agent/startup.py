"""The agent's start-up steps, each a function of the agent, run in the order pipeline.py lists.

signals, capabilities (enforce mode's), rules, log, metrics, sensor (or reduced mode),
correlator and detection engine, findings the last run left open, seed sweep, producers,
started (the start line, the first state file, ready).
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from gpuguard.agent.capabilities import check_enforce_capabilities
from gpuguard.agent.memory import release_compiler_pages
from gpuguard.agent.telemetry import finding_rules

if TYPE_CHECKING:
    from gpuguard.agent.pipeline import Agent


def signals(agent: Agent) -> None:
    if not agent.install_signals:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: agent.request_stop())
    signal.signal(signal.SIGINT, lambda signum, frame: agent.request_stop())
    signal.signal(signal.SIGHUP, lambda signum, frame: agent.request_reload())


def capabilities(agent: Agent) -> None:
    """Enforce mode without a capability its actions need: one line, before anything starts."""
    check_enforce_capabilities(agent.ctx.config)


def rules(agent: Agent) -> None:
    agent.reloader.load_rules()


def log(agent: Agent) -> None:
    agent.ctx.telemetry.open_log()


def metrics(agent: Agent) -> None:
    ctx = agent.ctx
    ctx.telemetry.serve_metrics(finding_rules(ctx.rules.current, ctx.config))


def sensor(agent: Agent) -> None:
    agent.produce.start_sensor(agent.ctx.rules.current)


def correlator(agent: Agent) -> None:
    """Correlator (facts and YARA from the enrich stage), engine, responder, and their wiring."""
    ctx, produce, enrich, score = agent.ctx, agent.produce, agent.enrich, agent.score
    generations = produce.exit_generations
    correlator = agent.correlate.build(enrich, generations)
    score.build(correlator, ctx.rules.current)
    enrich.use_ruleset(ctx.rules.current)
    correlator.on_new_facts = enrich.on_new_facts  # the enrich stage's YARA and exe hashes
    score.request = produce.request if produce.sensor is not None else None
    agent.report.correlator = agent.housekeeping.correlator = correlator
    agent.report.act = agent.act.act
    ctx.rules.on_change = agent.reloader.use_ruleset
    agent.act.build(generations)


def findings(agent: Agent) -> None:
    """The findings the last run left open, before the first scoring: continued, not new."""
    agent.report.resume()


def seed(agent: Agent) -> None:
    """One /proc sweep before the loop: a miner that started before the agent is scored at once."""
    agent.feed(agent.produce.seed(agent.correlate.known))
    agent.score_and_report(time.time())


def producers(agent: Agent) -> None:
    agent.produce.start_threads(agent.correlate.known)


def started(agent: Agent) -> None:
    ctx = agent.ctx
    ruleset, config, counters = ctx.rules.current, ctx.config, ctx.counters
    ctx.telemetry.started(config.mode)
    ctx.lifecycle(
        "start",
        f"agent started: mode {config.mode}{' (dry run)' if config.dry_run else ''}, "
        f"sensor {counters.sensor_mode}, {len(ruleset.rules)} rules "
        f"(version {counters.rules_version}), {len(agent.correlate.correlator)} processes seeded",
        mode=config.mode,
        sensor=counters.sensor_mode,
        pid=os.getpid(),
        run_id=counters.run_id,
        rules=[str(p) for p in ruleset.sources],
        blind_spots=counters.blind_spots,
        config=config.source or None,
    )
    release_compiler_pages()  # the probes are compiled: LLVM's ~80 MB of code can go
    agent.emit_stage.status.write(time.time())
    agent.ready.set()
    ctx.telemetry.watch(agent.ready, agent.produce.threads)  # /readyz, /healthz


STEPS = (
    signals,
    capabilities,
    rules,
    log,
    metrics,
    sensor,
    correlator,
    findings,
    seed,
    producers,
    started,
)
