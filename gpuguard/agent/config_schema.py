"""agent.yaml's keys: :class:`AgentConfig` (every setting and its default) and ``SCHEMA``.

``SCHEMA`` (:mod:`gpuguard.config.schema`) declares each key's type, range or choices
and doc; its defaults are :class:`AgentConfig`'s, declared once there.  The
``response:`` and ``guard_policies:`` keys point at their owners' schemas.
:mod:`gpuguard.agent.config` reads and checks the file; ``gpuguard config reference``
renders ``SCHEMA`` (docs/agent.md holds that output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuguard.config.schema import Key, Section
from gpuguard.detect.guard_policies import GUARD_POLICY_SCHEMA, GuardPolicy
from gpuguard.detect.ruleset.model import DEFAULT_MATURITY, MATURITIES
from gpuguard.outputs.bounds import OutputLimits
from gpuguard.outputs.log_sinks import DEFAULT_KEEP, DEFAULT_MAX_BYTES, FACILITIES
from gpuguard.outputs.log_spool import DEFAULT_SPOOL_BYTES, DEFAULT_SPOOL_DIR
from gpuguard.outputs.metrics_http import DEFAULT_METRICS_PORT
from gpuguard.outputs.records import FORMATS
from gpuguard.respond import ResponseSettings
from gpuguard.respond.responder import MODES
from gpuguard.respond.settings import RESPONSE_SCHEMA
from gpuguard.sources.gpu.registry import SOURCE_NAMES
from gpuguard.sources.proc.container_images import TASK_ROOT
from gpuguard.sources.proc.pod_names import LOG_ROOT

DEFAULT_CONFIG_PATH = Path("/etc/gpuguard/agent.yaml")
DEFAULT_STATUS_PATH = Path("/run/gpuguard/status.json")
MAX_CONFIG_BYTES = 1 << 20  # an agent.yaml is a few KiB; refuse anything absurd before parsing
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
    maturity: str = DEFAULT_MATURITY  # the lowest rule tier that counts toward a verdict
    kubernetes_log_root: str = LOG_ROOT  # the kubelet's log tree (pods/, containers/)
    containerd_root: str = TASK_ROOT  # containerd's running containers (OCI bundles)
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
    metrics_address: str = ""  # HOST:PORT; empty: no endpoint (packaging: DEFAULT_METRICS_PORT)
    metrics_web_config: str = ""  # exporter-toolkit web config (TLS, basic auth); "": plain HTTP
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
    # anything (the lightest weighed rule is 5; rules of weight 0 only record evidence), so a
    # miner whose only other trace is its huge pages (+10) still has its pool session
    # measured.  0: GPU holders only.
    session_watch_score: float = 1.0
    # A process finding's coalesced updates: at most one per this many seconds (0: no limit).
    finding_update_interval_s: float = 30.0
    response: ResponseSettings = field(
        default_factory=ResponseSettings
    )  # the checked ``response:`` section
    guard_policies: tuple[GuardPolicy, ...] = ()
    source: str = ""  # the file these came from ("" for defaults)


_TIMES = (0.2, 3600)
SCHEMA = Section(
    "",
    (
        Key("mode", "choice", " | ".join(MODES), choices=MODES),
        Key("dry_run", "flag", "enforce mode: log what would be done, do nothing"),
        Key("sensor", "choice", "auto | ebpf | proc", choices=SENSORS),
        Key(
            "rules",
            "list",
            "rule files (relative to this file); default: shipped + /etc/gpuguard/*.yaml",
            shows="[]",
        ),
        Key(
            "maturity",
            "choice",
            "the lowest rule tier that counts toward a verdict: "
            + " | ".join(MATURITIES)
            + " (docs/rules.md, Maturity)",
            choices=MATURITIES,
        ),
        Section(
            "log",
            (
                Key(
                    "path",
                    "text",
                    '"-" (stdout), a file, syslog, syslog:unix:PATH, syslog:udp:HOST:PORT, '
                    "syslog:tcp:HOST:PORT",
                    field="log_path",
                ),
                Key(
                    "format", "choice", "ecs | ocsf | cef", field="log_format", choices=LOG_FORMATS
                ),
                Key(
                    "max_bytes",
                    "whole",
                    "a file is rotated (path.1 ... path.KEEP) before it passes this size",
                    field="log_max_bytes",
                    low=4096,
                    high=1 << 40,
                ),
                Key("keep", "whole", "rotated files kept", field="log_keep", low=0, high=1000),
                Key(
                    "syslog_format",
                    "choice",
                    "framing for syslog destinations",
                    field="log_syslog_format",
                    choices=SYSLOG_FORMATS,
                ),
                Key(
                    "facility",
                    "choice",
                    "syslog facility",
                    field="log_facility",
                    choices=tuple(FACILITIES),
                ),
                Key(
                    "spool_dir",
                    "text",
                    "syslog:tcp only: lines wait here (in order) while the collector is away",
                    field="log_spool_dir",
                ),
                Key(
                    "spool_max_bytes",
                    "whole",
                    "spool bound; past it lines are lost and counted (0: no spool)",
                    field="log_spool_max_bytes",
                    low=0,
                    high=1 << 40,
                ),
                Section(
                    "limits",
                    (
                        Key(
                            "cmdline_bytes",
                            "whole",
                            "a command line; longer ones are cut and marked (length + sha256)",
                            field="cmdline",
                            low=256,
                            high=1 << 20,
                        ),
                        Key(
                            "arg_bytes",
                            "whole",
                            "each argument (process.args in all: cmdline_bytes)",
                            field="arg",
                            low=64,
                            high=1 << 20,
                        ),
                        Key(
                            "name_bytes",
                            "whole",
                            "names, paths and any other text",
                            field="name",
                            low=64,
                            high=1 << 20,
                        ),
                        Key(
                            "record_bytes",
                            "whole",
                            "one whole record; with a syslog header it stays under 8 KiB",
                            field="record",
                            low=1024,
                            high=1 << 24,
                        ),
                        Key(
                            "evidence",
                            "whole",
                            "pieces of evidence a finding carries (the heaviest; the rest counted)",
                            low=1,
                            high=1000,
                        ),
                    ),
                    'size caps of every record (docs/siem.md, "Record size")',
                    model=OutputLimits,
                    field="log_limits",
                ),
            ),
        ),
        Section(
            "metrics",
            (
                Key(
                    "address",
                    "text",
                    "HOST:PORT of /metrics, /healthz, /readyz; empty: none "
                    f"(packaging: 127.0.0.1:{DEFAULT_METRICS_PORT})",
                    field="metrics_address",
                ),
                Key(
                    "web_config_file",
                    "text",
                    "TLS and basic auth for the metrics port, in the Prometheus exporter-toolkit's "
                    "web config format (relative to this file); empty: plain HTTP, no auth",
                    field="metrics_web_config",
                ),
                Key(
                    "health_stall_s",
                    "number",
                    "/healthz answers 503 after this long without a detect-loop cycle",
                    low=1,
                    high=3600,
                ),
                Key(
                    "per_process_gpu",
                    "flag",
                    "true: also gpuguard_process_gpu_* per process, with pod labels",
                ),
                Key(
                    "max_pod_series",
                    "whole",
                    "cap on per-pod / per-process GPU series; the rest counted (dropped_total)",
                    low=1,
                    high=1_000_000,
                ),
            ),
        ),
        Section(
            "sampling",
            (
                Key(
                    "interval_s",
                    "number",
                    "GPU samples, per source, on its own thread (4x less often while its GPUs stay idle)",
                    field="sample_interval_s",
                    low=0.1,
                    high=3600,
                ),
                Key(
                    "host_check_interval_s",
                    "number",
                    "GPU host checks (orphaned memory, past heavy users) and NVML accounting reads",
                    low=0.2,
                    high=3600,
                ),
                Key(
                    "nvml_accounting",
                    "flag",
                    'true: turn NVML accounting mode on (changes host state; see "NVML accounting")',
                ),
                Key(
                    "sources",
                    "choices",
                    "GPU sources sampled",
                    field="gpu_sources",
                    choices=SOURCE_NAMES,
                ),
            ),
        ),
        Section(
            "sweep",
            (
                Key(
                    "interval_s",
                    "number",
                    "reduced mode only: a /proc sweep this often",
                    field="sweep_interval_s",
                    low=0.5,
                    high=3600,
                ),
            ),
        ),
        Section(
            "status",
            (
                Key("path", "text", "the status file `gpuguard status` reads", field="status_path"),
                Key(
                    "interval_s",
                    "number",
                    "the status file is looked at this often, 5x less often while the agent is idle "
                    "(rewritten on change, else every 10th time)",
                    field="status_interval_s",
                    low=_TIMES[0],
                    high=_TIMES[1],
                ),
            ),
        ),
        Section(
            "queues",
            (
                Key(
                    "intake",
                    "whole",
                    "items waiting for the correlator",
                    field="intake_queue",
                    low=64,
                    high=10_000_000,
                ),
                Key(
                    "output",
                    "whole",
                    "log lines waiting for the writer",
                    field="output_queue",
                    low=16,
                    high=10_000_000,
                ),
            ),
        ),
        Section(
            "correlator",
            (
                Key(
                    "max_processes",
                    "whole",
                    "processes the correlator keeps state for",
                    low=16,
                    high=10_000_000,
                ),
            ),
        ),
        Section(
            "sessions",
            (
                Key(
                    "watch_score",
                    "number",
                    "a process scored at least this gets per-connection activity records "
                    "(cadence, bytes each way) like a GPU holder; 0: GPU holders only",
                    field="session_watch_score",
                    low=0,
                    high=100,
                ),
            ),
        ),
        Section(
            "kubernetes",
            (
                Key(
                    "log_root",
                    "text",
                    "the kubelet's log tree: pods/ and containers/ name namespaces, pods and "
                    "containers",
                    field="kubernetes_log_root",
                ),
                Key(
                    "containerd_root",
                    "text",
                    "containerd's running containers (OCI bundles): images and names",
                    field="containerd_root",
                ),
            ),
        ),
        Section(
            "findings",
            (
                Key(
                    "update_interval_s",
                    "number",
                    "a process finding's updates: at most one per this many seconds, each "
                    "carrying all that grew meanwhile; escalations at once (0: no limit; "
                    'docs/siem.md "Finding lifecycle")',
                    field="finding_update_interval_s",
                    low=0,
                    high=86400,
                ),
            ),
        ),
        Key(
            "response",
            "mapping",
            "enforce mode: which actions, on whom (docs/respond.md)",
            shows="{}",
            ref=RESPONSE_SCHEMA,
        ),
        Key(
            "guard_policies",
            "list",
            "per-user / per-group GPU limits (docs/respond.md)",
            shows="[]",
            ref=GUARD_POLICY_SCHEMA,
        ),
    ),
    model=AgentConfig,  # every default, declared once there
)
