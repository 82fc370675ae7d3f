"""The compiled rule set: rules, lists, allowlist, thresholds, actions, YARA files — and rule problems.

What :mod:`gpuguard.detect.ruleset.load` produces and everything else in detect
reads.  :class:`Problem` is one mistake in a rule file, with its position,
its cause and (when there is one) its fix as fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gpuguard.config.schema import Key, Section
from gpuguard.config.yaml_marks import Position
from gpuguard.correlate.state import ProcessState
from gpuguard.detect.ruleset.allowlist import Allowlist
from gpuguard.detect.ruleset.condition_tree import Condition, Leaf, Shape, known_outcome
from gpuguard.detect.signals.blank import (
    BlankProbe,
    InputValues,
    inputs_of,
    values_while_blank,
)
from gpuguard.detect.signals.rescore import (
    COUNT_SIGNALS,
    GPU_SAMPLE_SIGNALS,
    RATE_SIGNALS,
    TIME_SIGNAL_PERIODS_S,
    additions_read,
    crossing_points,
)
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.errors import with_fix
from gpuguard.events.action_kinds import RULE_ACTIONS

FORMAT_VERSION = 1
_MAX_BLANK_PROFILES = 256  # sets of blank inputs whose rule groups are kept (a handful on a host)
SEVERITIES = ("info", "low", "medium", "high", "critical")
VERDICTS = ("clean", "suspicious", "malicious")  # the one list, weakest first
ALERT_VERDICTS = VERDICTS[1:]  # each has a threshold; a SIEM pages on them, the responder acts
VERDICT_RANK = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
# What a rules file's ``actions:`` may name, weakest first (guard policies rank by it).
ACTIONS = ("none", *RULE_ACTIONS)
# The rules file's ``actions:`` when no file names one: declared once (rule_collect starts here).
VERDICT_ACTIONS = {"clean": "none", "suspicious": "alert", "malicious": "alert"}
# Rule maturity, most trusted first: what earns each tier is in docs/rules.md ("Maturity").
MATURITIES = ("stable", "incubating", "experimental")
MATURITY_RANK = {tier: rank for rank, tier in enumerate(MATURITIES)}
DEFAULT_MATURITY = "stable"  # a rule that does not say: a site's own rule is meant
# What a rule carries for the people who run it (ruleset.content checks and renders them).
CONTENT_KEYS = ("false_positives", "references", "runbook")
RULE_KEYS = (
    "id",
    "description",
    "severity",
    "tags",
    "weight",
    "condition",
    "enabled",
    "maturity",
    *CONTENT_KEYS,
)
OVERRIDABLE = RULE_KEYS[1:]  # every key but the id a site file overrides by


def at_least(tier: str, floor: str) -> bool:
    """Whether a rule of maturity ``tier`` is at ``floor`` or more trusted."""
    return MATURITY_RANK[tier] <= MATURITY_RANK[floor]


@dataclass(frozen=True, slots=True)
class Problem:
    """One mistake in a rule file: where, what (``cause``), in which rule, and how to fix it."""

    file: str
    line: int
    col: int
    cause: str
    rule_id: str | None = None
    fix: str | None = None

    @classmethod
    def at(
        cls, position: Position, cause: str, rule_id: str | None = None, fix: str | None = None
    ) -> Problem:
        return cls(position.file, position.line, position.col, cause, rule_id, fix)

    @property
    def position(self) -> Position:
        return Position(self.file, self.line, self.col)

    @property
    def message(self) -> str:
        """The cause, with the fix when there is one."""
        return with_fix(self.cause, self.fix)

    def __str__(self) -> str:
        prefix = f"rule {self.rule_id}: " if self.rule_id else ""
        return f"{self.file}:{self.line}:{self.col}: {prefix}{self.message}"


# The ECS event.category values a rule's findings add to "process" and "intrusion_detection",
# by the rule's tags (a site rule tagged ``network`` is a network finding whatever its id).
CATEGORY_OF_TAG = {"network": "network", "yara": "malware"}


def categories_of_tags(tags: tuple[str, ...]) -> tuple[str, ...]:
    """The categories (CATEGORY_OF_TAG) a rule with ``tags`` puts its findings in."""
    return tuple(category for tag, category in CATEGORY_OF_TAG.items() if tag in tags)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The scores at which a process is suspicious and malicious: the one place they are declared."""

    suspicious: int = 40
    malicious: int = 75


# The rules file's keys other than the rules' conditions (gpuguard.config.schema: the reference
# and the checks of thresholds read it; rule_collect checks the rest with rule-file messages).
THRESHOLD_RANGE = (1, 100)
RULES_FILE_SCHEMA = Section(
    "",
    (
        Key("version", "whole", f"the format: {FORMAT_VERSION}", shows=str(FORMAT_VERSION)),
        Key("description", "text", "what this file is for", shows='""'),
        Key("lists", "mapping", "named lists rules test with in_list (later files extend)"),
        Key("rules", "list", "rules: id, description, severity, tags, weight, condition"),
        Key("allowlist", "list", "known-good processes, exempt from findings"),
        Section(
            "thresholds",
            tuple(
                Key(
                    name,
                    "whole",
                    f"a score at least this makes a process {name}",
                    low=THRESHOLD_RANGE[0],
                    high=THRESHOLD_RANGE[1],
                )
                for name in ALERT_VERDICTS
            ),
            "score >= threshold; suspicious below malicious",
            model=Thresholds,
            unknown="threshold",
        ),
        Section(
            "actions",
            tuple(
                Key(verdict, "choice", "the action a verdict adds", choices=ACTIONS, noun="action")
                for verdict in VERDICTS
            ),
            "per verdict: one action",
            unknown="verdict",
        ),
        Key("yara", "list", "YARA files or globs (relative to this file)"),
    ),
)
TOP_KEYS = RULES_FILE_SCHEMA.names


@dataclass(frozen=True, slots=True)
class Reference:
    """A rule's reference: an ATT&CK technique id (``attack``) or a link (``url``), and its title."""

    attack: str | None = None
    url: str | None = None
    title: str = ""

    @property
    def link(self) -> str:
        """Where it is read: the URL, or the technique's page on attack.mitre.org."""
        if self.url:
            return self.url
        return "https://attack.mitre.org/techniques/" + (self.attack or "").replace(".", "/") + "/"


@dataclass(frozen=True, slots=True)
class RuleContent:
    """What a rule tells the people who run it: benign software that shows it, references, and
    what to check on the node (``runbook``, commands included)."""

    false_positives: tuple[str, ...] = ()
    references: tuple[Reference, ...] = ()
    runbook: str = ""

    @property
    def techniques(self) -> tuple[str, ...]:
        return tuple(r.attack for r in self.references if r.attack)


@dataclass(slots=True)
class Rule:
    id: str
    description: str
    severity: str
    tags: tuple[str, ...]
    weight: int
    enabled: bool
    condition: Condition
    signals: tuple[str, ...]  # signal names the condition reads, sorted
    source: Position
    outcome_cache: str | None = None  # the memo entry its outcome is kept in (rescore.rule_cache)
    leaves: tuple[Leaf, ...] = ()  # its condition's signal tests (what the rescore policy reads)
    categories: tuple[str, ...] = ()  # its findings' categories (categories_of_tags)
    shape: Shape | None = None  # its condition's tree (judged with blank inputs: groups_for)
    maturity: str = DEFAULT_MATURITY  # MATURITIES
    content: RuleContent | None = None  # false positives, references, runbook (ruleset.content)


class RuleGroup(NamedTuple):
    """Rules whose outcome is kept in one memo entry (``cache``; None: evaluated every time),
    those of them that can match a process with some inputs blank."""

    cache: str | None
    rules: tuple[Rule, ...]
    # state -> (cache, blank inputs, the values of the others the rules read): the same outcome
    # on every state with that key (signals read only what they declare; a kept outcome has no
    # clock); None: not shared (evaluated every time, or reads the key)
    alike: Callable[[ProcessState], tuple | None] | None


def _group(cache: str | None, rules: tuple[Rule, ...], blank: set[str], blanks: tuple) -> RuleGroup:
    reads = {read for rule in rules for name in rule.signals for read in SIGNALS[name].reads}
    inputs = tuple(sorted(reads - blank))
    if cache is None or not rules or "key" in reads:
        return RuleGroup(cache, rules, None)
    if not inputs:
        return RuleGroup(cache, rules, lambda state, key=(cache, blanks): key)
    values = InputValues(inputs)

    def alike(state: ProcessState) -> tuple | None:
        found = values(state)
        return None if found is None else (cache, blanks, found)

    return RuleGroup(cache, rules, alike)


def _may_match(rule: Rule, known: dict[str, Any]) -> bool:
    """Whether ``rule`` can match while the signals in ``known`` have those values."""
    return rule.shape is None or known_outcome(rule.shape, known) is not False


@dataclass(slots=True)
class RuleSet:
    rules: list[Rule]  # enabled and counted (at the counting tier or above), in file order
    disabled: list[Rule]  # enabled: false, or below the counting tier
    lists: dict[str, list[Any]]
    allowlist: Allowlist
    thresholds: Thresholds
    actions: dict[str, str]
    yara_files: list[Path]
    sources: list[Path]
    counting: str = MATURITIES[-1]  # the lowest tier whose rules are evaluated (agent: maturity)
    _yara: Any = field(default=None, repr=False)
    _groups: Any = field(default=None, repr=False)
    _signals_used: frozenset[str] | None = field(default=None, repr=False)
    _gpu_tests: tuple[Condition, ...] | None = field(default=None, repr=False)
    _age_points: tuple[float, ...] | None | bool = field(default=False, repr=False)
    _blank_probe: BlankProbe | None = field(default=None, repr=False)
    _groups_by_blanks: dict[tuple[bool, ...], Any] = field(default_factory=dict, repr=False)

    @property
    def evaluation_groups(self) -> tuple[tuple[str | None, tuple[Rule, ...]], ...]:
        """The enabled rules grouped by where their outcome is kept (``Rule.outcome_cache``), None first."""
        if self._groups is None:
            names = sorted(
                {rule.outcome_cache for rule in self.rules},
                key=lambda name: (name is not None, name or ""),
            )
            self._groups = tuple(
                (name, tuple(r for r in self.rules if r.outcome_cache == name)) for name in names
            )
        return self._groups

    def groups_for(self, state: ProcessState) -> tuple[RuleGroup, ...]:
        """:attr:`evaluation_groups` less the rules that cannot match ``state``: those whose
        condition is false with the values its signals have while their inputs are blank, for
        the inputs blank on ``state`` now (detect.signals.blank).  The other rules, evaluated,
        give the same evidence as all of them."""
        probe = self._blank_probe
        if probe is None:
            probe = self._blank_probe = BlankProbe(inputs_of(self.signals_used))
        blanks = probe(state)
        groups = self._groups_by_blanks.get(blanks)
        if groups is None:
            if len(self._groups_by_blanks) >= _MAX_BLANK_PROFILES:
                self._groups_by_blanks.clear()
            blank = {name for name, is_blank in zip(probe.inputs, blanks, strict=True) if is_blank}
            known = values_while_blank(self.signals_used, blank)
            groups = self._groups_by_blanks[blanks] = tuple(
                _group(cache, tuple(r for r in rules if _may_match(r, known)), blank, blanks)
                for cache, rules in self.evaluation_groups
            )
        return groups

    @property
    def signals_used(self) -> frozenset[str]:
        """Signals the enabled rules read (the correlator skips rescoring for changes to others)."""
        if self._signals_used is None:
            self._signals_used = frozenset(name for rule in self.rules for name in rule.signals)
        return self._signals_used

    @property
    def rescore_on(self) -> int:
        """The additions to a process state (correlate.state.NEW_* bits) some enabled rule reads."""
        return additions_read(self.signals_used)

    @property
    def reads_counts(self) -> bool:
        """Some rule reads a repeated count (connect_count, ioctl_total, an ioctl rate)."""
        return bool(self.signals_used & COUNT_SIGNALS)

    @property
    def time_rescore_period_s(self) -> float | None:
        """How often every process must be re-evaluated because a rule reads the clock (None: never).

        ``age_s`` counts only when some rule tests it with something other than a comparison
        with a number: otherwise the engine rescores each process as its age crosses one of
        those numbers (:attr:`age_crossings`), not everyone once a minute.
        """
        used = self.signals_used
        periods = [
            period
            for name, period in TIME_SIGNAL_PERIODS_S.items()
            if name in used and not (name == "age_s" and self.age_crossings is not None)
        ]
        return min(periods) if periods else None

    @property
    def age_crossings(self) -> tuple[tuple[float, bool], ...] | None:
        """The ages (s) at which some enabled rule's test of ``age_s`` can change its answer
        (``rescore.crossing_points``): () when no rule reads it, None when a test is not a
        comparison with a number."""
        if self._age_points is False:
            self._age_points = crossing_points(
                [leaf for rule in self.rules for leaf in rule.leaves], "age_s"
            )
        return self._age_points  # type: ignore[return-value]

    @property
    def gpu_sample_tests(self) -> tuple[Condition, ...]:
        """Every enabled rule's tests of a signal a GPU sample can change (rescore.GPU_SAMPLE_SIGNALS).

        Rule outcomes are and/or/not of their tests, so while none of these tests changes
        its answer, a GPU sample cannot change a verdict (the engine's GPU check).
        """
        if self._gpu_tests is None:
            unique = {
                (leaf.signal, leaf.op, repr(leaf.operand)): leaf.test
                for rule in self.rules
                for leaf in rule.leaves
                if leaf.signal in GPU_SAMPLE_SIGNALS
            }
            self._gpu_tests = tuple(unique.values())
        return self._gpu_tests

    @property
    def reads_rates(self) -> bool:
        """Some rule reads an ioctl rate (the correlator keeps rate windows only then)."""
        return bool(self.signals_used & RATE_SIGNALS)

    def counted(self, rule: Rule) -> bool:
        """Whether ``rule`` (enabled) is at the counting tier or above."""
        return at_least(rule.maturity, self.counting)

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules + self.disabled if r.id == rule_id), None)

    def yara_scanner(self):
        """The compiled YARA scanner for this rule set (None when it has no YARA files)."""
        if self._yara is None and self.yara_files:
            from gpuguard.detect.yara.scan import YaraScanner  # yara-python loads only when used

            self._yara = YaraScanner.from_files(self.yara_files)
        return self._yara
