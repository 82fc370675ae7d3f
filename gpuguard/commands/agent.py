"""`gpuguard agent`: the daemon: sensor + samplers + /proc -> correlator -> scoring -> actions -> logs.

Wiring only: options and the config file become an :class:`AgentConfig`;
:class:`gpuguard.agent.pipeline.Agent` does the rest (docs/agent.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuguard.agent.config import LOG_FORMATS, MODES, SENSORS
from gpuguard.commands.options import add_rules_option

HELP = "run the agent: detect continuously, log findings (ECS/OCSF/CEF), respond in enforce mode"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help="agent config file (default /etc/gpuguard/agent.yaml when it exists)",
    )
    parser.add_argument(
        "--mode", choices=MODES, default=None, help="monitor (default: alerts only) or enforce"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="in enforce mode, log what would be done instead of doing it",
    )
    parser.add_argument(
        "--log",
        dest="log_path",
        default=None,
        metavar="DEST",
        help="where findings, actions and lifecycle events go: a file, - (stdout, the default), "
        "syslog, syslog:unix:PATH, syslog:udp:HOST:PORT or syslog:tcp:HOST:PORT",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help=", ".join([f"{LOG_FORMATS[0]} (default)", *LOG_FORMATS[1:-1]])
        + f" or {LOG_FORMATS[-1]}",  # outputs/records.py lists them, the default first
    )
    parser.add_argument(
        "--metrics-address", default=None, metavar="HOST:PORT", help="serve Prometheus metrics here"
    )
    parser.add_argument(
        "--web-config-file",
        dest="metrics_web_config",
        default=None,
        metavar="PATH",
        help="TLS and basic auth for the metrics port (Prometheus exporter-toolkit web config)",
    )
    parser.add_argument(
        "--sensor",
        choices=SENSORS,
        default=None,
        help="auto (default: eBPF when it works, else reduced mode), ebpf, or proc (reduced mode)",
    )
    add_rules_option(parser, "rules file instead of the default set (repeat to layer files)")
    parser.add_argument(
        "--state-file",
        dest="status_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="where the agent keeps its state for `gpuguard status` (default /run/gpuguard/status.json)",
    )


def config_from_args(args: argparse.Namespace):
    """The config file with the command-line options applied; also returns the overrides (for reloads)."""
    from gpuguard.agent.config import load_config, with_overrides

    overrides = {
        name: getattr(args, name)
        for name in (
            "mode",
            "dry_run",
            "log_path",
            "log_format",
            "metrics_address",
            "metrics_web_config",
            "sensor",
            "rules",
            "status_path",
        )
    }
    return with_overrides(load_config(args.config), **overrides), overrides


def run(args: argparse.Namespace) -> int:
    from gpuguard.agent.pipeline import Agent

    config, overrides = config_from_args(args)
    return Agent(config, config_path=args.config, overrides=overrides).run()
