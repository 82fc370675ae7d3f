"""Where rule files live: the shipped set in the package or checkout, and the site directory."""

from __future__ import annotations

from pathlib import Path

SITE_RULES_DIR = Path("/etc/gpuguard")
SHIPPED_RULES_NAME = "miner-rules.yaml"


def shipped_rules_dir() -> Path:
    """``rules/`` of an installed package if present, else the source checkout's top-level ``rules/``."""
    packaged = Path(__file__).resolve().parent.parent / "rules"
    if (packaged / SHIPPED_RULES_NAME).exists():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "rules"


def shipped_rules_file() -> Path:
    return shipped_rules_dir() / SHIPPED_RULES_NAME


def default_rule_paths(site_dir: Path = SITE_RULES_DIR) -> list[Path]:
    """The shipped rules, then ``/etc/gpuguard/*.yaml`` (sorted) when present."""
    paths = [shipped_rules_file()]
    if site_dir.is_dir():
        paths += sorted(p for p in site_dir.glob("*.yaml") if p.is_file())
    return paths
