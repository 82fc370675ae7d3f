"""Agent start-up with the host's kernel headers against gpuguard's own set (run as root).

    .venv/bin/python benchmarks/bench_startup_headers.py [--rounds 5]

Each round starts ``gpuguard agent`` twice, in turn: on the host as it is (its headers), and
in a private mount namespace with empty /lib/modules and /usr/src (the bundled set, unpacked
at start).  Measured: from the process's start to its state file saying it runs (ready), the
probes' compile + load + attach as the agent counts it, and, in-process, the time to unpack
the bundled set.  Medians with min–max, and the ratio bundled / host from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.agent_run import AgentProcess  # noqa: E402
from tests.support.no_headers import without_headers  # noqa: E402

UNPACK = (
    "import time, os; from gpuguard.sources.ebpf.kernel_headers import HEADERS\n"
    "t = time.perf_counter(); s = HEADERS.use(); d = time.perf_counter() - t\n"
    "assert s.kind == 'bundled', s; HEADERS.close(); print(d)"
)


def one_start(wrapper: tuple[str, ...]) -> tuple[float, str]:
    """Seconds from the agent's process start to its state file saying it runs; its header source."""
    with tempfile.TemporaryDirectory(prefix="gg-bench-start-") as tmp:
        begun = time.monotonic()
        agent = AgentProcess(Path(tmp), "--sensor", "ebpf", wrapper=wrapper)
        try:
            doc = agent.wait_ready(timeout=120)
            ready = time.monotonic() - begun
        finally:
            agent.stop()
        return ready, (doc.get("headers") or {}).get("source", "?")


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kinds = {"host headers": (), "bundled headers": without_headers()}
    ready: dict[str, list[float]] = {k: [] for k in kinds}
    for n in range(args.rounds):
        for kind, wrapper in kinds.items():
            took, source = one_start(wrapper)
            ready[kind].append(took)
            print(f"round {n + 1}: {kind:<16} ready in {took:.2f} s (source {source})", flush=True)
    unpack = []
    for _ in range(args.rounds):
        out = subprocess.run(
            [*without_headers(), sys.executable, "-c", UNPACK],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        unpack.append(float(out.stdout))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"\nload average at the end: {load}")
    for kind in kinds:
        print(f"{kind:<16} process start -> ready: {summary(ready[kind])}")
    ratio = statistics.median(ready["bundled headers"]) / statistics.median(ready["host headers"])
    print(f"bundled / host: {ratio:.2f}x; unpacking the bundled set: {summary(unpack)[:-1]})")


if __name__ == "__main__":
    main()
