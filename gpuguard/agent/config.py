"""The agent's configuration file (/etc/gpuguard/agent.yaml): read, checked against SCHEMA, overridden.

Every setting has a default, so the agent runs with no file at all.  The file
is read like the rules: positions are kept (:mod:`gpuguard.config.yaml_marks`)
so an unknown key or a wrong type is reported as ``file:line:col``, and a file
writable by anyone but root is refused (:mod:`gpuguard.config.filecheck`).
Every key and its default: :mod:`gpuguard.agent.config_schema` (re-exported here).
Command-line options override the file.  The ``response:`` and
``guard_policies:`` sections are checked here with their owners' parsers
(:func:`gpuguard.respond.parse_response_settings`,
:func:`gpuguard.detect.guard_policies.parse_guard_policies`), so a broken
section fails the whole file: one line at start, the last good config kept on
SIGHUP.
docs/agent.md's key list is generated from ``SCHEMA`` (``gpuguard config reference``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpuguard.agent.config_schema import (  # noqa: F401  (re-exported: the config's readers use them)
    DEFAULT_CONFIG_PATH,
    DEFAULT_STATUS_PATH,
    LOG_FORMATS,
    MAX_CONFIG_BYTES,
    MODES,
    SCHEMA,
    SENSORS,
    SYSLOG_FORMATS,
    AgentConfig,
)
from gpuguard.config.schema import check
from gpuguard.config.yaml_marks import MarkedDocument, load_trusted_file
from gpuguard.detect.guard_policies import parse_guard_policies
from gpuguard.errors import GpuguardError, Problems
from gpuguard.respond import parse_response_settings

_FIX = "correct the agent config (docs/agent.md lists every key)"


def config_problems(doc: MarkedDocument) -> tuple[AgentConfig | None, list[str]]:
    """Every problem in a parsed file (``file:line:col: message``), and the config when none."""
    if doc.problems:
        return None, [f"{position}: {message}" for position, message in doc.problems]
    if doc.data is None:
        return AgentConfig(source=doc.file), []
    if not isinstance(doc.data, dict):
        return None, [f"{doc.file}:1:1: the agent config must be a mapping of settings"]
    problems: list[str] = []

    def add(path: tuple, message: str, key: bool = False) -> None:
        problems.append(f"{doc.key_at(path) if key else doc.at(path)}: {message}")

    values = check(doc.data, SCHEMA, (), add, named=True)
    base = Path(doc.file).parent
    if "rules" in values:
        for i, item in enumerate(values["rules"]):
            if not isinstance(item, str):
                problems.append(f"{doc.at(('rules', i))}: rules entries must be file paths")
        values["rules"] = [
            (base / p) if not Path(p).is_absolute() else Path(p)
            for p in values["rules"]
            if isinstance(p, str)
        ]
    if "status_path" in values:
        values["status_path"] = Path(values["status_path"])
    if values.get("metrics_web_config"):  # like the rules: relative to this file
        values["metrics_web_config"] = str(base / values["metrics_web_config"])
    if values.get("metrics_address"):
        from gpuguard.outputs.metrics_http import parse_address

        try:
            parse_address(values["metrics_address"])
        except ValueError as exc:
            problems.append(f"{doc.at(('metrics', 'address'))}: {exc}")

    def locate(path: tuple, key: bool = False) -> str:
        return str(doc.key_at(path) if key else doc.at(path))

    # The owners' parsers check their sections, every problem at its line and column.
    sections = Problems(doc.file, collect=True, locate=locate)
    if "response" in values:
        values["response"] = parse_response_settings(
            values["response"], source=doc.file, problems=sections
        )
    if "guard_policies" in values:
        values["guard_policies"] = parse_guard_policies(
            values["guard_policies"], source=doc.file, problems=sections
        )
    problems += sections.found
    if problems:
        return None, sorted(problems, key=lambda line: _line_col(doc.file, line))
    return AgentConfig(source=doc.file, **values), []


def _line_col(file: str, problem: str) -> tuple[int, int]:
    """Where a ``file:line:col: message`` problem is, for sorting (problems in file order)."""
    line, _, rest = problem[len(file) + 1 :].partition(":")
    col = rest.partition(":")[0]
    return (int(line), int(col)) if line.isdigit() and col.isdigit() else (0, 0)


def parse_config(doc: MarkedDocument) -> AgentConfig:
    """An :class:`AgentConfig` from a parsed file; raises GpuguardError naming file:line:col."""
    config, problems = config_problems(doc)
    if problems:
        more = (
            f" (and {len(problems) - 1} more: gpuguard config validate {doc.file})"
            if len(problems) > 1
            else ""
        )
        raise GpuguardError(problems[0] + more, _FIX)
    assert config is not None
    return config


def read_config_file(path: Path) -> MarkedDocument:
    """Parse ``path`` once it is known to be root's own regular file; raises GpuguardError."""
    return load_trusted_file(path, MAX_CONFIG_BYTES, "agent config")


def load_config(path: Path | None) -> AgentConfig:
    """The config in ``path``; with ``None`` the default file if it exists, else the defaults."""
    explicit = path is not None
    path = path or DEFAULT_CONFIG_PATH
    if not path.exists():
        if explicit:
            raise GpuguardError(
                f"agent config {path} does not exist", "give an existing file to --config"
            )
        return AgentConfig()
    doc = read_config_file(path)
    return parse_config(doc)


def with_overrides(config: AgentConfig, **overrides: Any) -> AgentConfig:
    """``config`` with every override that is not None applied (the command-line options)."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(config, **changes)
