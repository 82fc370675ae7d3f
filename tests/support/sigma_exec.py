"""Run Sigma rules over JSON log records locally: pySigma's DuckDB backend, queries on JSON lines.

The rules are converted by pySigma (``pysigma-backend-duckdb``, no processing pipeline: the
rules use the records' own ECS field names) and the SQL it produces runs in an in-memory
DuckDB over a JSON-lines file of the records.  The backend names each field as one dotted
column (``"event.dataset"``), as Elasticsearch sees an ECS document, so every record is
flattened to dotted keys first.  A field holding a list (``event.category``,
``gpuguard.gpu.device_classes``) matches in Elasticsearch when any element does; here the
record is written once per element (per combination, for several lists), and a record
matches when any of its rows does.  A field that no record has is an empty (null) column, as
in a SIEM's index.  That is exact for conditions without ``not`` (which
:func:`check_positive` asserts of the rules it is given) and for ``count(distinct ...)``
correlations, which are unaffected by repeated rows.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
from sigma.collection import SigmaCollection
from sigma.conditions import ConditionNOT
from sigma.processing.pipeline import ProcessingPipeline
from sigma.rule import SigmaRule
from sigma_backend_duckdb import DuckDBBackend

ROW_ID = "_record"  # the index of the record a row came from


def flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay lists."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def rows(record: dict[str, Any], index: int, used: set[str] | None = None) -> list[dict[str, Any]]:
    """The record's rows: one per combination of the elements of its lists of scalars that the
    query uses (``used``; None: every list).  Other lists are kept as JSON text: expanding
    them would only repeat rows (an argv of 30 words times every other list)."""
    fields = flat(record)
    lists = {
        k: v
        for k, v in fields.items()
        if isinstance(v, list) and v and not _nested(v) and (used is None or k in used)
    }
    for k, v in fields.items():
        if isinstance(v, list) and k not in lists:
            fields[k] = json.dumps(v)  # kept as text: the query does not select on these
    out = []
    for combination in itertools.product(*lists.values()) if lists else [()]:
        row = dict(fields)
        row.update(zip(lists, combination, strict=True))
        row[ROW_ID] = index
        out.append(row)
    return out


def _nested(values: list) -> bool:
    return any(isinstance(v, (dict, list)) for v in values)


def check_positive(collection: SigmaCollection) -> None:
    """Fail when a rule's condition uses ``not`` (the row expansion would not be exact)."""
    for rule in collection.rules:
        if isinstance(rule, SigmaRule):
            for condition in rule.detection.parsed_condition:
                tree = condition.parse()
                assert not _has_not(tree), f"{rule.name}: a `not` needs a different evaluation"


def _has_not(node: Any) -> bool:
    if isinstance(node, ConditionNOT):
        return True
    return any(_has_not(arg) for arg in getattr(node, "args", []) or [])


def queries(collection: SigmaCollection) -> list[str]:
    """The DuckDB SQL of every rule in ``collection`` (as pySigma converts it)."""
    check_positive(collection)
    backend = DuckDBBackend(processing_pipeline=ProcessingPipeline())
    return [str(q) for q in backend.convert(collection)]


def run(query: str, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The result rows of ``query`` over the table ``logs`` holding ``records``."""
    records = list(records)
    used = set(re.findall(r'"([^"]+)"', query))
    with tempfile.TemporaryDirectory(prefix="gg-sigma-") as tmp:
        lines = Path(tmp) / "logs.jsonl"
        with lines.open("w") as out:
            for index, record in enumerate(records):
                for row in rows(record, index, used):
                    out.write(json.dumps(row) + "\n")
        con = duckdb.connect()
        try:
            con.execute(
                "CREATE TABLE logs AS SELECT * FROM read_json(?, format='newline_delimited', "
                "union_by_name=true, sample_size=-1)",
                [str(lines)],
            )
            # A field no record has is null, as in a SIEM's index, not an unknown column.
            present = {
                row[0] for row in con.execute("SELECT column_name FROM (DESCRIBE logs)").fetchall()
            }
            for name in sorted(set(re.findall(r'"([^"]+)"', query)) - present):
                con.execute(f'ALTER TABLE logs ADD COLUMN "{name}" VARCHAR')
            cursor = con.execute(query)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
        finally:
            con.close()


def matching_records(query: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records a single-event rule's query matches (each once)."""
    hits = sorted({row[ROW_ID] for row in run(query, records)})
    return [records[i] for i in hits]
