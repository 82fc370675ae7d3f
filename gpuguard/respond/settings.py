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

from gpuguard.errors import GpuguardError

VERDICTS = ("clean", "suspicious", "malicious")
# In the order they run: the kernel blocks go in first so a respawn or a child
# started while the offender dies is already caught.
STEPS = ("alert", "kill-on-touch", "quarantine", "block-egress", "suspend", "kill")
DEFAULT_ACTIONS = {
    "clean": (),
    "suspicious": ("alert",),
    "malicious": ("kill", "kill-on-touch", "block-egress"),
}
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
    "kill",
    "kill_on_touch",
    "quarantine",
    "block_egress",
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


def parse_response_settings(section: Mapping | None, *, source: str) -> ResponseSettings:
    """Validate the ``response:`` section read from ``source`` (a file name, for messages)."""
    if section is None:
        return ResponseSettings()
    where = f"{source}: response"
    data = _mapping(section, where, _TOP_KEYS)
    actions = dict(DEFAULT_ACTIONS)
    for verdict, steps in _mapping(data.get("actions", {}), f"{where}.actions", VERDICTS).items():
        actions[verdict] = _steps(steps, f"{where}.actions.{verdict}")
    rule_actions = {
        str(rule): _steps(steps, f"{where}.rule_actions.{rule}")
        for rule, steps in _mapping(
            data.get("rule_actions", {}), f"{where}.rule_actions", None
        ).items()
    }
    kill = _mapping(data.get("kill", {}), f"{where}.kill", ("grace_s", "target"))
    touch = _mapping(
        data.get("kill_on_touch", {}),
        f"{where}.kill_on_touch",
        ("ttl_s", "shared_exe_prefixes", "breaker_victims_per_minute"),
    )
    quarantine = _mapping(
        data.get("quarantine", {}), f"{where}.quarantine", ("ttl_s", "cgroup_parent")
    )
    egress = _mapping(
        data.get("block_egress", {}),
        f"{where}.block_egress",
        ("ttl_s", "nftables", "nftables_netns", "never_block"),
    )
    target = kill.get("target", "process")
    if target not in ("process", "group", "cgroup"):
        raise GpuguardError(
            f"{where}.kill.target: {target!r} is not process, group or cgroup", f"fix {source}"
        )
    scope = data.get("scope", "all")
    if scope not in SCOPES:
        raise GpuguardError(
            f"{where}.scope: {scope!r} is not one of {', '.join(SCOPES)}", f"fix {source}"
        )
    hooks = data.get("hooks", [])
    if not isinstance(hooks, list):
        raise GpuguardError(f"{where}.hooks: expected a list of hooks", f"fix {source}")
    return ResponseSettings(
        actions=actions,
        rule_actions=rule_actions,
        kill_grace_s=_number(kill.get("grace_s", 2.0), f"{where}.kill.grace_s", source),
        kill_target=target,
        touch_ttl_s=_number(touch.get("ttl_s", 86400.0), f"{where}.kill_on_touch.ttl_s", source),
        shared_exe_prefixes=tuple(
            _text(p, f"{where}.kill_on_touch.shared_exe_prefixes", source)
            for p in _list(
                touch.get("shared_exe_prefixes", list(SHARED_EXE_PREFIXES)),
                f"{where}.kill_on_touch.shared_exe_prefixes",
                source,
            )
        ),
        breaker_victims_per_minute=int(
            _number(
                touch.get("breaker_victims_per_minute", 3),
                f"{where}.kill_on_touch.breaker_victims_per_minute",
                source,
            )
        ),
        quarantine_ttl_s=_number(quarantine.get("ttl_s", 0.0), f"{where}.quarantine.ttl_s", source),
        quarantine_parent=_text(
            quarantine.get("cgroup_parent", ""), f"{where}.quarantine.cgroup_parent", source
        ),
        egress_ttl_s=_number(egress.get("ttl_s", 3600.0), f"{where}.block_egress.ttl_s", source),
        nftables=_flag(egress.get("nftables", True), f"{where}.block_egress.nftables", source),
        nftables_netns=_text(
            egress.get("nftables_netns", ""), f"{where}.block_egress.nftables_netns", source
        ),
        never_block_host_wide=tuple(
            _network(n, f"{where}.block_egress.never_block", source)
            for n in _list(
                egress.get("never_block", []), f"{where}.block_egress.never_block", source
            )
        ),
        hooks=tuple(_hook(h, f"{where}.hooks[{i}]", source) for i, h in enumerate(hooks)),
        scope=scope,
        cgroups=tuple(
            _text(c, f"{where}.cgroups", source)
            for c in _list(data.get("cgroups", []), f"{where}.cgroups", source)
        ),
        protect_exes=tuple(
            _text(e, f"{where}.protect_exes", source)
            for e in _list(data.get("protect_exes", []), f"{where}.protect_exes", source)
        ),
        max_actions_per_minute=int(
            _number(
                data.get("max_actions_per_minute", 30), f"{where}.max_actions_per_minute", source
            )
        ),
        pin_root=_text(data.get("pin_root", DEFAULT_PIN_ROOT), f"{where}.pin_root", source),
        state_dir=_text(data.get("state_dir", DEFAULT_STATE_DIR), f"{where}.state_dir", source),
    )


def _mapping(value: Any, where: str, keys: tuple[str, ...] | None) -> dict:
    if not isinstance(value, Mapping):
        raise GpuguardError(f"{where}: expected a mapping", f"fix {where.split(':')[0]}")
    if keys is not None:
        for key in value:
            if key not in keys:
                raise GpuguardError(
                    f"{where}: unknown key {key!r} (expected one of {', '.join(keys)})",
                    f"fix {where.split(':')[0]}",
                )
    return dict(value)


def _steps(value: Any, where: str) -> tuple[str, ...]:
    steps = [value] if isinstance(value, str) else value
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise GpuguardError(
            f"{where}: expected an action or a list of actions", f"fix {where.split(':')[0]}"
        )
    for step in steps:
        if step not in (*STEPS, "none"):
            raise GpuguardError(
                f"{where}: unknown action {step!r} (expected one of none, {', '.join(STEPS)})",
                f"fix {where.split(':')[0]}",
            )
    return tuple(s for s in steps if s != "none")


def _hook(value: Any, where: str, source: str) -> HookSettings:
    hook = _mapping(value, where, ("name", "argv", "on", "timeout_s"))
    argv = hook.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise GpuguardError(
            f"{where}.argv: expected a non-empty list of strings (no shell is used)",
            f"fix {source}",
        )
    if not argv[0].startswith("/"):
        raise GpuguardError(
            f"{where}.argv[0]: {argv[0]!r} is not an absolute path", f"fix {source}"
        )
    on = tuple(_list(hook.get("on", ["malicious"]), f"{where}.on", source))
    for verdict in on:
        if verdict not in VERDICTS:
            raise GpuguardError(f"{where}.on: unknown verdict {verdict!r}", f"fix {source}")
    return HookSettings(
        name=_text(hook.get("name", argv[0].rsplit("/", 1)[-1]), f"{where}.name", source),
        argv=tuple(argv),
        on=on,
        timeout_s=_number(hook.get("timeout_s", 10.0), f"{where}.timeout_s", source),
    )


def _network(value: Any, where: str, source: str) -> str:
    try:
        return str(ipaddress.ip_network(str(value), strict=False))
    except ValueError:
        raise GpuguardError(
            f"{where}: {value!r} is not an address or network (e.g. 10.0.0.0/8)", f"fix {source}"
        ) from None


def _number(value: Any, where: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GpuguardError(f"{where}: expected a number >= 0, got {value!r}", f"fix {source}")
    return float(value)


def _flag(value: Any, where: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise GpuguardError(f"{where}: expected true or false, got {value!r}", f"fix {source}")
    return value


def _text(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str):
        raise GpuguardError(f"{where}: expected a string, got {value!r}", f"fix {source}")
    return value


def _list(value: Any, where: str, source: str) -> list:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise GpuguardError(f"{where}: expected a list", f"fix {source}")
    return value
