"""The agent's configuration file (/etc/gpuguard/agent.yaml): schema, defaults and validation.

Every setting has a default, so the agent runs with no file at all.  The file
is read like the rules: positions are kept (:mod:`gpuguard.config.yaml_marks`)
so an unknown key or a wrong type is reported as ``file:line:col``, and a file
writable by anyone but root is refused (:mod:`gpuguard.config.filecheck`).
Command-line options override the file.  The ``response:`` and
``guard_policies:`` sections are checked here with their owners' parsers
(:func:`gpuguard.respond.parse_response_settings`,
:func:`gpuguard.detect.guard_policies.parse_guard_policies`), so a broken
section fails the whole file: one line at start, the last good config kept on
SIGHUP.
docs/agent.md documents every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.config.filecheck import untrusted_reason
from gpuguard.config.yaml_marks import MarkedDocument, load_marked_file, shown
from gpuguard.detect.guard_policies import GuardPolicy, parse_guard_policies
from gpuguard.errors import GpuguardError, Problems
from gpuguard.outputs.log_sinks import DEFAULT_KEEP, DEFAULT_MAX_BYTES, FACILITIES
from gpuguard.outputs.log_spool import DEFAULT_SPOOL_BYTES, DEFAULT_SPOOL_DIR
from gpuguard.outputs.records import FORMATS
from gpuguard.respond import ResponseSettings, parse_response_settings
from gpuguard.sources.gpu.registry import SOURCE_NAMES

DEFAULT_CONFIG_PATH = Path("/etc/gpuguard/agent.yaml")
DEFAULT_STATUS_PATH = Path("/run/gpuguard/status.json")
MAX_CONFIG_BYTES = 1 << 20  # an agent.yaml is a few KiB; refuse anything absurd before parsing
MODES = ("monitor", "enforce")
SENSORS = ("auto", "ebpf", "proc")
LOG_FORMATS = FORMATS
SYSLOG_FORMATS = ("rfc5424", "rfc3164")


@dataclass(slots=True)
class AgentConfig:
    """Every agent setting, with its default."""

    mode: str = "monitor"
    dry_run: bool = False
    sensor: str = "auto"
    rules: list[Path] | None = None  # None: shipped rules + /etc/gpuguard/*.yaml
    log_path: str = "-"  # "-" is stdout
    log_format: str = "ecs"
    log_max_bytes: int = DEFAULT_MAX_BYTES  # a log file is rotated past this size
    log_keep: int = DEFAULT_KEEP  # rotated files kept (path.1 ... path.KEEP)
    log_syslog_format: str = "rfc5424"  # framing for syslog destinations
    log_facility: str = "daemon"  # syslog facility
    # syslog:tcp: lines wait here (in order, up to spool_max_bytes) while the collector is away
    log_spool_dir: str = DEFAULT_SPOOL_DIR
    log_spool_max_bytes: int = DEFAULT_SPOOL_BYTES  # 0: no spool, lines are lost (and counted)
    log_limits: dict[str, int] = field(default_factory=dict)  # log.limits: OutputLimits overrides
    metrics_address: str = ""  # HOST:PORT; empty: no metrics endpoint (packaging: 127.0.0.1:9479)
    health_stall_s: float = 30.0  # /healthz answers 503 after this long without a detect-loop cycle
    per_process_gpu: bool = False  # also export GPU use per process with pod labels
    max_pod_series: int = 2000  # cap on per-pod (and per-process) GPU series; the rest is counted
    sample_interval_s: float = 1.0
    host_check_interval_s: float = 10.0  # GPU host checks (orphaned memory...) and accounting reads
    nvml_accounting: bool = False  # turn NVML accounting mode on (changes host state: opt-in)
    gpu_sources: list[str] = field(default_factory=lambda: list(SOURCE_NAMES))
    sweep_interval_s: float = 3.0  # reduced mode: a /proc sweep this often
    status_path: Path = DEFAULT_STATUS_PATH
    status_interval_s: float = 2.0
    intake_queue: int = 65536  # events waiting for the correlator
    output_queue: int = 10000  # log lines waiting for the writer
    max_processes: int = 8192
    # A process scored at least this gets per-connection activity records like a GPU holder
    # (session cadence, bytes each way, tcp_info): by default every process that scores
    # anything (the lightest rule weighs 5), so a miner whose only other trace is its huge
    # pages (+10) still has its pool session measured.  0: GPU holders only.
    session_watch_score: float = 1.0
    # A process finding's coalesced updates: at most one per this many seconds (0: no limit).
    finding_update_interval_s: float = 30.0
    response: ResponseSettings = field(
        default_factory=ResponseSettings
    )  # the checked ``response:`` section
    guard_policies: tuple[GuardPolicy, ...] = ()
    source: str = ""  # the file these came from ("" for defaults)


# key -> (field name, expected type(s), check).  Sections are nested dicts.
_NUMBER = (int, float)
_SCHEMA: dict[str, Any] = {
    "mode": ("mode", str, MODES),
    "dry_run": ("dry_run", bool, None),
    "sensor": ("sensor", str, SENSORS),
    "rules": ("rules", list, None),
    "log": {
        "path": ("log_path", str, None),
        "format": ("log_format", str, LOG_FORMATS),
        "max_bytes": ("log_max_bytes", int, (4096, 1 << 40)),
        "keep": ("log_keep", int, (0, 1000)),
        "syslog_format": ("log_syslog_format", str, SYSLOG_FORMATS),
        "facility": ("log_facility", str, tuple(FACILITIES)),
        "spool_dir": ("log_spool_dir", str, None),
        "spool_max_bytes": ("log_spool_max_bytes", int, (0, 1 << 40)),
        "limits": {  # outputs/bounds.py: caps of attacker-controlled fields, one record's budget
            "cmdline_bytes": ("log_limit_cmdline", int, (256, 1 << 20)),
            "arg_bytes": ("log_limit_arg", int, (64, 1 << 20)),
            "name_bytes": ("log_limit_name", int, (64, 1 << 20)),
            "record_bytes": ("log_limit_record", int, (1024, 1 << 24)),
            "evidence": ("log_limit_evidence", int, (1, 1000)),
        },
    },
    "metrics": {
        "address": ("metrics_address", str, None),
        "health_stall_s": ("health_stall_s", _NUMBER, (1, 3600)),
        "per_process_gpu": ("per_process_gpu", bool, None),
        "max_pod_series": ("max_pod_series", int, (1, 1_000_000)),
    },
    "sampling": {
        "interval_s": ("sample_interval_s", _NUMBER, (0.1, 3600)),
        "host_check_interval_s": ("host_check_interval_s", _NUMBER, (0.2, 3600)),
        "nvml_accounting": ("nvml_accounting", bool, None),
        "sources": ("gpu_sources", list, SOURCE_NAMES),
    },
    "sweep": {"interval_s": ("sweep_interval_s", _NUMBER, (0.5, 3600))},
    "status": {
        "path": ("status_path", str, None),
        "interval_s": ("status_interval_s", _NUMBER, (0.2, 3600)),
    },
    "queues": {
        "intake": ("intake_queue", int, (64, 10_000_000)),
        "output": ("output_queue", int, (16, 10_000_000)),
    },
    "correlator": {"max_processes": ("max_processes", int, (16, 10_000_000))},
    "sessions": {"watch_score": ("session_watch_score", _NUMBER, (0, 100))},
    "findings": {"update_interval_s": ("finding_update_interval_s", _NUMBER, (0, 86400))},
    "response": ("response", dict, None),
    "guard_policies": ("guard_policies", list, None),
}
_FIX = "correct the agent config (docs/agent.md lists every key)"


def _check_value(doc: MarkedDocument, path: tuple, value: Any, kind: Any, check: Any) -> str | None:
    """What is wrong with one value (``file:line:col: ...``), or None."""
    where = doc.at(path)
    name = ".".join(str(p) for p in path)
    if kind is bool or kind is int:
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    elif kind is _NUMBER:
        ok = isinstance(value, _NUMBER) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        expected = {
            str: "text",
            bool: "true or false",
            int: "a whole number",
            list: "a list",
            dict: "a mapping",
        }.get(kind, "a number")
        return f"{where}: {name} must be {expected}, not {shown(value)}"
    if isinstance(check, tuple) and check and isinstance(check[0], str):
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if item not in check:
                at = doc.at(path + (i,)) if isinstance(value, list) else where
                return f"{at}: {name} {shown(item)} is not one of {', '.join(check)}"
    elif isinstance(check, tuple):
        low, high = check
        if not low <= value <= high:
            return f"{where}: {name} {value} is outside {low}-{high}"
    return None


def _apply(
    doc: MarkedDocument, data: dict, schema: dict, path: tuple, out: dict, problems: list[str]
) -> None:
    for key, value in data.items():
        spec = schema.get(key)
        if spec is None:
            known = ", ".join(sorted(schema))
            problems.append(
                f"{doc.key_at(path + (key,))}: unknown key {key!r} (known here: {known})"
            )
            continue
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                problems.append(f"{doc.at(path + (key,))}: {key} must be a mapping")
                continue
            _apply(doc, value, spec, path + (key,), out, problems)
            continue
        name, kind, check = spec
        problem = _check_value(doc, path + (key,), value, kind, check)
        if problem is None:
            out[name] = value
        else:
            problems.append(problem)


def config_problems(doc: MarkedDocument) -> tuple[AgentConfig | None, list[str]]:
    """Every problem in a parsed file (``file:line:col: message``), and the config when none."""
    if doc.problems:
        return None, [f"{position}: {message}" for position, message in doc.problems]
    if doc.data is None:
        return AgentConfig(source=doc.file), []
    if not isinstance(doc.data, dict):
        return None, [f"{doc.file}:1:1: the agent config must be a mapping of settings"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    _apply(doc, doc.data, _SCHEMA, (), values, problems)
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
    limits = {
        k[len("log_limit_") :]: values.pop(k) for k in list(values) if k.startswith("log_limit_")
    }
    if limits:
        values["log_limits"] = limits
    if values.get("metrics_address"):
        from gpuguard.outputs.metrics import parse_address

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
    reason = untrusted_reason(path)
    if reason is not None:
        cause, fix = reason
        raise GpuguardError(cause.replace("rules file", "agent config"), fix)
    try:
        return load_marked_file(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise GpuguardError(
            f"cannot read agent config {path}: {exc.strerror}", "check the path and permissions"
        ) from None


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
