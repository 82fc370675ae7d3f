"""Rule signals of the command line: its text, options, algorithms and the endpoints it names."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import (
    endpoint_hosts,
    endpoint_ports,
    endpoint_schemes,
    parsed_cmdline,
)


@signal(
    "cmdline",
    "text",
    "cmdline",
    "command line, arguments joined by spaces (first 4096 characters)",
    reads=("cmdline",),
)
def cmdline(s: ProcessState, now: float) -> str | None:
    return parsed_cmdline(s).text or None


@signal(
    "cmdline_flags",
    "texts",
    "cmdline",
    "option names on the command line (--donate-level=1 gives --donate-level)",
    reads=("cmdline",),
)
def cmdline_flags(s: ProcessState, now: float) -> set[str]:
    return parsed_cmdline(s).flags


@signal(
    "cmdline_algorithm",
    "texts",
    "cmdline",
    "values of -a/--algo/--algorithm/--coin, lower-case",
    reads=("cmdline",),
)
def cmdline_algorithm(s: ProcessState, now: float) -> set[str]:
    return parsed_cmdline(s).algorithms


@signal(
    "cmdline_url_schemes",
    "texts",
    "cmdline",
    "URL schemes on the command line (stratum+tcp...)",
    reads=("cmdline",),
)
def cmdline_url_schemes(s: ProcessState, now: float) -> set[str]:
    return endpoint_schemes(parsed_cmdline(s).endpoints)


@signal(
    "cmdline_endpoints",
    "texts",
    "cmdline",
    "URLs and pool-option host:port values on the command line",
    reads=("cmdline",),
)
def cmdline_endpoints(s: ProcessState, now: float) -> set[str]:
    return {str(e) for e in parsed_cmdline(s).endpoints}


@signal(
    "cmdline_hosts",
    "texts",
    "cmdline",
    "host names/addresses in command-line URLs and pool options",
    reads=("cmdline",),
)
def cmdline_hosts(s: ProcessState, now: float) -> set[str]:
    return endpoint_hosts(parsed_cmdline(s).endpoints)


@signal(
    "cmdline_ports",
    "numbers",
    "cmdline",
    "ports in command-line URLs and pool options",
    reads=("cmdline",),
)
def cmdline_ports(s: ProcessState, now: float) -> set[int]:
    return endpoint_ports(parsed_cmdline(s).endpoints)
