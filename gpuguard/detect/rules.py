"""Rule files: read with positions, merge layers, compile — every mistake as ``file:line:col``.

Three stages, as in ``gpuguard rules validate``:

1. **read** each file (``yaml_marks``) after refusing untrusted ones (``filecheck``);
2. **collect** the layers in order: later files define new lists/rules, extend
   or replace lists (``{extend: [...]}``, ``{remove: [...]}``, a plain list
   replaces), change rules by id (``{id: X, override: {...}}``), append
   allowlist entries and override thresholds/actions;
3. **compile** every enabled rule's condition into closures, the lists they
   use, and the YARA files.

:func:`load_ruleset` raises :class:`GpuguardError` with the first problem;
:func:`validate_rules` returns them all as :class:`Problem`.
"""

from __future__ import annotations

import glob as _glob
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpuguard.detect.allowlist import ENTRY_FIELDS, AllowEntry, Allowlist
from gpuguard.detect.conditions import CompileContext, Condition, ListDef, compile_condition
from gpuguard.detect.filecheck import untrusted_reason
from gpuguard.detect.rescore import COUNT_SIGNALS, RATE_SIGNALS, TIME_SIGNAL_PERIODS_S, additions_read, rule_cache
from gpuguard.detect.shipped import default_rule_paths
from gpuguard.detect.yaml_marks import MarkedDocument, Position, load_marked_file
from gpuguard.errors import GpuguardError

FORMAT_VERSION = 1
SEVERITIES = ("info", "low", "medium", "high", "critical")
VERDICTS = ("clean", "suspicious", "malicious")
ACTIONS = ("none", "alert", "suspend", "kill", "quarantine", "block-egress")
TOP_KEYS = ("version", "description", "lists", "rules", "allowlist", "thresholds", "actions", "yara")
RULE_KEYS = ("id", "description", "severity", "tags", "weight", "condition", "enabled")
OVERRIDABLE = ("description", "severity", "tags", "weight", "condition", "enabled")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_RULE_ID = re.compile(r"^[a-z0-9][a-z0-9._\-]{0,79}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int
    col: int
    message: str
    rule_id: str | None = None

    def __str__(self) -> str:
        prefix = f"rule {self.rule_id}: " if self.rule_id else ""
        return f"{self.file}:{self.line}:{self.col}: {prefix}{self.message}"


@dataclass(frozen=True, slots=True)
class Thresholds:
    suspicious: int = 40
    malicious: int = 75


@dataclass(slots=True)
class Rule:
    id: str
    description: str
    severity: str
    tags: tuple[str, ...]
    weight: int
    enabled: bool
    condition: Condition
    signals: tuple[str, ...]        # signal names the condition reads, sorted
    source: Position
    outcome_cache: str | None = None   # the state.derived entry its outcome is kept in (rescore.rule_cache)


@dataclass(slots=True)
class RuleSet:
    rules: list[Rule]                # enabled, in file order
    disabled: list[Rule]
    lists: dict[str, list[Any]]
    allowlist: Allowlist
    thresholds: Thresholds
    actions: dict[str, str]
    yara_files: list[Path]
    sources: list[Path]
    _yara: Any = field(default=None, repr=False)
    _groups: Any = field(default=None, repr=False)
    _signals_used: frozenset[str] | None = field(default=None, repr=False)

    @property
    def evaluation_groups(self) -> "tuple[tuple[str | None, tuple[Rule, ...]], ...]":
        """The enabled rules grouped by where their outcome is kept (``Rule.outcome_cache``), None first."""
        if self._groups is None:
            names = sorted({rule.outcome_cache for rule in self.rules}, key=lambda name: (name is not None, name or ""))
            self._groups = tuple((name, tuple(r for r in self.rules if r.outcome_cache == name)) for name in names)
        return self._groups

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
        """How often every process must be re-evaluated because a rule reads the clock (None: never)."""
        used = self.signals_used
        periods = [period for name, period in TIME_SIGNAL_PERIODS_S.items() if name in used]
        return min(periods) if periods else None

    @property
    def reads_rates(self) -> bool:
        """Some rule reads an ioctl rate (the correlator keeps rate windows only then)."""
        return bool(self.signals_used & RATE_SIGNALS)

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules + self.disabled if r.id == rule_id), None)

    def yara_scanner(self):
        """The compiled YARA scanner for this rule set (None when it has no YARA files)."""
        if self._yara is None and self.yara_files:
            from gpuguard.detect.yara_scan import YaraScanner

            self._yara = YaraScanner.from_files(self.yara_files)
        return self._yara


# -- stage 2: collect -------------------------------------------------------

@dataclass(slots=True)
class _Field:
    value: Any
    doc: MarkedDocument
    path: tuple


@dataclass(slots=True)
class _Collected:
    lists: dict[str, ListDef] = field(default_factory=dict)
    rules: dict[str, dict[str, _Field]] = field(default_factory=dict)
    allow: list[tuple[dict[str, Any], MarkedDocument, tuple]] = field(default_factory=list)
    thresholds: dict[str, int] = field(default_factory=dict)
    actions: dict[str, str] = field(default_factory=lambda: {"clean": "none", "suspicious": "alert", "malicious": "alert"})
    yara: list[Path] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


class _Collector:
    def __init__(self) -> None:
        self.out = _Collected()

    def bad(self, position: Position, message: str, rule_id: str | None = None) -> None:
        self.out.problems.append(Problem(position.file, position.line, position.col, message, rule_id))

    def add(self, doc: MarkedDocument) -> None:
        for position, message in doc.problems:
            self.bad(position, message)
        data = doc.data
        if data is None and not doc.problems:
            self.bad(doc.at(()), "empty rules file (expected at least `version: 1`)")
            return
        if not isinstance(data, dict):
            if data is not None:
                self.bad(doc.at(()), "a rules file must be a map with version, lists, rules, allowlist...")
            return
        for key in data:
            if key not in TOP_KEYS:
                self.bad(doc.key_at((key,)), f"unknown top-level key {key!r} (expected {', '.join(TOP_KEYS)})")
        version = data.get("version")
        if version != FORMAT_VERSION:
            where = doc.at(("version",)) if "version" in data else doc.at(())
            self.bad(where, f"version must be {FORMAT_VERSION} (found {version!r}); this gpuguard reads format {FORMAT_VERSION}")
            return
        self._lists(doc, data.get("lists", {}))
        self._rules(doc, data.get("rules", []))
        self._allowlist(doc, data.get("allowlist", []))
        self._thresholds(doc, data.get("thresholds", {}))
        self._actions(doc, data.get("actions", {}))
        self._yara(doc, data.get("yara", []))

    def _entries(self, doc: MarkedDocument, path: tuple, values: Any, name: str) -> list[tuple[Any, Position]] | None:
        if not isinstance(values, list):
            self.bad(doc.at(path), f"list {name!r}: expected a list of values")
            return None
        out = []
        for i, value in enumerate(values):
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                self.bad(doc.at(path + (i,)), f"list {name!r}: entries must be text or numbers, got {value!r}")
                continue
            out.append((value, doc.at(path + (i,))))
        return out

    def _lists(self, doc: MarkedDocument, lists: Any) -> None:
        if not isinstance(lists, dict):
            self.bad(doc.at(("lists",)), "lists: expected a map of name: [values]")
            return
        for name, body in lists.items():
            path = ("lists", name)
            if not isinstance(name, str) or not _NAME.match(name):
                self.bad(doc.key_at(path), f"list name {name!r} must be lower_case_with_underscores")
                continue
            if isinstance(body, dict):
                ops = sorted(body)
                if len(ops) != 1 or ops[0] not in ("extend", "remove", "replace"):
                    self.bad(doc.at(path), f"list {name!r}: a map must have exactly one of extend, remove, replace")
                    continue
                op = ops[0]
                entries = self._entries(doc, path + (op,), body[op], name)
                if entries is None:
                    continue
                existing = self.out.lists.get(name)
                if op in ("extend", "remove") and existing is None:
                    self.bad(doc.key_at(path + (op,)), f"list {name!r}: cannot {op} a list no earlier file defines "
                             "(validate it together with the file that defines it, e.g. --with-defaults)")
                    continue
                if op == "extend":
                    existing.entries += [e for e in entries if e[0] not in existing.values]
                elif op == "remove":
                    gone = {v for v, _ in entries}
                    existing.entries = [e for e in existing.entries if e[0] not in gone]
                else:
                    self.out.lists[name] = ListDef(name, doc.key_at(path), entries)
            else:
                entries = self._entries(doc, path, body, name)
                if entries is not None:
                    self.out.lists[name] = ListDef(name, doc.key_at(path), entries)

    def _rules(self, doc: MarkedDocument, rules: Any) -> None:
        if not isinstance(rules, list):
            self.bad(doc.at(("rules",)), "rules: expected a list of rules")
            return
        for i, rule in enumerate(rules):
            path = ("rules", i)
            if not isinstance(rule, dict):
                self.bad(doc.at(path), "a rule must be a map with id, description, severity, weight, condition")
                continue
            rule_id = rule.get("id")
            if not isinstance(rule_id, str) or not _RULE_ID.match(rule_id):
                self.bad(doc.at(path + ("id",)) if "id" in rule else doc.at(path),
                         f"rule id {rule_id!r} must be lower-case letters, digits, '-', '_' or '.'")
                continue
            if "override" in rule:
                self._override(doc, path, rule, rule_id)
                continue
            for key in rule:
                if key not in RULE_KEYS:
                    self.bad(doc.key_at(path + (key,)), f"unknown rule key {key!r} (expected {', '.join(RULE_KEYS)}, or override)", rule_id)
            if rule_id in self.out.rules:
                first = self.out.rules[rule_id]["id"]
                self.bad(doc.at(path + ("id",)), f"duplicate rule id (first defined at {first.doc.at(first.path)}); "
                         "change an existing rule with `- id: ...` and `override: {...}`", rule_id)
                continue
            missing = [k for k in ("description", "severity", "weight", "condition") if k not in rule]
            if missing:
                self.bad(doc.at(path), f"missing {', '.join(missing)}", rule_id)
                continue
            fields = {k: _Field(v, doc, path + (k,)) for k, v in rule.items() if k in RULE_KEYS}
            if self._check_fields(fields, rule_id):
                self.out.rules[rule_id] = fields

    def _override(self, doc: MarkedDocument, path: tuple, rule: dict, rule_id: str) -> None:
        extra = [k for k in rule if k not in ("id", "override")]
        if extra:
            self.bad(doc.key_at(path + (extra[0],)), f"a rule with override: has only id and override (found {extra[0]!r})", rule_id)
            return
        body = rule["override"]
        if not isinstance(body, dict) or not body:
            self.bad(doc.at(path + ("override",)), f"override: expected a map of fields to change ({', '.join(OVERRIDABLE)})", rule_id)
            return
        if rule_id not in self.out.rules:
            self.bad(doc.at(path + ("id",)), "override of a rule no earlier file defines "
                     "(validate it together with the file that defines it, e.g. --with-defaults)", rule_id)
            return
        fields = {}
        for key, value in body.items():
            if key not in OVERRIDABLE:
                self.bad(doc.key_at(path + ("override", key)), f"cannot override {key!r} (can: {', '.join(OVERRIDABLE)})", rule_id)
                continue
            fields[key] = _Field(value, doc, path + ("override", key))
        if self._check_fields(fields, rule_id):
            self.out.rules[rule_id].update(fields)

    def _check_fields(self, fields: dict[str, _Field], rule_id: str) -> bool:
        ok = True

        def bad(f: _Field, message: str) -> None:
            nonlocal ok
            ok = False
            self.bad(f.doc.at(f.path), message, rule_id)

        if "description" in fields and (not isinstance(fields["description"].value, str) or not fields["description"].value.strip()):
            bad(fields["description"], "description must be non-empty text")
        if "severity" in fields and fields["severity"].value not in SEVERITIES:
            bad(fields["severity"], f"severity {fields['severity'].value!r} must be one of {', '.join(SEVERITIES)}")
        if "weight" in fields:
            w = fields["weight"].value
            if not isinstance(w, int) or isinstance(w, bool) or not -100 <= w <= 100:
                bad(fields["weight"], f"weight {w!r} must be a whole number from -100 to 100")
        if "enabled" in fields and not isinstance(fields["enabled"].value, bool):
            bad(fields["enabled"], "enabled must be true or false")
        if "tags" in fields:
            tags = fields["tags"].value
            if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
                bad(fields["tags"], "tags must be a list of text")
        return ok

    def _allowlist(self, doc: MarkedDocument, entries: Any) -> None:
        if not isinstance(entries, list):
            self.bad(doc.at(("allowlist",)), "allowlist: expected a list of entries")
            return
        for i, entry in enumerate(entries):
            path = ("allowlist", i)
            if not isinstance(entry, dict):
                self.bad(doc.at(path), "an allowlist entry must be a map (exe, sha256, user, cgroup, container_id, parent_exe)")
                continue
            if "override" in entry:
                self._allow_override(doc, path, entry)
                continue
            ok = True
            for key, value in entry.items():
                if key not in ENTRY_FIELDS:
                    self.bad(doc.key_at(path + (key,)), f"unknown allowlist key {key!r} (expected {', '.join(ENTRY_FIELDS)})")
                    ok = False
                elif key == "any_container" and not isinstance(value, bool):
                    self.bad(doc.at(path + (key,)), "any_container must be true or false")
                    ok = False
                elif key != "any_container" and not isinstance(value, str):
                    self.bad(doc.at(path + (key,)), f"{key} must be text")
                    ok = False
            if not ok:
                continue
            if not any(k in entry for k in ("exe", "user", "cgroup", "container_id", "parent_exe")):
                self.bad(doc.at(path), "an allowlist entry must name at least one of exe, user, cgroup, container_id, parent_exe")
                continue
            if "sha256" in entry and ("exe" not in entry or not _SHA256.match(entry["sha256"])):
                self.bad(doc.at(path + ("sha256",)), "sha256 must be 64 lower-case hex digits and needs exe")
                continue
            if "exe" in entry and not entry["exe"].startswith("/"):
                self.bad(doc.at(path + ("exe",)), "exe must be an absolute path (or glob)")
                continue
            ids = [e.get("id") for e, _, _ in self.out.allow]
            if entry.get("id") is not None and entry["id"] in ids:
                self.bad(doc.at(path + ("id",)), f"duplicate allowlist id {entry['id']!r}")
                continue
            self.out.allow.append((dict(entry), doc, path))

    def _allow_override(self, doc: MarkedDocument, path: tuple, entry: dict) -> None:
        target = next((e for e, _, _ in self.out.allow if e.get("id") == entry.get("id")), None)
        body = entry["override"]
        if target is None:
            self.bad(doc.at(path), f"allowlist override of unknown id {entry.get('id')!r}")
        elif set(entry) != {"id", "override"} or not isinstance(body, dict) or set(body) - {"enabled"}:
            self.bad(doc.at(path), "an allowlist override is `{id: X, override: {enabled: false}}`")
        elif not isinstance(body.get("enabled"), bool):
            self.bad(doc.at(path + ("override",)), "enabled must be true or false")
        else:
            target["enabled"] = body["enabled"]

    def _thresholds(self, doc: MarkedDocument, thresholds: Any) -> None:
        if not isinstance(thresholds, dict):
            self.bad(doc.at(("thresholds",)), "thresholds: expected {suspicious: N, malicious: N}")
            return
        for key, value in thresholds.items():
            if key not in ("suspicious", "malicious"):
                self.bad(doc.key_at(("thresholds", key)), f"unknown threshold {key!r} (expected suspicious, malicious)")
            elif not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100:
                self.bad(doc.at(("thresholds", key)), f"threshold {key} must be a whole number from 1 to 100")
            else:
                self.out.thresholds[key] = value

    def _actions(self, doc: MarkedDocument, actions: Any) -> None:
        if not isinstance(actions, dict):
            self.bad(doc.at(("actions",)), "actions: expected {clean: ACTION, suspicious: ACTION, malicious: ACTION}")
            return
        for key, value in actions.items():
            if key not in VERDICTS:
                self.bad(doc.key_at(("actions", key)), f"unknown verdict {key!r} (expected {', '.join(VERDICTS)})")
            elif value not in ACTIONS:
                self.bad(doc.at(("actions", key)), f"unknown action {value!r} (expected {', '.join(ACTIONS)})")
            else:
                self.out.actions[key] = value

    def _yara(self, doc: MarkedDocument, patterns: Any) -> None:
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            self.bad(doc.at(("yara",)), "yara: expected a list of file paths or globs (relative to this file)")
            return
        base = Path(doc.file).parent
        for i, pattern in enumerate(patterns):
            full = pattern if pattern.startswith("/") else str(base / pattern)
            matched = sorted(Path(p) for p in _glob.glob(full))
            if not matched:
                self.bad(doc.at(("yara", i)), f"no YARA file matches {pattern!r}")
            for path in matched:
                if path not in self.out.yara:
                    self.out.yara.append(path)


# -- stage 3: compile -------------------------------------------------------

def _compile(collected: _Collected, sources: list[Path], check_files: bool) -> tuple[RuleSet | None, list[Problem]]:
    problems = list(collected.problems)
    ctx = CompileContext(collected.lists)
    rules: list[Rule] = []
    disabled: list[Rule] = []
    for rule_id, fields in collected.rules.items():
        cond_field = fields["condition"]
        doc = cond_field.doc
        before = len(ctx.problems)
        used_before = set(ctx.signals_used)
        ctx.signals_used = set()
        condition = compile_condition(cond_field.value, cond_field.path, doc.at, doc.key_at, ctx)
        signals = tuple(sorted(ctx.signals_used))
        ctx.signals_used |= used_before
        for position, message in ctx.problems[before:]:
            problems.append(Problem(position.file, position.line, position.col, message, rule_id))
        del ctx.problems[before:]
        if condition is None:
            continue
        id_field = fields["id"]
        rule = Rule(
            id=rule_id,
            description=fields["description"].value.strip(),
            severity=fields["severity"].value,
            tags=tuple(fields["tags"].value) if "tags" in fields else (),
            weight=fields["weight"].value,
            enabled=fields["enabled"].value if "enabled" in fields else True,
            condition=condition,
            signals=signals,
            source=id_field.doc.at(id_field.path),
            outcome_cache=rule_cache(signals),
        )
        (rules if rule.enabled else disabled).append(rule)
    for position, message in ctx.problems:
        problems.append(Problem(position.file, position.line, position.col, message))
    thresholds = Thresholds(**{**{"suspicious": 40, "malicious": 75}, **collected.thresholds})
    if thresholds.suspicious >= thresholds.malicious:
        where = sources[-1] if sources else Path("?")
        problems.append(Problem(str(where), 1, 1, f"thresholds: suspicious ({thresholds.suspicious}) must be below malicious ({thresholds.malicious})"))
    entries = []
    for entry, doc, path in collected.allow:
        if entry.pop("enabled", True):
            fields = {k: v for k, v in entry.items() if k != "id"}
            entries.append(AllowEntry(id=entry.get("id") or f"allow-{len(entries) + 1}", position=doc.at(path), **fields))
    yara_files = list(collected.yara)
    if check_files:
        for path in yara_files:
            reason = untrusted_reason(path)
            if reason:
                problems.append(Problem(str(path), 1, 1, f"{reason[0]} (fix: {reason[1]})"))
        from gpuguard.detect.yara_scan import yara_problems

        for file, line, message in yara_problems(yara_files):
            problems.append(Problem(file, line, 1, message))
    if problems:
        return None, problems
    lists = {name: ld.values for name, ld in collected.lists.items()}
    return RuleSet(rules, disabled, lists, Allowlist(entries), thresholds, dict(collected.actions), yara_files, sources), []


def _check_and_read(paths: Sequence[Path]) -> tuple[list[MarkedDocument], list[Problem]]:
    docs, problems = [], []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            problems.append(Problem(str(path), 1, 1, "rules file not found"))
            continue
        reason = untrusted_reason(path)
        if reason:
            problems.append(Problem(str(path), 1, 1, f"{reason[0]} (fix: {reason[1]})"))
            continue
        try:
            docs.append(load_marked_file(path))
        except OSError as exc:
            problems.append(Problem(str(path), 1, 1, f"cannot read: {exc.strerror}"))
    return docs, problems


def _build(paths: Sequence[Path] | None) -> tuple[RuleSet | None, list[Problem]]:
    paths = [Path(p) for p in (default_rule_paths() if paths is None else paths)]
    if not paths:
        return None, [Problem("-", 1, 1, "no rules files given")]
    docs, problems = _check_and_read(paths)
    if problems:
        return None, problems
    collector = _Collector()
    for doc in docs:
        collector.add(doc)
    ruleset, problems = _compile(collector.out, paths, check_files=True)
    order = {str(p): i for i, p in enumerate(paths)}
    problems.sort(key=lambda p: (order.get(p.file, len(order)), p.file, p.line, p.col))
    return ruleset, problems


def validate_rules(paths: Sequence[Path] | None = None) -> list[Problem]:
    """Every problem in the layered rule files (empty when they are valid)."""
    return _build(paths)[1]


def load_ruleset(paths: Sequence[Path] | None = None) -> RuleSet:
    """Load and compile rule files (``None``: shipped + /etc/gpuguard/*.yaml); raises GpuguardError."""
    ruleset, problems = _build(paths)
    if ruleset is None:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        first = problems[0]
        if first.message.startswith("refusing rules file"):
            cause, _, fix = first.message.rpartition(" (fix: ")
            raise GpuguardError(cause, fix.rstrip(")"))
        raise GpuguardError(f"invalid rules: {first}{more}",
                            "correct the rules file; `gpuguard rules validate` lists every problem")
    return ruleset
