"""The capabilities each mode needs, and the one line an enforce agent says when it lacks one.

Monitor mode needs MONITOR_CAPABILITIES (docs/deploy.md, "Capabilities", says what breaks
without each, as measured); enforce mode adds what its configured actions need: CAP_KILL to
signal other users' processes (kill, suspend) and CAP_NET_ADMIN for block-egress's host-wide
nftables sets.  The packaging (systemd unit and drop-in, DaemonSet overlays) grants exactly
these sets; tests/test_deploy.py compares them.
"""

from __future__ import annotations

from gpuguard.errors import GpuguardError
from gpuguard.respond.actions import BY_NAME
from gpuguard.respond.settings import options_of
from gpuguard.sources.proc.capabilities import effective_capabilities

MONITOR_CAPABILITIES = (
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_SYS_ADMIN",
    "CAP_DAC_READ_SEARCH",
    "CAP_SYS_PTRACE",
)
# what the actions need (each Action's ``capabilities``): signals, host-wide nftables sets
ENFORCE_CAPABILITIES = (*MONITOR_CAPABILITIES, "CAP_KILL", "CAP_NET_ADMIN")


def needed_by_actions(response) -> dict[str, list[str]]:
    """Capability -> the configured actions (of ``response``, the checked settings) needing it."""
    names = {a for steps in response.actions.values() for a in steps}
    names |= {a for steps in response.rule_actions.values() for a in steps}
    needs: dict[str, list[str]] = {}
    for name in sorted(names):
        action = BY_NAME[name]
        for cap in action.capabilities(options_of(action, response)):
            needs.setdefault(cap, []).append(name)
    return needs


def check_enforce_capabilities(config, have: set[str] | None = None) -> None:
    """Raise one line when enforce mode's actions need a capability this agent lacks (a dry run
    acts on nothing and needs none)."""
    if config.mode != "enforce" or config.dry_run:
        return
    have = effective_capabilities() if have is None else have
    missing = {
        cap: acts for cap, acts in needed_by_actions(config.response).items() if cap not in have
    }
    if not missing:
        return
    said = "; ".join(f"{cap} for {', '.join(acts)}" for cap, acts in sorted(missing.items()))
    grant = " and ".join(cap.removeprefix("CAP_") for cap in sorted(missing))
    raise GpuguardError(
        f"enforce mode needs {said}, and this agent runs without {'it' if len(missing) == 1 else 'them'}",
        f"grant {grant} (packaging/kubernetes/overlays/enforce; systemd: the enforce drop-in, "
        'docs/deploy.md "Capabilities"), drop those actions from response.actions, or run '
        "--mode monitor",
    )
