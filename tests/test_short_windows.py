"""The short-window rules layer live tests use: it loads over the shipped rules and changes
nothing but the window bounds (tests/support/short_windows.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuguard.detect.ruleset.load import load_ruleset
from tests.support.short_windows import (
    FLOOR_S,
    NOT_WINDOWS,
    SHIPPED,
    WINDOW_SIGNALS,
    short_window_layer,
    short_window_rules,
    shortened,
)


def _without_windows(node):
    """``node`` with every window bound blanked: what must be equal before and after."""
    if isinstance(node, list):
        return [_without_windows(item) for item in node]
    if isinstance(node, dict):
        if node.get("signal") in WINDOW_SIGNALS:
            return {k: ("W" if k in ("gte", "gt") else v) for k, v in node.items()}
        return {k: _without_windows(v) for k, v in node.items()}
    return node


def test_the_layer_changes_only_window_bounds_and_shortens_each_long_one():
    shipped = {r["id"]: r for r in yaml.safe_load(SHIPPED.read_text())["rules"]}
    layer = short_window_layer()
    assert layer["rules"], "no shipped rule has a window"
    for override in layer["rules"]:
        before, after = shipped[override["id"]]["condition"], override["override"]["condition"]
        assert _without_windows(after) == _without_windows(before), override["id"]
        assert after != before
    by_id = {o["id"]: o["override"]["condition"] for o in layer["rules"]}
    # the windows the live tests wait out: one minute of spinning, two of a quiet session
    assert {"signal": "cpu_spin_s", "gte": 10} in by_id["cpu-hugepages-miner"]["all"][2]["any"][0][
        "all"
    ]
    assert {"signal": "quiet_session_age_s", "gte": 20} in by_id["net-quiet-session-cpu-spinning"][
        "all"
    ]
    assert shortened(120) == 20 and shortened(30) == FLOOR_S and shortened(5) == 5


def test_the_layer_loads_over_the_shipped_rules(tmp_path: Path):
    paths = short_window_rules(tmp_path, 45678)
    ruleset = load_ruleset([Path(p) for p in paths])
    assert 45678 in ruleset.lists["pool_ports"]
    assert (tmp_path / "rules").stat().st_mode & 0o777 == 0o700


def _lower_bounds(node, out: set[str]) -> set[str]:
    """The signals ``node`` bounds from below (``gte``/``gt``)."""
    if isinstance(node, list):
        for item in node:
            _lower_bounds(item, out)
    elif isinstance(node, dict):
        if "signal" in node and ("gte" in node or "gt" in node):
            out.add(node["signal"])
        for value in node.values():
            _lower_bounds(value, out)
    return out


def test_every_signal_in_seconds_is_a_window_or_named_as_not_one():
    """A new duration signal in the shipped rules must be shortened too (or said not to be one)."""
    bounded: set[str] = set()
    for rule in yaml.safe_load(SHIPPED.read_text())["rules"]:
        _lower_bounds(rule.get("condition"), bounded)
    in_seconds = {name for name in bounded if name.endswith("_s")}
    assert in_seconds, "no signal in seconds found: the scan is broken"
    assert in_seconds <= WINDOW_SIGNALS | NOT_WINDOWS, sorted(
        in_seconds - WINDOW_SIGNALS - NOT_WINDOWS
    )
