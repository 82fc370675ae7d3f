"""The shipped rules with their time windows shortened, as a rules layer live tests put on top.

A live test that waited out the shipped windows (a minute of spinning, a two-minute quiet
session) sat for minutes.  Time is a rule parameter, so such a test layers this file over
``rules/miner-rules.yaml`` instead: every ``gte``/``gt`` bound on a window signal is divided
by :data:`FACTOR` (not below :data:`FLOOR_S`), and nothing else changes.  The layer is written
from the shipped file each time, so it cannot drift from it.  The shipped windows themselves
are covered by the recorded captures (replayed on their own clock) and by one live test on
the shipped rules, marked ``slow`` (tests/test_randomx_sources.py).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "rules" / "miner-rules.yaml"

# Signals that measure how long something has gone on, in seconds.
WINDOW_SIGNALS = frozenset(
    {
        "age_s",
        "cpu_spin_s",
        "cpu_window_s",
        "fpu_rounding_s",
        "gpu_allocation_stable_s",
        "gpu_lifetime_s",
        "gpu_util_window_s",
        "quiet_session_age_s",
        "session_age_s",
    }
)
# Signals named in seconds that are not how long something went on (a rate, a cadence).
NOT_WINDOWS = frozenset({"gpu_pcie_mb_s", "session_cadence_s"})
FACTOR = 6  # two minutes become 20 s, one minute 10 s
FLOOR_S = 10  # a spinning thread still has to be seen spinning for a while


def shortened(seconds: float) -> float:
    """``seconds`` of a shipped window, shortened."""
    return seconds if seconds <= FLOOR_S else max(FLOOR_S, seconds // FACTOR)


def _shorten(node: Any) -> tuple[Any, bool]:
    """``node`` (a condition) with its window bounds shortened, and whether any was."""
    if isinstance(node, list):
        pairs = [_shorten(item) for item in node]
        return [new for new, _ in pairs], any(changed for _, changed in pairs)
    if not isinstance(node, dict):
        return node, False
    if node.get("signal") in WINDOW_SIGNALS:
        out, changed = dict(node), False
        for op in ("gte", "gt"):
            if isinstance(node.get(op), (int, float)) and shortened(node[op]) != node[op]:
                out[op], changed = shortened(node[op]), True
        return out, changed
    out, changed = {}, False
    for key, value in node.items():
        out[key], was = _shorten(value)
        changed |= was
    return out, changed


def short_window_layer(shipped: Path = SHIPPED) -> dict:
    """The rules layer: an override of each shipped rule that has a window, with it shortened."""
    doc = yaml.safe_load(shipped.read_text())
    overrides = []
    for rule in doc.get("rules", []):
        condition, changed = _shorten(copy.deepcopy(rule.get("condition")))
        if changed:
            overrides.append({"id": rule["id"], "override": {"condition": condition}})
    return {"version": 1, "rules": overrides}


def short_window_rules(workdir: Path, *pool_ports: int) -> list[str]:
    """The shipped rules (with their YARA files) and the short-window layer copied root-only
    under ``workdir/rules``, as the agent demands, and ``pool_ports`` added to ``pool_ports``:
    the ``--rules`` paths in order."""
    rules = workdir / "rules"
    rules.mkdir(mode=0o700)
    shutil.copytree(REPO / "rules", rules, dirs_exist_ok=True)
    rules.chmod(0o700)  # (copytree gave it the checkout's mode)
    layer = short_window_layer()
    if pool_ports:
        layer["lists"] = {"pool_ports": {"extend": list(pool_ports)}}
    short = rules / "short-windows.yaml"
    short.write_text(
        "# written by tests/support/short_windows.py from miner-rules.yaml\n"
        + yaml.safe_dump(layer, sort_keys=False, width=100)
    )
    short.chmod(0o600)
    return [str(rules / "miner-rules.yaml"), str(short)]


def rules_args(paths: list[str]) -> list[str]:
    """``--rules PATH`` for each of ``paths``."""
    return [arg for path in paths for arg in ("--rules", path)]
