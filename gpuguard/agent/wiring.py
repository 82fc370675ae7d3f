"""The agent's wiring: what it is built from, what start-up opens, and the stages built once.

:class:`AgentParts` is what the agent has before start-up; the start-up steps open the rules
and the sensor (:class:`Opened`), then :func:`wire` builds the seven stages, in flow order,
each with its collaborators, and the upkeep that works on them (:class:`Wired`).  Nothing in
a stage is filled in later: a reload replaces what it changes (rule set, responder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.agent.context import AgentContext
from gpuguard.agent.housekeeping import Housekeeping
from gpuguard.agent.reload import Reloader
from gpuguard.agent.stages import Stages
from gpuguard.agent.stages.s1_produce import ProduceStage
from gpuguard.agent.stages.s1_produce.opening import gpu_openers
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.agent.stages.s3_correlate import CorrelateStage, live_correlator
from gpuguard.agent.stages.s4_score import ScoreStage
from gpuguard.agent.stages.s5_report import ReportStage, report_parts
from gpuguard.agent.stages.s5_report.findings import ProcessFindings
from gpuguard.agent.stages.s5_report.host_findings import GpuHostFindings
from gpuguard.agent.stages.s6_act import ActStage
from gpuguard.agent.stages.s7_emit import EmitStage
from gpuguard.detect.ruleset.reload import RuleSetHolder
from gpuguard.detect.scoring.engine import DetectionEngine

if TYPE_CHECKING:
    from gpuguard.sources.ebpf.sensor import Sensor


@dataclass(frozen=True, slots=True)
class AgentParts:
    """What the agent is made with before start-up: the shared context, the findings it keeps
    (they read nothing until used), its GPU source openers and where its config came from."""

    ctx: AgentContext
    findings: ProcessFindings
    host_findings: GpuHostFindings
    sampler_openers: dict[str, Callable[[], Any]]  # one per GPU source
    config_path: Path | None
    overrides: dict[str, Any]  # command-line settings, kept over a reloaded config


def agent_parts(
    ctx: AgentContext,
    sampler_openers: dict[str, Callable[[], Any]] | None,
    config_path: Path | None,
    overrides: dict[str, Any],
) -> AgentParts:
    """The agent's parts; ``sampler_openers`` None: the config's GPU sources."""
    findings, host_findings = report_parts(ctx)
    if sampler_openers is None:
        sampler_openers = gpu_openers(ctx.config.gpu_sources, ctx.proc_root)
    return AgentParts(ctx, findings, host_findings, sampler_openers, config_path, overrides)


@dataclass(frozen=True, slots=True)
class Wired:
    """The stages, and the upkeep that works on them, built once with their collaborators."""

    stages: Stages
    housekeeping: Housekeeping
    reloader: Reloader


@dataclass(eq=False)
class Opened:
    """What start-up opened so far, filled by its steps in order; teardown closes what is here.

    ``sensor`` stays None in reduced mode; ``wired`` is set once the stages are built."""

    rules: RuleSetHolder | None = None
    sensor: Sensor | None = None
    wired: Wired | None = None


def wire(parts: AgentParts, rules: RuleSetHolder, sensor: Sensor | None) -> Wired:
    """Build the stages in flow order, each with what it works with; register their counts."""
    ctx, ruleset = parts.ctx, rules.current
    generations = sensor.exit_generations if sensor is not None else None
    produce = ProduceStage(ctx, sensor, parts.sampler_openers)
    enrich = EnrichStage(ctx, ruleset)
    correlator = live_correlator(ctx, enrich, generations)
    host_findings = parts.host_findings
    correlate = CorrelateStage(ctx, correlator, host_findings.observe, host_findings.INPUTS)
    request = produce.request if sensor is not None else None
    score = ScoreStage(ctx, correlator, DetectionEngine(correlator, ruleset), request)
    act = ActStage(ctx, parts.findings, generations)
    report = ReportStage(ctx, rules, correlator, parts.findings, host_findings, act.intent_json)
    stages = Stages(produce, enrich, correlate, score, report, act, EmitStage(ctx, rules))
    ctx.counters.stages = dict(stages.counts())  # the state file and the metrics show them
    return Wired(
        stages,
        Housekeeping(ctx, correlator, sensor, score, report, act),
        Reloader(ctx, rules, parts.config_path, parts.overrides, produce, enrich, score, act),
    )
