"""Miner settings hidden in config files: read them safely, pull out pool URLs and keys.

A miner started as ``./x`` with ``config.json`` beside it shows nothing on its
command line.  Live, :func:`read_config_files` reads the small JSON/INI files
it names with ``-c``/``--config`` and the usual names in its working
directory into ``ProcessFacts.config_files``, each resolved inside the
process's own root or working directory (``sources.proc_files``: never a host
file, whatever symlinks or ``..`` it uses); recordings carry that field, so
replay sees the same text.  :func:`parse_config_files` turns the text into
pool endpoints and key names.  Everything is bounded: at most ``MAX_FILES``
regular files of at most ``MAX_BYTES`` each; FIFOs and devices are never read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpuguard.correlate.endpoints import MAX_ENDPOINTS, Endpoint, parse_endpoint, urls_in_text
from gpuguard.sources.proc_files import read_process_file

MAX_FILES = 4
MAX_BYTES = 65536
CONFIG_OPTIONS = ("-c", "--config", "-config", "--config-file")
CWD_CANDIDATES = ("config.json", "config.ini", "config.txt", "pools.txt")
_INI_LINE = re.compile(r"^\s*([A-Za-z0-9_.\-]{1,64})\s*=\s*(.{0,512}?)\s*$", re.M)
_MAX_KEYS = 64


def config_paths_from_argv(argv: list[str]) -> list[str]:
    """Paths named by -c/--config (``-c x``, ``--config=x``), in order."""
    paths: list[str] = []
    for i, arg in enumerate(argv[:256]):
        if arg in CONFIG_OPTIONS and i + 1 < len(argv):
            paths.append(argv[i + 1])
        else:
            for option in CONFIG_OPTIONS:
                if arg.startswith(option + "="):
                    paths.append(arg[len(option) + 1:])
    return paths


def read_config_files(pid: int, argv: list[str], proc_root: str = "/proc") -> dict[str, str]:
    """``{path as the process names it: text}`` for its likely config files (live only).

    Each path resolves inside the process's own filesystem view and can never
    lead outside it (``sources.proc_files``): a hostile process cannot make us
    read a host file.
    """
    out: dict[str, str] = {}
    for name in [*config_paths_from_argv(argv), *CWD_CANDIDATES]:
        if len(out) >= MAX_FILES or not name or name in out:
            continue
        text = read_process_file(pid, name, MAX_BYTES, proc_root)
        if text is not None:
            out[name] = text
    return out


@dataclass(slots=True)
class ConfigFindings:
    """What the config files reveal: pool endpoints and the setting names present."""

    endpoints: list[Endpoint] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


def _walk_json(value: object, findings: ConfigFindings, depth: int = 0) -> None:
    if depth > 4:
        return
    if isinstance(value, dict):
        for key, item in list(value.items())[:256]:
            if len(findings.keys) < _MAX_KEYS:
                findings.keys.add(str(key).lower()[:64])
            _walk_json(item, findings, depth + 1)
    elif isinstance(value, list):
        for item in value[:64]:
            _walk_json(item, findings, depth + 1)
    elif isinstance(value, str):
        ep = parse_endpoint(value)
        if ep and ep not in findings.endpoints and len(findings.endpoints) < MAX_ENDPOINTS:
            findings.endpoints.append(ep)


def parse_config_files(files: dict[str, str]) -> ConfigFindings:
    """Endpoints and key names from JSON (any nesting) or INI/``key=value`` text."""
    findings = ConfigFindings()
    for _, text in sorted(files.items())[:MAX_FILES]:
        text = text[:MAX_BYTES]
        try:
            _walk_json(json.loads(text), findings)
        except ValueError:
            for key, value in _INI_LINE.findall(text)[:256]:
                if len(findings.keys) < _MAX_KEYS:
                    findings.keys.add(key.lower())
                ep = parse_endpoint(value)
                if ep and ep not in findings.endpoints and len(findings.endpoints) < MAX_ENDPOINTS:
                    findings.endpoints.append(ep)
        for ep in urls_in_text(text):
            if ep not in findings.endpoints and len(findings.endpoints) < MAX_ENDPOINTS:
                findings.endpoints.append(ep)
    return findings
