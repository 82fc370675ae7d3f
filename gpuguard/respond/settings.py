"""The ``response:`` section of the agent config: which actions, on whom, how far.

:func:`parse_response_settings` checks the section against ``RESPONSE_SCHEMA``
(:mod:`gpuguard.config.schema`; an unknown key or bad value is a problem at
``file:line:col``) and leaves every other setting at its default, so the agent runs
with no section at all.  :data:`ResponseSettings` is made from the actions: the
response's own settings (:class:`SharedSettings`), then each action's options, whose
fields and defaults its own model declares (``Action.settings``); the actions per
verdict default to each action's ``default_on``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuguard.config.schema import Key, Section, check
from gpuguard.detect.ruleset.model import DEFAULT_MATURITY, MATURITIES, VERDICTS
from gpuguard.errors import Problems
from gpuguard.respond.actions import ACTIONS, Action

SCOPES = ("all", "containers")
DEFAULT_PIN_ROOT = "/sys/fs/bpf/gpuguard"
DEFAULT_STATE_DIR = "/run/gpuguard/blocks"


@dataclass(frozen=True, slots=True)
class HookSettings:
    """An operator program run with the finding as JSON on stdin (fixed argv, no shell)."""

    name: str
    argv: tuple[str, ...]
    on: tuple[str, ...] = ("malicious",)  # verdicts that run it
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class SharedSettings:
    """The response's own settings, beside the actions per verdict and each action's options."""

    rule_actions: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict
    )  # rule id -> extra steps
    # Rule by rule (respond.intent): the lowest tier whose rules may act, and when set, the only
    # rules (and guard.<policy> ids) that may; every other rule stays alert-only.
    act_maturity: str = DEFAULT_MATURITY
    act_rules: tuple[str, ...] = ()
    hooks: tuple[HookSettings, ...] = ()
    scope: str = "all"  # all | containers
    cgroups: tuple[str, ...] = ()  # when set, act only inside these cgroup v2 paths
    never_act_namespaces: tuple[str, ...] = ()  # Kubernetes namespaces never acted in
    only_act_namespaces: tuple[str, ...] = ()  # when set, act only in these namespaces
    protect_exes: tuple[str, ...] = ()  # executables never acted on
    max_actions_per_minute: int = 30
    pin_root: str = DEFAULT_PIN_ROOT
    state_dir: str = DEFAULT_STATE_DIR


HOOK_SCHEMA = Section(
    "hooks",
    (
        Key("name", "text", "a name for its log lines (default: argv[0]'s file name)", shows='""'),
        Key("argv", "list", "absolute path and fixed arguments; no shell is used", shows="[]"),
        Key("on", "choices", "verdicts that run it", choices=VERDICTS, noun="verdict"),
        Key("timeout_s", "number", "it is killed past this long", low=0),
    ),
    model=HookSettings,
)


def default_actions(actions: tuple[Action, ...]) -> dict[str, tuple[str, ...]]:
    """The actions each verdict gets when ``response.actions`` does not say (their default_on)."""
    return {v: tuple(a.name for a in actions if v in a.default_on) for v in VERDICTS}


def _same_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return field(default_factory=f.default_factory)
    return field(default=f.default)


@functools.cache
def settings_for(actions: tuple[Action, ...]) -> tuple[type, Section]:
    """The settings model and the ``response:`` schema for a registry of actions."""
    defaults = default_actions(actions)
    fields: list[tuple[str, Any, Any]] = [
        ("actions", "Mapping[str, tuple[str, ...]]", field(default_factory=lambda: dict(defaults)))
    ]
    for model in (SharedSettings, *(a.settings for a in actions if a.settings)):
        fields += [(f.name, f.type, _same_default(f)) for f in dataclasses.fields(model)]
    made = dataclasses.make_dataclass("ResponseSettings", fields, frozen=True, slots=True)
    made.__module__ = __name__
    made.__doc__ = "Every ``response:`` setting with its default (see the module docstring)."
    return made, _schema(actions, made)


def _schema(actions: tuple[Action, ...], model: type) -> Section:
    return Section(
        "response",
        (
            Key(
                "actions",
                "mapping",
                "per verdict (clean, suspicious, malicious): an action or a list",
            ),
            Key("rule_actions", "mapping", "rule id -> extra actions when that rule matched"),
            Key(
                "act_maturity",
                "choice",
                "the lowest rule tier enforce mode acts through: " + " | ".join(MATURITIES),
                choices=MATURITIES,
            ),
            Key(
                "act_rules",
                "texts",
                "when set, only these rules (and guard.<policy> ids) act; the rest alert only",
            ),
            *(
                Section(action.section, action.options, f"the {action.name} action")
                for action in actions
                if action.section
            ),
            Key("hooks", "list", "programs run with the finding as JSON on stdin", ref=HOOK_SCHEMA),
            Key("scope", "choice", "all | containers", choices=SCOPES),
            Key("cgroups", "texts", "when set, act only inside these cgroup v2 paths"),
            Key(
                "never_act_namespaces",
                "texts",
                "Kubernetes namespaces never acted in (nor a pod whose namespace is unknown)",
            ),
            Key(
                "only_act_namespaces",
                "texts",
                "when set, act only in these Kubernetes namespaces (named by the node)",
            ),
            Key("protect_exes", "texts", "executables never acted on"),
            Key(
                "max_actions_per_minute", "count", "actions past this rate are rate-limited", low=0
            ),
            Key("pin_root", "text", "where blocks' BPF objects are pinned"),
            Key("state_dir", "text", "where blocks are recorded"),
        ),
        model=model,
    )


ResponseSettings, RESPONSE_SCHEMA = settings_for(ACTIONS)


def options_of(action: Action, settings: Any) -> Any:
    """The action's own settings (an instance of its model) out of the response's."""
    if action.settings is None:
        return None
    return action.settings(
        **{f.name: getattr(settings, f.name) for f in dataclasses.fields(action.settings)}
    )


def parse_response_settings(
    section: Mapping | None,
    *,
    source: str,
    problems: Problems | None = None,
    actions: tuple[Action, ...] = ACTIONS,
) -> Any:
    """Validate the ``response:`` section read from ``source`` (a file name, for messages).

    With ``problems`` collecting (``gpuguard config validate``), every problem is recorded there
    and a default stands in for each bad value; otherwise the first one is raised.  The result
    is a :data:`ResponseSettings` (``actions``: another registry's settings model).
    """
    model, schema = settings_for(actions)
    if section is None:
        return model()
    p = problems or Problems(source)
    at: tuple = ("response",)
    if not isinstance(section, Mapping):
        p.add(at, "expected a mapping")
        return model()
    values = check(section, schema, at, p.add)
    steps_known = tuple(a.name for a in actions)
    per_verdict = default_actions(actions)
    given = values.get("actions", {})
    for verdict, steps in _mapping(given, at + ("actions",), VERDICTS, p).items():
        per_verdict[verdict] = _steps(steps, steps_known, at + ("actions", verdict), p)
    values["actions"] = per_verdict
    values["rule_actions"] = {
        str(rule): _steps(steps, steps_known, at + ("rule_actions", rule), p)
        for rule, steps in values.get("rule_actions", {}).items()
    }
    hooks = (_hook(h, at + ("hooks", i), p) for i, h in enumerate(values.get("hooks", [])))
    values["hooks"] = tuple(h for h in hooks if h is not None)
    return model(**values)


def _mapping(value: Any, at: tuple, keys: tuple[str, ...] | None, p: Problems) -> dict:
    if not isinstance(value, Mapping):
        p.add(at, "expected a mapping")
        return {}
    out = dict(value)
    if keys is not None:
        for key in value:
            if key not in keys:
                p.add(
                    at + (key,),
                    f"unknown key {key!r} (expected one of {', '.join(keys)})",
                    key=True,
                )
                del out[key]
    return out


def _steps(value: Any, known: tuple[str, ...], at: tuple, p: Problems) -> tuple[str, ...]:
    steps = [value] if isinstance(value, str) else value
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        p.add(at, "expected an action or a list of actions")
        return ()
    for i, step in enumerate(steps):
        if step not in (*known, "none"):
            where = at + (i,) if isinstance(value, list) else at
            p.add(where, f"unknown action {step!r} (expected one of none, {', '.join(known)})")
    return tuple(s for s in steps if s in known)


def _hook(value: Any, at: tuple, p: Problems) -> HookSettings | None:
    found = len(p.found)
    if not isinstance(value, Mapping):
        p.add(at, "expected a mapping")
        return None
    given = {k: v for k, v in value.items() if k != "argv"}  # argv: checked below
    if isinstance(given.get("on"), str):
        given["on"] = [given["on"]]  # a lone verdict is a list of one
    values = check(given, HOOK_SCHEMA, at, p.add)
    argv = value.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        p.add(at + ("argv",), "expected a non-empty list of strings (no shell is used)")
        argv = ["/"]
    elif not argv[0].startswith("/"):
        p.add(at + ("argv", 0), f"{argv[0]!r} is not an absolute path")
    values.setdefault("name", argv[0].rsplit("/", 1)[-1])
    if "on" in values:
        values["on"] = tuple(values["on"])
    settings = HookSettings(argv=tuple(argv), **values)
    return settings if len(p.found) == found else None
