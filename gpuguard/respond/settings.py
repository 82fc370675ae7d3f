"""The ``response:`` section of the agent config: which actions, on whom, how far.

:func:`parse_response_settings` checks the section against ``RESPONSE_SCHEMA``
(:mod:`gpuguard.config.schema`; an unknown key or bad value is a problem at
``file:line:col``) and leaves every other setting at its default, declared once
in :class:`ResponseSettings` (the actions per verdict: each action's ``default_on``),
so the agent runs with no section at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuguard.config.schema import Key, Section, check
from gpuguard.errors import Problems
from gpuguard.respond.actions import ACTIONS, STEPS

VERDICTS = ("clean", "suspicious", "malicious")
DEFAULT_ACTIONS = {v: tuple(a.name for a in ACTIONS if v in a.default_on) for v in VERDICTS}
SCOPES = ("all", "containers")
DEFAULT_PIN_ROOT = "/sys/fs/bpf/gpuguard"
DEFAULT_STATE_DIR = "/run/gpuguard/blocks"
SHARED_EXE_PREFIXES = (
    "/usr/",
    "/bin/",
    "/sbin/",
    "/lib/",
    "/lib64/",
    "/opt/",
    "/snap/",
    "/nix/store/",
)


@dataclass(frozen=True, slots=True)
class HookSettings:
    """An operator program run with the finding as JSON on stdin (fixed argv, no shell)."""

    name: str
    argv: tuple[str, ...]
    on: tuple[str, ...] = ("malicious",)  # verdicts that run it
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class ResponseSettings:
    actions: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    rule_actions: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict
    )  # rule id -> extra steps
    kill_grace_s: float = 2.0
    kill_target: str = "process"  # process | group | cgroup
    touch_ttl_s: float = 86400.0  # kill-on-touch entries expire (0: never)
    # Executables under these prefixes are shared (interpreters, system tools): kill-on-touch
    # blocks only the offender's pids for them, never every process running the same file.
    shared_exe_prefixes: tuple[str, ...] = SHARED_EXE_PREFIXES
    # A block that kills more than this many processes a minute outside the offender's own
    # tree suspends itself (its circuit breaker): a block that wide is hitting the innocent.
    breaker_victims_per_minute: int = 3
    quarantine_ttl_s: float = 0.0  # 0: until `gpuguard unblock`
    quarantine_parent: str = (
        ""  # cgroup v2 dir for cgroups gpuguard creates ("": <cgroup2>/gpuguard)
    )
    egress_ttl_s: float = 3600.0
    nftables: bool = True  # host-wide sets besides the cgroup program
    nftables_netns: str = ""  # manage this named network namespace's firewall instead
    never_block_host_wide: tuple[str, ...] = ()  # networks (CIDR) never put in the host-wide sets
    hooks: tuple[HookSettings, ...] = ()
    scope: str = "all"  # all | containers
    cgroups: tuple[str, ...] = ()  # when set, act only inside these cgroup v2 paths
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
RESPONSE_SCHEMA = Section(
    "response",
    (
        Key(
            "actions", "mapping", "per verdict (clean, suspicious, malicious): an action or a list"
        ),
        Key("rule_actions", "mapping", "rule id -> extra actions when that rule matched"),
        *(
            Section(action.section, action.options, f"the {action.name} action")
            for action in ACTIONS
            if action.section
        ),
        Key("hooks", "list", "programs run with the finding as JSON on stdin", ref=HOOK_SCHEMA),
        Key("scope", "choice", "all | containers", choices=SCOPES),
        Key("cgroups", "texts", "when set, act only inside these cgroup v2 paths"),
        Key("protect_exes", "texts", "executables never acted on"),
        Key("max_actions_per_minute", "count", "actions past this rate are rate-limited", low=0),
        Key("pin_root", "text", "where blocks' BPF objects are pinned"),
        Key("state_dir", "text", "where blocks are recorded"),
    ),
    model=ResponseSettings,
)


def parse_response_settings(
    section: Mapping | None, *, source: str, problems: Problems | None = None
) -> ResponseSettings:
    """Validate the ``response:`` section read from ``source`` (a file name, for messages).

    With ``problems`` collecting (``gpuguard config validate``), every problem is recorded there
    and a default stands in for each bad value; otherwise the first one is raised.
    """
    if section is None:
        return ResponseSettings()
    p = problems or Problems(source)
    at: tuple = ("response",)
    if not isinstance(section, Mapping):
        p.add(at, "expected a mapping")
        return ResponseSettings()
    values = check(section, RESPONSE_SCHEMA, at, p.add)
    actions = dict(DEFAULT_ACTIONS)
    given = values.get("actions", {})
    for verdict, steps in _mapping(given, at + ("actions",), VERDICTS, p).items():
        actions[verdict] = _steps(steps, at + ("actions", verdict), p)
    values["actions"] = actions
    values["rule_actions"] = {
        str(rule): _steps(steps, at + ("rule_actions", rule), p)
        for rule, steps in values.get("rule_actions", {}).items()
    }
    hooks = (_hook(h, at + ("hooks", i), p) for i, h in enumerate(values.get("hooks", [])))
    values["hooks"] = tuple(h for h in hooks if h is not None)
    return ResponseSettings(**values)


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


def _steps(value: Any, at: tuple, p: Problems) -> tuple[str, ...]:
    steps = [value] if isinstance(value, str) else value
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        p.add(at, "expected an action or a list of actions")
        return ()
    for i, step in enumerate(steps):
        if step not in (*STEPS, "none"):
            where = at + (i,) if isinstance(value, list) else at
            p.add(where, f"unknown action {step!r} (expected one of none, {', '.join(STEPS)})")
    return tuple(s for s in steps if s in STEPS)


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
