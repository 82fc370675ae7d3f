"""What several signal modules derive alike: names, the parsed command line and config files."""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.correlate.config_files import ConfigFindings, parse_config_files
from gpuguard.correlate.endpoints import Endpoint, endpoints_in_argv
from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.memo import entries_of, keep, kept

_CMDLINE_MAX = 4096
_ALGO_OPTIONS = ("-a", "--algo", "--algorithm", "-algo", "--coin")


def basename(path: str) -> str:
    """The last component of ``path`` ("" for none)."""
    return path.rstrip("/").rsplit("/", 1)[-1] if path else ""


@dataclass(slots=True)
class ParsedCmdline:
    text: str
    endpoints: list[Endpoint]
    flags: set[str]
    algorithms: set[str]


def parsed_cmdline(state: ProcessState) -> ParsedCmdline:
    """The command line's text, endpoints, option names and algorithms (kept in the memo)."""
    entries = entries_of(state)
    cached = kept(entries, state, "cmdline")
    if cached is None:
        argv = state.cmdline[:256]
        flags: set[str] = set()
        algorithms: set[str] = set()
        for i, arg in enumerate(argv):
            if arg.startswith("-") and len(arg) > 1:
                option, has_value, inline = arg.partition("=")
                flags.add(option[:64])
                if option in _ALGO_OPTIONS:
                    value = inline if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
                    if value:
                        algorithms.add(value.lower()[:64])
        cached = keep(
            entries,
            state,
            "cmdline",
            ParsedCmdline(
                " ".join(argv)[:_CMDLINE_MAX], endpoints_in_argv(argv), flags, algorithms
            ),
        )
    return cached


def parsed_config(state: ProcessState) -> ConfigFindings:
    """The endpoints and setting names of its config files (kept in the memo)."""
    entries = entries_of(state)
    cached = kept(entries, state, "config")
    if cached is None:
        files = state.facts.config_files if state.facts is not None else {}
        cached = keep(entries, state, "config", parse_config_files(files or {}))
    return cached


def named_endpoints(state: ProcessState) -> list[Endpoint]:
    """The endpoints the process named itself: on its command line and in its config files."""
    return parsed_cmdline(state).endpoints + parsed_config(state).endpoints


def endpoint_schemes(endpoints: list[Endpoint]) -> set[str]:
    return {e.scheme for e in endpoints if e.scheme}


def endpoint_hosts(endpoints: list[Endpoint]) -> set[str]:
    return {e.host for e in endpoints}


def endpoint_ports(endpoints: list[Endpoint]) -> set[int]:
    return {e.port for e in endpoints if e.port}
