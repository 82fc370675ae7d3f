"""Detect's memo set aside for a while: tests compare the kept path with a fresh evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals import memo


@contextmanager
def set_aside(state: ProcessState) -> Iterator[None]:
    """Evaluate as if nothing were kept for ``state``, then put the kept entries back."""
    saved = memo._MEMO.get(state)
    memo.forget(state)
    try:
        yield
    finally:
        memo.forget(state)  # what the evaluation inside kept goes
        if saved is not None:
            memo._MEMO[state] = saved
