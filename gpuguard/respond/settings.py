"""The ``response:`` section of the agent config: which actions, on whom, how far.

:func:`parse_response_settings` validates the section (an unknown key is a
:class:`GpuguardError` naming it and the file) and fills defaults, so the
agent runs with no section at all.  Defaults: ``malicious`` -> kill,
kill-on-touch and block-egress; ``suspicious`` -> alert; ``clean`` -> nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuguard.errors import Problems
from gpuguard.respond.actions import ACTIONS, STEPS, Option

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

_TOP_KEYS = (
    "actions",
    "rule_actions",
    *(a.section for a in ACTIONS if a.section),
    "hooks",
    "scope",
    "cgroups",
    "protect_exes",
    "max_actions_per_minute",
    "pin_root",
    "state_dir",
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
    data = _mapping(section, at, _TOP_KEYS, p)
    actions = dict(DEFAULT_ACTIONS)
    for verdict, steps in _mapping(data.get("actions", {}), at + ("actions",), VERDICTS, p).items():
        actions[verdict] = _steps(steps, at + ("actions", verdict), p)
    rule_actions = {
        str(rule): _steps(steps, at + ("rule_actions", rule), p)
        for rule, steps in _mapping(
            data.get("rule_actions", {}), at + ("rule_actions",), None, p
        ).items()
    }
    options: dict[str, Any] = {}
    for action in ACTIONS:
        if action.section:
            here = at + (action.section,)
            given = _mapping(
                data.get(action.section, {}), here, tuple(o.key for o in action.options), p
            )
            for option in action.options:
                if option.key in given:
                    options[option.field] = _option(option, given[option.key], here, p)
    scope = data.get("scope", _DEFAULT.scope)
    if scope not in SCOPES:
        p.add(at + ("scope",), f"{scope!r} is not one of {', '.join(SCOPES)}")
        scope = "all"
    hooks = data.get("hooks", [])
    if not isinstance(hooks, list):
        p.add(at + ("hooks",), "expected a list of hooks")
        hooks = []
    hook_settings = (_hook(h, at + ("hooks", i), p) for i, h in enumerate(hooks))
    return ResponseSettings(
        actions=actions,
        rule_actions=rule_actions,
        **options,
        hooks=tuple(h for h in hook_settings if h is not None),
        scope=scope,
        cgroups=_texts(data.get("cgroups", []), at + ("cgroups",), p),
        protect_exes=_texts(data.get("protect_exes", []), at + ("protect_exes",), p),
        max_actions_per_minute=int(
            _number(
                data.get("max_actions_per_minute", _DEFAULT.max_actions_per_minute),
                at + ("max_actions_per_minute",),
                p,
            )
        ),
        pin_root=_text(data.get("pin_root", _DEFAULT.pin_root), at + ("pin_root",), p),
        state_dir=_text(data.get("state_dir", _DEFAULT.state_dir), at + ("state_dir",), p),
    )


_DEFAULT = ResponseSettings()
_HOOK_DEFAULT = HookSettings(name="", argv=())


def _option(option: Option, value: Any, at: tuple, p: Problems) -> Any:
    """``value`` checked as ``option`` declares it; on a problem, the field's default."""
    where = at + (option.key,)
    if option.type == "number":
        return _number(value, where, p)
    if option.type == "count":
        return int(_number(value, where, p))
    if option.type == "text":
        return _text(value, where, p)
    if option.type == "flag":
        return _flag(value, where, p)
    if option.type == "texts":
        return _texts(value, where, p)
    if option.type == "networks":
        listed = enumerate(_list(value, where, p))
        return tuple(n for i, v in listed if (n := _network(v, where + (i,), p)))
    if value not in option.choices:
        p.add(where, f"{value!r} is not {', '.join(option.choices[:-1])} or {option.choices[-1]}")
        return getattr(_DEFAULT, option.field)
    return value


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
    hook = _mapping(value, at, ("name", "argv", "on", "timeout_s"), p)
    argv = hook.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        p.add(at + ("argv",), "expected a non-empty list of strings (no shell is used)")
        argv = ["/"]
    elif not argv[0].startswith("/"):
        p.add(at + ("argv", 0), f"{argv[0]!r} is not an absolute path")
    on = tuple(_list(hook.get("on", list(_HOOK_DEFAULT.on)), at + ("on",), p))
    for i, verdict in enumerate(on):
        if verdict not in VERDICTS:
            p.add(at + ("on", i), f"unknown verdict {verdict!r}")
    settings = HookSettings(
        name=_text(hook.get("name", argv[0].rsplit("/", 1)[-1]), at + ("name",), p),
        argv=tuple(argv),
        on=on,
        timeout_s=_number(hook.get("timeout_s", _HOOK_DEFAULT.timeout_s), at + ("timeout_s",), p),
    )
    return settings if len(p.found) == found else None


def _network(value: Any, at: tuple, p: Problems) -> str:
    try:
        return str(ipaddress.ip_network(str(value), strict=False))
    except ValueError:
        p.add(at, f"{value!r} is not an address or network (e.g. 10.0.0.0/8)")
        return ""


def _number(value: Any, at: tuple, p: Problems) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        p.add(at, f"expected a number >= 0, got {value!r}")
        return 0.0
    return float(value)


def _flag(value: Any, at: tuple, p: Problems) -> bool:
    if not isinstance(value, bool):
        p.add(at, f"expected true or false, got {value!r}")
        return False
    return value


def _text(value: Any, at: tuple, p: Problems) -> str:
    if not isinstance(value, str):
        p.add(at, f"expected a string, got {value!r}")
        return ""
    return value


def _texts(value: Any, at: tuple, p: Problems) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(_list(value, at, p)):
        text = _text(item, at + (i,) if isinstance(value, list) else at, p)
        if isinstance(item, str):
            out.append(text)
    return tuple(out)


def _list(value: Any, at: tuple, p: Problems) -> list:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        p.add(at, "expected a list")
        return []
    return value
