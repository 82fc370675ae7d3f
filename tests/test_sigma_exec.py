"""tests/support/sigma_exec.py: Sigma rules run by pySigma's DuckDB backend over JSON records."""

from __future__ import annotations

import pytest
from sigma.collection import SigmaCollection

from tests.support import sigma_exec

RULE = """\
title: t
id: 7d6c1a53-3f36-4c59-9b2e-8a1f0c2d4e5f
logsource: {product: gpuguard}
detection:
  selection:
    event.kind: alert
    gpuguard.gpu.device_classes: [nvidia, kfd]
    event.category: network
  condition: selection
"""


def alert(classes, categories, kind="alert"):
    return {
        "event": {"kind": kind, "category": categories},
        "gpuguard": {"gpu": {"device_classes": classes}, "evidence": [{"rule": "x"}]},
    }


def test_a_list_field_matches_when_any_element_does_as_in_elasticsearch():
    (query,) = sigma_exec.queries(SigmaCollection.from_yaml(RULE))
    records = [
        alert(["drm-render", "kfd"], ["process", "network"]),  # both lists hit on one element
        alert(["drm-render"], ["process", "network"]),  # no GPU class named by the rule
        alert(["nvidia"], ["process"]),  # no network category
        alert(["nvidia"], ["network"], kind="event"),  # not an alert
        {"event": {"kind": "alert"}},  # neither field: null, not an error
    ]
    assert sigma_exec.matching_records(query, records) == [records[0]]


def test_a_field_no_record_has_is_null_not_an_error():
    rule = RULE.replace("event.category: network", "destination.ip|exists: true")
    (query,) = sigma_exec.queries(SigmaCollection.from_yaml(rule))
    assert sigma_exec.matching_records(query, [alert(["nvidia"], ["network"])]) == []


def test_a_rule_with_not_is_refused():
    rule = RULE.replace("condition: selection", "condition: not selection")
    with pytest.raises(AssertionError, match="`not`"):
        sigma_exec.queries(SigmaCollection.from_yaml(rule))
