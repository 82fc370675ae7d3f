"""The gpuguard CLI run from this checkout for tests: one command, or a recorder left running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.unprivileged import as_nobody

REPO = Path(__file__).resolve().parents[2]


GPUGUARD = [sys.executable, "-m", "gpuguard"]


def gpuguard(*args: str, nobody: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``gpuguard ARGS`` from the checkout, as root or (``nobody``) as nobody."""
    cmd = [*GPUGUARD, *args]
    if nobody:
        cmd = [*as_nobody(), *cmd]
    kwargs.setdefault("timeout", 60)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kwargs)


def start_recorder(output, *options: str) -> subprocess.Popen:
    """Start `gpuguard record` and return once its probes are attached."""
    recorder = subprocess.Popen(
        [*GPUGUARD, "record", "--output", str(output), *options],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in recorder.stderr:
        if "recording to" in line:
            break
    return recorder
