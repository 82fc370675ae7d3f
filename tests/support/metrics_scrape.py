"""The agent's /metrics read over HTTP, and sums over its series."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """/metrics over HTTP: {(sample name, sorted labels): value}."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def series(samples: dict, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels``."""
    return sum(
        v for (n, lbl), v in samples.items() if n == name and set(labels.items()) <= set(lbl)
    )
