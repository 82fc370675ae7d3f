"""The agent's flow, one stage per module or folder, in flow order, and the record that holds them.

produce (:mod:`.s1_produce`: sensor, samplers, /proc sweeps) -> enrich (:mod:`.s2_enrich`:
process facts, config files, YARA) -> correlate (:mod:`.s3_correlate`) -> score
(:mod:`.s4_score`: the detection engine's verdicts, kept by the correlator) -> report
(:mod:`.s5_report`: process, guard and GPU host findings; returns the alerts) -> act
(:mod:`.s6_act`: the responder and its outcomes) -> emit (:mod:`.s7_emit`: log, state file).
A stage with helpers is a folder holding them.  Stages are built once, with their
collaborators (:mod:`gpuguard.agent.wiring`); feedback against the flow goes through explicit
queues (:mod:`gpuguard.agent.feedback`).

May import: every layer below the agent and the agent's shared modules (context, feedback,
actions...); a stage never imports a later stage, nor :mod:`gpuguard.agent.pipeline`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

from gpuguard.agent.stages.s1_produce import ProduceStage
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.agent.stages.s3_correlate import CorrelateStage
from gpuguard.agent.stages.s4_score import ScoreStage
from gpuguard.agent.stages.s5_report import ReportStage
from gpuguard.agent.stages.s6_act import ActStage
from gpuguard.agent.stages.s7_emit import EmitStage


@dataclass(frozen=True, slots=True)
class Stages:
    """The seven stages, in flow order, each built once with its collaborators."""

    produce: ProduceStage
    enrich: EnrichStage
    correlate: CorrelateStage
    score: ScoreStage
    report: ReportStage
    act: ActStage
    emit: EmitStage

    def counts(self) -> Iterator[tuple[str, dict[str, int]]]:
        """``(stage name, its counts)`` of each stage that counts its work, in flow order."""
        for field in fields(self):
            counts = getattr(getattr(self, field.name), "counts", None)
            if counts is not None:
                yield field.name, counts
