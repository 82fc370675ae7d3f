"""Where rule files live: the shipped set in the package or checkout, and the site directory."""

from __future__ import annotations

import functools
from pathlib import Path

SITE_RULES_DIR = Path("/etc/gpuguard")
SHIPPED_RULES_NAME = "miner-rules.yaml"
# The agent's own config lives in the same directory (/etc/gpuguard/agent.yaml); it is not a rules file.
NOT_RULES = frozenset({"agent.yaml"})


@functools.cache  # the agent looks for changed rule files every 2 s: one resolve, not one each
def shipped_rules_dir() -> Path:
    """``rules/`` of an installed package if present, else the source checkout's top-level ``rules/``."""
    packaged = Path(__file__).resolve().parents[2] / "rules"
    if (packaged / SHIPPED_RULES_NAME).exists():
        return packaged
    return Path(__file__).resolve().parents[3] / "rules"


def shipped_rules_file() -> Path:
    return shipped_rules_dir() / SHIPPED_RULES_NAME


def default_rule_paths(site_dir: Path = SITE_RULES_DIR) -> list[Path]:
    """The shipped rules, then ``/etc/gpuguard/*.yaml`` (sorted, the agent's ``agent.yaml`` excepted) when present."""
    paths = [shipped_rules_file()]
    if site_dir.is_dir():
        paths += sorted(
            p for p in site_dir.glob("*.yaml") if p.is_file() and p.name not in NOT_RULES
        )
    return paths
