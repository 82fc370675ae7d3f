"""Rule files, stages 2 and 3: collect the layers in order, then compile and validate them.

* **collect** (:class:`Collector`): later files define new lists/rules, extend
  or replace lists (``{extend: [...]}``, ``{remove: [...]}``, a plain list
  replaces), change rules by id (``{id: X, override: {...}}``), append
  allowlist entries and override thresholds/actions.  Every problem in a rule
  is reported, not only the first.
* **compile** (:func:`compile_collected`): every enabled rule's condition into
  closures, the lists they use, and the YARA files.

Problems quote at most a short excerpt of a value (``yaml_marks.shown``).
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.config.filecheck import refusal_reason
from gpuguard.config.yaml_marks import MarkedDocument, Position, shown
from gpuguard.detect.ruleset.allowlist import ENTRY_FIELDS, AllowEntry, Allowlist
from gpuguard.detect.ruleset.conditions import CompileContext, ListDef, compile_condition
from gpuguard.detect.ruleset.content import check_content, content_of, maturity_of
from gpuguard.detect.ruleset.model import (
    ACTIONS,
    FORMAT_VERSION,
    OVERRIDABLE,
    RULE_KEYS,
    RULES_FILE_SCHEMA,
    SEVERITIES,
    THRESHOLD_RANGE,
    TOP_KEYS,
    VERDICT_ACTIONS,
    VERDICTS,
    Problem,
    Rule,
    RuleSet,
    Thresholds,
    at_least,
    categories_of_tags,
)
from gpuguard.detect.signals.rescore import rule_cache

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_RULE_ID = re.compile(r"^[a-z0-9][a-z0-9._\-]{0,79}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
THRESHOLD_NAMES = RULES_FILE_SCHEMA.get("thresholds").names  # type: ignore[union-attr]
NOT_RULES_EXCERPT = (
    16  # of a file that is not a rules file (it may be /etc/shadow): a few characters only
)


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
    actions: dict[str, str] = field(default_factory=lambda: dict(VERDICT_ACTIONS))
    yara: list[Path] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unused_conditions: list[tuple[str, _Field]] = field(
        default_factory=list
    )  # of rules with other problems: checked only


class Collector:
    def __init__(self) -> None:
        self.out = _Collected()

    def bad(
        self, position: Position, cause: str, rule_id: str | None = None, fix: str | None = None
    ) -> None:
        self.out.problems.append(Problem.at(position, cause, rule_id, fix))

    def add(self, doc: MarkedDocument) -> None:
        for position, message in doc.problems:
            self.bad(position, message)
        data = doc.data
        if data is None and not doc.problems:
            self.bad(doc.at(()), "empty rules file (expected at least `version: 1`)")
            return
        if not isinstance(data, dict):
            if data is not None:
                self.bad(
                    doc.at(()),
                    "a rules file must be a map with version, lists, rules, allowlist...",
                )
            return
        if data and not any(key in TOP_KEYS for key in data):
            # Not a rules file at all (a wrong path, or a symlink to some other file): one
            # problem with a short excerpt, never its lines quoted back one by one.
            self.bad(
                doc.at(()),
                f"not a gpuguard rules file: none of its top-level keys is a rules key "
                f"(it starts with {shown(next(iter(data)), NOT_RULES_EXCERPT)})",
                fix="point at a rules file (it starts with `version: 1`)",
            )
            return
        for key in data:
            if key not in TOP_KEYS:
                self.bad(
                    doc.key_at((key,)),
                    f"unknown top-level key {shown(key)} (expected {', '.join(TOP_KEYS)})",
                )
        if "description" in data and not isinstance(data["description"], str):
            self.bad(doc.at(("description",)), "description must be text")
        version = data.get("version")
        if isinstance(version, str) and version.strip() == str(FORMAT_VERSION):
            self.bad(
                doc.at(("version",)),
                f"version must be the number {FORMAT_VERSION}, not the text {shown(version)}",
                fix=f"write `version: {FORMAT_VERSION}` without quotes",
            )
            return
        if version != FORMAT_VERSION or isinstance(version, bool):
            where = doc.at(("version",)) if "version" in data else doc.at(())
            self.bad(
                where,
                f"version must be {FORMAT_VERSION} (found {shown(version)}); this gpuguard reads "
                f"format {FORMAT_VERSION}",
            )
            return
        self._lists(doc, data.get("lists", {}))
        self._rules(doc, data.get("rules", []))
        self._allowlist(doc, data.get("allowlist", []))
        self._thresholds(doc, data.get("thresholds", {}))
        self._actions(doc, data.get("actions", {}))
        self._yara(doc, data.get("yara", []))

    def _entries(
        self, doc: MarkedDocument, path: tuple, values: Any, name: str
    ) -> list[tuple[Any, Position]] | None:
        if not isinstance(values, list):
            self.bad(doc.at(path), f"list {shown(name)}: expected a list of values")
            return None
        out = []
        for i, value in enumerate(values):
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                self.bad(
                    doc.at(path + (i,)),
                    f"list {shown(name)}: entries must be text or numbers, got {shown(value)}",
                )
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
                self.bad(
                    doc.key_at(path), f"list name {shown(name)} must be lower_case_with_underscores"
                )
                continue
            if isinstance(body, dict):
                ops = sorted(body)
                if len(ops) != 1 or ops[0] not in ("extend", "remove", "replace"):
                    self.bad(
                        doc.at(path),
                        f"list {shown(name)}: a map must have exactly one of extend, remove, replace",
                    )
                    continue
                op = ops[0]
                entries = self._entries(doc, path + (op,), body[op], name)
                if entries is None:
                    continue
                existing = self.out.lists.get(name)
                if op in ("extend", "remove") and existing is None:
                    self.bad(
                        doc.key_at(path + (op,)),
                        f"list {shown(name)}: cannot {op} a list no earlier file defines "
                        "(validate it together with the file that defines it, e.g. --with-defaults)",
                    )
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
                self.bad(
                    doc.at(path),
                    "a rule must be a map with id, description, severity, weight, condition",
                )
                continue
            rule_id = rule.get("id")
            if not isinstance(rule_id, str) or not _RULE_ID.match(rule_id):
                self.bad(
                    doc.at(path + ("id",)) if "id" in rule else doc.at(path),
                    f"rule id {shown(rule_id)} must be lower-case letters, digits, '-', '_' or '.'",
                )
                # The rest of the rule is still checked (and never used): every problem at once.
                label = f"#{i + 1}"
                self._unknown_keys(doc, path, rule, label)
                fields = {k: _Field(v, doc, path + (k,)) for k, v in rule.items() if k in RULE_KEYS}
                self._check_fields(fields, label)
                if "condition" in fields:
                    self.out.unused_conditions.append((label, fields["condition"]))
                continue
            if "override" in rule:
                self._override(doc, path, rule, rule_id)
                continue
            self._unknown_keys(doc, path, rule, rule_id)
            fields = {k: _Field(v, doc, path + (k,)) for k, v in rule.items() if k in RULE_KEYS}
            ok = True
            if rule_id in self.out.rules:
                first = self.out.rules[rule_id]["id"]
                self.bad(
                    doc.at(path + ("id",)),
                    f"duplicate rule id (first defined at {first.doc.at(first.path)}); "
                    "change an existing rule with `- id: ...` and `override: {...}`",
                    rule_id,
                )
                ok = False
            missing = [
                k for k in ("description", "severity", "weight", "condition") if k not in rule
            ]
            if missing:
                self.bad(doc.at(path), f"missing {', '.join(missing)}", rule_id)
                ok = False
            # Every field is checked, and the condition compiled, even when something else is
            # wrong: `rules validate` lists every problem in the rule at once.
            ok = self._check_fields(fields, rule_id) and ok
            if ok:
                self.out.rules[rule_id] = fields
            elif "condition" in fields:
                self.out.unused_conditions.append((rule_id, fields["condition"]))

    def _unknown_keys(self, doc: MarkedDocument, path: tuple, rule: dict, label: str) -> None:
        for key in rule:
            if key not in RULE_KEYS:
                self.bad(
                    doc.key_at(path + (key,)),
                    f"unknown rule key {shown(key)} (expected {', '.join(RULE_KEYS)}, or override)",
                    label,
                )

    def _override(self, doc: MarkedDocument, path: tuple, rule: dict, rule_id: str) -> None:
        extra = [k for k in rule if k not in ("id", "override")]
        for key in extra:
            self.bad(
                doc.key_at(path + (key,)),
                f"a rule with override: has only id and override (found {shown(key)})",
                rule_id,
            )
        body = rule["override"]
        if not isinstance(body, dict) or not body:
            self.bad(
                doc.at(path + ("override",)),
                f"override: expected a map of fields to change ({', '.join(OVERRIDABLE)})",
                rule_id,
            )
            return
        if rule_id not in self.out.rules:
            self.bad(
                doc.at(path + ("id",)),
                "override of a rule no earlier file defines "
                "(validate it together with the file that defines it, e.g. --with-defaults)",
                rule_id,
            )
            return
        fields = {}
        for key, value in body.items():
            if key not in OVERRIDABLE:
                self.bad(
                    doc.key_at(path + ("override", key)),
                    f"cannot override {shown(key)} (can: {', '.join(OVERRIDABLE)})",
                    rule_id,
                )
                continue
            fields[key] = _Field(value, doc, path + ("override", key))
        if self._check_fields(fields, rule_id) and not extra:
            self.out.rules[rule_id].update(fields)
        elif "condition" in fields:
            self.out.unused_conditions.append((rule_id, fields["condition"]))

    def _check_fields(self, fields: dict[str, _Field], rule_id: str) -> bool:
        ok = True

        def bad(f: _Field, message: str) -> None:
            nonlocal ok
            ok = False
            self.bad(f.doc.at(f.path), message, rule_id)

        if "description" in fields and (
            not isinstance(fields["description"].value, str)
            or not fields["description"].value.strip()
        ):
            bad(fields["description"], "description must be non-empty text")
        if "severity" in fields and fields["severity"].value not in SEVERITIES:
            bad(
                fields["severity"],
                f"severity {shown(fields['severity'].value)} must be one of {', '.join(SEVERITIES)}",
            )
        if "weight" in fields:
            w = fields["weight"].value
            if not isinstance(w, int) or isinstance(w, bool) or not -100 <= w <= 100:
                bad(fields["weight"], f"weight {shown(w)} must be a whole number from -100 to 100")
        if "enabled" in fields and not isinstance(fields["enabled"].value, bool):
            bad(fields["enabled"], "enabled must be true or false")
        if "tags" in fields:
            tags = fields["tags"].value
            if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
                bad(fields["tags"], "tags must be a list of text")
        check_content(fields, bad)
        return ok

    def _allowlist(self, doc: MarkedDocument, entries: Any) -> None:
        if not isinstance(entries, list):
            self.bad(doc.at(("allowlist",)), "allowlist: expected a list of entries")
            return
        for i, entry in enumerate(entries):
            path = ("allowlist", i)
            if not isinstance(entry, dict):
                self.bad(
                    doc.at(path),
                    "an allowlist entry must be a map (exe, sha256, user, cgroup, container_id, parent_exe)",
                )
                continue
            if "override" in entry:
                self._allow_override(doc, path, entry)
                continue
            ok = True
            for key, value in entry.items():
                if key not in ENTRY_FIELDS:
                    self.bad(
                        doc.key_at(path + (key,)),
                        f"unknown allowlist key {shown(key)} (expected {', '.join(ENTRY_FIELDS)})",
                    )
                    ok = False
                elif key == "any_container" and not isinstance(value, bool):
                    self.bad(doc.at(path + (key,)), "any_container must be true or false")
                    ok = False
                elif key != "any_container" and not isinstance(value, str):
                    self.bad(doc.at(path + (key,)), f"{key} must be text")
                    ok = False
            if not ok:
                continue
            named = ("exe", "user", "cgroup", "container_id", "parent_exe", "namespace", "image")
            if not any(k in entry for k in named):
                self.bad(
                    doc.at(path),
                    f"an allowlist entry must name at least one of {', '.join(named)}",
                )
                continue
            if "sha256" in entry and ("exe" not in entry or not _SHA256.match(entry["sha256"])):
                self.bad(
                    doc.at(path + ("sha256",)),
                    "sha256 must be 64 lower-case hex digits and needs exe",
                )
                continue
            if "exe" in entry and not entry["exe"].startswith("/"):
                self.bad(doc.at(path + ("exe",)), "exe must be an absolute path (or glob)")
                continue
            ids = [e.get("id") for e, _, _ in self.out.allow]
            if entry.get("id") is not None and entry["id"] in ids:
                self.bad(doc.at(path + ("id",)), f"duplicate allowlist id {shown(entry['id'])}")
                continue
            self.out.allow.append((dict(entry), doc, path))

    def _allow_override(self, doc: MarkedDocument, path: tuple, entry: dict) -> None:
        target = next((e for e, _, _ in self.out.allow if e.get("id") == entry.get("id")), None)
        body = entry["override"]
        if target is None:
            self.bad(doc.at(path), f"allowlist override of unknown id {shown(entry.get('id'))}")
        elif (
            set(entry) != {"id", "override"}
            or not isinstance(body, dict)
            or set(body) - {"enabled"}
        ):
            self.bad(doc.at(path), "an allowlist override is `{id: X, override: {enabled: false}}`")
        elif not isinstance(body.get("enabled"), bool):
            self.bad(doc.at(path + ("override",)), "enabled must be true or false")
        else:
            target["enabled"] = body["enabled"]

    def _thresholds(self, doc: MarkedDocument, thresholds: Any) -> None:
        if not isinstance(thresholds, dict):
            self.bad(doc.at(("thresholds",)), "thresholds: expected {suspicious: N, malicious: N}")
            return
        low, high = THRESHOLD_RANGE
        for key, value in thresholds.items():
            if key not in THRESHOLD_NAMES:
                self.bad(
                    doc.key_at(("thresholds", key)),
                    f"unknown threshold {shown(key)} (expected {', '.join(THRESHOLD_NAMES)})",
                )
            elif not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                self.bad(
                    doc.at(("thresholds", key)),
                    f"threshold {key} must be a whole number from {low} to {high}",
                )
            else:
                self.out.thresholds[key] = value

    def _actions(self, doc: MarkedDocument, actions: Any) -> None:
        if not isinstance(actions, dict):
            self.bad(
                doc.at(("actions",)),
                "actions: expected {clean: ACTION, suspicious: ACTION, malicious: ACTION}",
            )
            return
        for key, value in actions.items():
            if key not in VERDICTS:
                self.bad(
                    doc.key_at(("actions", key)),
                    f"unknown verdict {shown(key)} (expected {', '.join(VERDICTS)})",
                )
            elif value not in ACTIONS:
                self.bad(
                    doc.at(("actions", key)),
                    f"unknown action {shown(value)} (expected {', '.join(ACTIONS)})",
                )
            else:
                self.out.actions[key] = value

    def _yara(self, doc: MarkedDocument, patterns: Any) -> None:
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            self.bad(
                doc.at(("yara",)),
                "yara: expected a list of file paths or globs (relative to this file)",
            )
            return
        base = Path(doc.file).parent
        for i, pattern in enumerate(patterns):
            full = pattern if pattern.startswith("/") else str(base / pattern)
            matched = sorted(Path(p) for p in _glob.glob(full))
            if not matched:
                self.bad(doc.at(("yara", i)), f"no YARA file matches {shown(pattern)}")
            for path in matched:
                if path not in self.out.yara:
                    self.out.yara.append(path)


def compile_collected(
    collected: _Collected, sources: list[Path], check_files: bool, counting: str = "experimental"
) -> tuple[RuleSet | None, list[Problem]]:
    """The rule set (None with problems); ``counting``: the lowest maturity whose enabled rules
    are evaluated (the others are kept with the disabled ones)."""
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
        ctx.leaves = []
        condition = compile_condition(cond_field.value, cond_field.path, doc.at, doc.key_at, ctx)
        signals = tuple(sorted(ctx.signals_used))
        leaves = tuple(ctx.leaves)
        ctx.signals_used |= used_before
        problems += [
            Problem.at(position, message, rule_id) for position, message in ctx.problems[before:]
        ]
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
            leaves=leaves,
            shape=ctx.shape,
            source=id_field.doc.at(id_field.path),
            outcome_cache=rule_cache(signals),
            categories=categories_of_tags(tuple(fields["tags"].value) if "tags" in fields else ()),
            maturity=maturity_of(fields),
            content=content_of(fields),
        )
        counted = rule.enabled and at_least(rule.maturity, counting)
        (rules if counted else disabled).append(rule)
    for (
        rule_id,
        cond_field,
    ) in collected.unused_conditions:  # rules with other problems: report these too
        before = len(ctx.problems)
        compile_condition(
            cond_field.value, cond_field.path, cond_field.doc.at, cond_field.doc.key_at, ctx
        )
        problems += [
            Problem.at(position, message, rule_id) for position, message in ctx.problems[before:]
        ]
        del ctx.problems[before:]
    for position, message in ctx.problems:
        problems.append(Problem.at(position, message))
    thresholds = dataclasses.replace(Thresholds(), **collected.thresholds)
    if thresholds.suspicious >= thresholds.malicious:
        where = sources[-1] if sources else Path("?")
        problems.append(
            Problem(
                str(where),
                1,
                1,
                f"thresholds: suspicious ({thresholds.suspicious}) must be below malicious ({thresholds.malicious})",
            )
        )
    entries = []
    for entry, doc, path in collected.allow:
        if entry.pop("enabled", True):
            fields = {k: v for k, v in entry.items() if k != "id"}
            entries.append(
                AllowEntry(
                    id=entry.get("id") or f"allow-{len(entries) + 1}",
                    position=doc.at(path),
                    **fields,
                )
            )
    yara_files = list(collected.yara)
    if check_files:
        readable = []
        for path in yara_files:
            # A FIFO or device would block YARA's compiler forever: say what it is instead.
            reason = refusal_reason(path, "YARA file")
            if reason:
                problems.append(Problem(str(path), 1, 1, reason[0], fix=reason[1]))
            else:
                readable.append(path)
        from gpuguard.detect.yara.scan import yara_problems

        for file, line, message in yara_problems(readable):
            problems.append(Problem(file, line, 1, message))
    if problems:
        return None, problems
    lists = {name: ld.values for name, ld in collected.lists.items()}
    return RuleSet(
        rules,
        disabled,
        lists,
        Allowlist(entries),
        thresholds,
        dict(collected.actions),
        yara_files,
        sources,
        counting,
    ), []
