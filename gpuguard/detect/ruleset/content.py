"""A rule's maturity and operator content (false positives, references, runbook): checked, then built.

The collector (:mod:`gpuguard.detect.ruleset.collect`) hands each rule's fields here: every
problem is reported at its position, and an unknown key inside a reference is an error like
any other.  :func:`content_of` builds the :class:`~gpuguard.detect.ruleset.model.RuleContent`
a compiled rule carries; the records (ECS, OCSF, CEF) and the generated rules reference
render it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpuguard.config.yaml_marks import shown
from gpuguard.detect.ruleset.model import (
    DEFAULT_MATURITY,
    MATURITIES,
    Reference,
    RuleContent,
)

ATTACK_ID = re.compile(r"^T\d{4}(\.\d{3})?$")
_URL = re.compile(r"^https://[^\s\"'<>]{4,300}$")
MAX_FALSE_POSITIVES = 8
MAX_REFERENCES = 8
MAX_TEXT = 400  # characters of one false positive or a reference's title
MAX_RUNBOOK = 2000  # characters of a runbook (records carry a bounded excerpt of it)
REFERENCE_KEYS = ("attack", "url", "title")


def check_content(fields: dict[str, Any], bad: Callable[[Any, str], None]) -> None:
    """Report each problem of a rule's ``maturity`` and content fields (``fields``: key -> a field
    with ``.value``) through ``bad(field, message)``."""
    if "maturity" in fields and fields["maturity"].value not in MATURITIES:
        bad(
            fields["maturity"],
            f"maturity {shown(fields['maturity'].value)} must be one of {', '.join(MATURITIES)}",
        )
    if "false_positives" in fields:
        value = fields["false_positives"].value
        if not _texts(value, MAX_TEXT) or len(value) > MAX_FALSE_POSITIVES:
            bad(
                fields["false_positives"],
                f"false_positives must be a list of at most {MAX_FALSE_POSITIVES} texts of at "
                f"most {MAX_TEXT} characters: the benign software that shows the rule",
            )
    if "runbook" in fields:
        value = fields["runbook"].value
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_RUNBOOK:
            bad(
                fields["runbook"],
                f"runbook must be non-empty text of at most {MAX_RUNBOOK} characters",
            )
    if "references" in fields:
        value = fields["references"].value
        if not isinstance(value, list) or len(value) > MAX_REFERENCES:
            bad(
                fields["references"],
                f"references must be a list of at most {MAX_REFERENCES} ATT&CK ids (T1496), "
                "https:// links or {attack|url: ..., title: ...} maps",
            )
            return
        for entry in value:
            problem = _reference_problem(entry)
            if problem:
                bad(fields["references"], problem)


def _texts(value: Any, limit: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, str) and v.strip() and len(v) <= limit for v in value
    )


def _reference_problem(entry: Any) -> str | None:
    if isinstance(entry, str):
        if ATTACK_ID.match(entry) or _URL.match(entry):
            return None
        return f"reference {shown(entry)} is neither an ATT&CK id (T1496, T1574.006) nor an https:// link"
    if not isinstance(entry, dict):
        return f"reference {shown(entry)} must be text or a map"
    unknown = [k for k in entry if k not in REFERENCE_KEYS]
    if unknown:
        return f"unknown reference key {shown(unknown[0])} (expected {', '.join(REFERENCE_KEYS)})"
    if ("attack" in entry) == ("url" in entry):
        return "a reference map names exactly one of attack, url"
    if "attack" in entry and not (
        isinstance(entry["attack"], str) and ATTACK_ID.match(entry["attack"])
    ):
        return f"attack {shown(entry['attack'])} must be an ATT&CK technique id (T1496)"
    if "url" in entry and not (isinstance(entry["url"], str) and _URL.match(entry["url"])):
        return f"url {shown(entry['url'])} must be an https:// link"
    title = entry.get("title", "")
    if not isinstance(title, str) or len(title) > MAX_TEXT:
        return f"title must be text of at most {MAX_TEXT} characters"
    return None


def maturity_of(fields: dict[str, Any]) -> str:
    return fields["maturity"].value if "maturity" in fields else DEFAULT_MATURITY


def content_of(fields: dict[str, Any]) -> RuleContent | None:
    """The checked content fields as a :class:`RuleContent` (None when the rule has none)."""
    if not any(k in fields for k in ("false_positives", "references", "runbook")):
        return None
    references = []
    for entry in fields["references"].value if "references" in fields else ():
        if isinstance(entry, str):
            entry = {"attack": entry} if ATTACK_ID.match(entry) else {"url": entry}
        references.append(Reference(entry.get("attack"), entry.get("url"), entry.get("title", "")))
    return RuleContent(
        false_positives=tuple(
            v.strip()
            for v in (fields["false_positives"].value if "false_positives" in fields else ())
        ),
        references=tuple(references),
        runbook=fields["runbook"].value.strip() if "runbook" in fields else "",
    )
