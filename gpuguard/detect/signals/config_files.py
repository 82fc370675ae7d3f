"""Rule signals of the config files a process names or keeps beside it: settings, endpoints."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import (
    endpoint_hosts,
    endpoint_ports,
    endpoint_schemes,
    parsed_config,
)
from gpuguard.sources.proc.late_evidence import deleted_config_paths


@signal(
    "config_keys",
    "texts",
    "config",
    "setting names in config files beside/named by the process, lower-case",
    reads=("facts.config_files",),
)
def config_keys(s: ProcessState, now: float) -> set[str]:
    return parsed_config(s).keys


@signal(
    "config_deleted",
    "texts",
    "config",
    "config files it named on its command line (-c/--config, a config suffix) or held open that "
    "were deleted after start; a held-open one is read through /proc/PID/fd, so the config "
    "rules see its text too",
    reads=("facts.config_files",),
)
def config_deleted(s: ProcessState, now: float) -> set[str]:
    files = s.facts.config_files if s.facts is not None else {}
    return deleted_config_paths(files or {})


@signal(
    "config_url_schemes",
    "texts",
    "config",
    "URL schemes in its config files",
    reads=("facts.config_files",),
)
def config_url_schemes(s: ProcessState, now: float) -> set[str]:
    return endpoint_schemes(parsed_config(s).endpoints)


@signal(
    "config_endpoints",
    "texts",
    "config",
    "URLs and host:port values in its config files",
    reads=("facts.config_files",),
)
def config_endpoints(s: ProcessState, now: float) -> set[str]:
    return {str(e) for e in parsed_config(s).endpoints}


@signal(
    "config_hosts",
    "texts",
    "config",
    "host names in its config files",
    reads=("facts.config_files",),
)
def config_hosts(s: ProcessState, now: float) -> set[str]:
    return endpoint_hosts(parsed_config(s).endpoints)


@signal(
    "config_ports", "numbers", "config", "ports in its config files", reads=("facts.config_files",)
)
def config_ports(s: ProcessState, now: float) -> set[int]:
    return endpoint_ports(parsed_config(s).endpoints)
