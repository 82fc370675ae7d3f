"""Rules and config that change while the agent runs: rule files polled, SIGHUP reloads.

A rule file changed on disk: the holder (:class:`~gpuguard.detect.ruleset.reload.RuleSetHolder`)
reloads it or keeps the last good set.  SIGHUP reads the config and the rules again; a broken
file keeps the last good ones; settings that need a restart are named and kept.  A new rule
set reaches the enrich stage (YARA), the engine (everything is rescored) and the sensor (the
exec names it sends up in full).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gpuguard.agent.capabilities import check_enforce_capabilities
from gpuguard.agent.config import load_config, with_overrides
from gpuguard.agent.config_schema import SCHEMA
from gpuguard.agent.context import AgentContext
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.stages.s1_produce import ProduceStage
from gpuguard.agent.stages.s2_enrich import EnrichStage
from gpuguard.agent.stages.s4_score import ScoreStage
from gpuguard.agent.stages.s6_act import ActStage
from gpuguard.agent.telemetry import finding_rules
from gpuguard.config.schema import Section
from gpuguard.detect.ruleset.reload import RuleSetHolder
from gpuguard.errors import GpuguardError

RULE_FILE_CHECK_S = 2.0  # look for changed rule files this often


def _fields(section: Section) -> tuple[str, ...]:
    """The config fields a schema section fills (a section collected into one field: that one)."""
    out: list[str] = []
    for item in section.keys:
        out += _fields(item) if isinstance(item, Section) and not item.field else [item.field]
    return tuple(out)


# Read once at start (the sensor, the log writer, the metrics server and its health, the state
# file, where the pods' names are read): a reload keeps them and says they need a restart.
# Every log.*, metrics.* and kubernetes.* key, from the schema, so a new one cannot be left out.
RESTART_SETTINGS = (
    "sensor",
    *_fields(SCHEMA.get("log")),
    *_fields(SCHEMA.get("metrics")),
    "status_path",
    *_fields(SCHEMA.get("kubernetes")),  # the pod names' sources, built with the stages
)


RULES_VERSION_CHARS = 12  # the version is the digest's first characters


def rules_digest(ruleset: Any) -> str:
    """SHA-256 of the rule files' contents (hex): equal on every host with the same rules."""
    digest = hashlib.sha256()
    for path in list(ruleset.sources) + list(ruleset.yara_files):
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(str(path).encode())
    return digest.hexdigest()


def load_rules(ctx: AgentContext) -> RuleSetHolder:
    """The rules the config names (a start-up step): the first load must succeed."""
    rules = RuleSetHolder(ctx.config.rules, log=lambda line: None, maturity=ctx.config.maturity)
    note_rules(rules, ctx.counters)
    return rules


def note_rules(rules: RuleSetHolder, counters: AgentCounters) -> None:
    """The rule set's version, generation and last error, for the state file and metrics."""
    # The digest is taken when a set is loaded: the files on disk may already be newer (and broken).
    if rules.generation != counters.rules_generation:
        counters.rules_digest = rules_digest(rules.current)
        counters.rules_version = counters.rules_digest[:RULES_VERSION_CHARS]
    counters.rules_generation = rules.generation
    counters.rules_error = rules.last_error


class Reloader:
    """Applies every change of the rules or config after start-up; see the module docstring."""

    def __init__(
        self,
        ctx: AgentContext,
        rules: RuleSetHolder,
        config_path: Path | None,
        overrides: dict[str, Any],
        produce: ProduceStage,
        enrich: EnrichStage,
        score: ScoreStage,
        act: ActStage,
    ) -> None:
        self.ctx, self.rules, self.config_path, self.overrides = ctx, rules, config_path, overrides
        self.produce, self.enrich, self.score, self.act = produce, enrich, score, act

    def note_rules(self) -> None:
        note_rules(self.rules, self.ctx.counters)

    def use_ruleset(self, ruleset: Any) -> None:
        """A reloaded rule set: rescore everything; a changed YARA file list gets a new scanner."""
        self.enrich.use_ruleset(ruleset)
        self.score.engine.set_ruleset(ruleset)
        self.produce.set_exec_names(ruleset)

    def check_rule_files(self) -> None:
        """A rule file changed on disk: the holder reloads it (or keeps the last good set); say which."""
        ctx, rules = self.ctx, self.rules
        generation, error = rules.generation, rules.last_error
        rules.poll()
        if rules.generation != generation:
            self.use_ruleset(rules.current)
        self.note_rules()
        if rules.generation != generation:
            self._count(True)
            ctx.lifecycle(
                "reload",
                f"rules reloaded (rule files changed): version {ctx.counters.rules_version}",
                generation=rules.generation,
            )
        elif rules.last_error and rules.last_error != error:
            self._count(False)
            ctx.lifecycle(
                "reload-failed",
                "rules not reloaded (rule files changed); keeping the previous rules: "
                f"{rules.last_error}",
            )
            ctx.stderr(
                f"gpuguard: rules not reloaded; keeping the previous rules: {rules.last_error}"
            )

    def reload(self, reason: str) -> None:
        """SIGHUP: read the config and the rules again; a broken file keeps the last good ones."""
        ctx = self.ctx
        if self.config_path is not None or ctx.config.source:
            self._reload_config(reason)
        rules = self.rules
        if rules.reload(reason):
            self.use_ruleset(rules.current)
            self.note_rules()
            self._count(True)
            ctx.lifecycle(
                "reload",
                f"rules reloaded ({reason}): {len(rules.current.rules)} rules, "
                f"version {ctx.counters.rules_version}",
                generation=rules.generation,
            )
        else:
            self.note_rules()
            self._count(False)
            ctx.lifecycle(
                "reload-failed",
                f"rules not reloaded ({reason}); keeping the previous rules "
                f"(version {ctx.counters.rules_version}): {rules.last_error}",
            )
            ctx.stderr(
                f"gpuguard: rules not reloaded; keeping the previous rules: {rules.last_error}"
            )
        ctx.status_soon = True

    def _reload_config(self, reason: str) -> None:
        ctx = self.ctx
        try:
            config = with_overrides(
                load_config(self.config_path or Path(ctx.config.source)), **self.overrides
            )
            check_enforce_capabilities(config)  # a switch to enforce this agent cannot carry out
        except GpuguardError as exc:
            ctx.counters.config_error = exc.one_line()
            self._count(False)
            ctx.lifecycle(
                "reload-failed",
                f"config not reloaded ({reason}); keeping the previous settings: {exc.one_line()}",
            )
            ctx.stderr(
                f"gpuguard: config not reloaded; keeping the previous settings: {exc.one_line()}"
            )
            return
        ctx.counters.config_error = None
        restart = [
            name for name in RESTART_SETTINGS if getattr(config, name) != getattr(ctx.config, name)
        ]
        if restart:
            ctx.lifecycle(
                "reload", f"changed settings need a restart to apply: {', '.join(restart)}"
            )
            for name in restart:
                setattr(config, name, getattr(ctx.config, name))
        ctx.config = config
        self.rules.paths = [Path(p) for p in config.rules] if config.rules is not None else None
        self.rules.maturity = config.maturity  # the rules reloaded next count from this tier
        self.act.rebuild()

    def _count(self, ok: bool) -> None:
        self.ctx.telemetry.count_reload(ok, self.ctx.config.mode)
        # rules and guard policies a reload brought are exported at 0 (an alert sees the first)
        self.ctx.telemetry.declare_findings(finding_rules(self.rules.current, self.ctx.config))
