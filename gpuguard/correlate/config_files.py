"""Miner settings hidden in config files: pull pool URLs and setting names out of their text.

The text comes from ``ProcessFacts.config_files``, filled live by
:mod:`gpuguard.sources.proc.config_files` (which does the reading, inside the
process's own filesystem view) and carried by recordings, so replay parses
the same text.  :func:`parse_config_files` turns it into pool endpoints and
key names, bounded like the reading (``MAX_FILES`` files, ``MAX_BYTES`` each).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpuguard.correlate.endpoints import MAX_ENDPOINTS, Endpoint, parse_endpoint, urls_in_text
from gpuguard.sources.proc.config_files import MAX_BYTES, MAX_FILES

_INI_LINE = re.compile(r"^\s*([A-Za-z0-9_.\-]{1,64})\s*=\s*(.{0,512}?)\s*$", re.M)
_MAX_KEYS = 64


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
