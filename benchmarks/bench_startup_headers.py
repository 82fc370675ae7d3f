"""Agent start-up with the host's kernel headers against gpuguard's own set, from a cold and
a warm probe cache (run as root).

    .venv/bin/python benchmarks/bench_startup_headers.py [--rounds 5]

Each round starts ``gpuguard agent`` four times, in turn: on the host as it is (its headers),
and in a private mount namespace with empty /lib/modules and /usr/src (the bundled set,
unpacked at start); each first with an empty probe cache of the round's own (bcc compiles, as
on a node's first start) and then with the cache that start left (a restart, a rollout).
Measured: from the process's start to its state file saying it runs (ready), and, in-process,
the time to unpack the bundled set.  Medians with min–max, and the ratios from the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.sources.ebpf.probe_cache import ENV as PROBE_CACHE_ENV  # noqa: E402
from tests.support.agent_run import AgentProcess  # noqa: E402
from tests.support.no_headers import without_headers  # noqa: E402

UNPACK = (
    "import time, os; from gpuguard.sources.ebpf.kernel_headers import HEADERS\n"
    "t = time.perf_counter(); s = HEADERS.use(); d = time.perf_counter() - t\n"
    "assert s.kind == 'bundled', s; HEADERS.close(); print(d)"
)


def one_start(wrapper: tuple[str, ...], cache: Path) -> tuple[float, str]:
    """Seconds from the agent's process start to its state file saying it runs; its header
    source and whether its probes came from the probe cache."""
    os.environ[PROBE_CACHE_ENV] = str(cache)  # the agent inherits it
    with tempfile.TemporaryDirectory(prefix="gg-bench-start-") as tmp:
        begun = time.monotonic()
        agent = AgentProcess(Path(tmp), "--sensor", "ebpf", wrapper=wrapper)
        try:
            doc = agent.wait_ready(timeout=120)
            ready = time.monotonic() - begun
        finally:
            agent.stop()
        headers = doc.get("headers") or {}
        cached = "probe cache" in headers.get("detail", "")
        return ready, f"{headers.get('source', '?')}{', cached' if cached else ''}"


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kinds = {"host headers": (), "bundled headers": without_headers()}
    runs = [f"{kind}, {cache}" for kind in kinds for cache in ("cold", "warm")]
    ready: dict[str, list[float]] = {run: [] for run in runs}
    for n in range(args.rounds):
        for kind, wrapper in kinds.items():
            with tempfile.TemporaryDirectory(prefix="gg-bench-probe-cache-") as cache:
                for state in ("cold", "warm"):
                    took, source = one_start(wrapper, Path(cache))
                    ready[f"{kind}, {state}"].append(took)
                    print(
                        f"round {n + 1}: {kind:<16} {state} cache: ready in {took:.2f} s "
                        f"(source {source})",
                        flush=True,
                    )
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
    for run in runs:
        print(f"{run:<24} process start -> ready: {summary(ready[run])}")

    def ratio(a: str, b: str) -> float:
        return statistics.median(ready[a]) / statistics.median(ready[b])

    print(
        f"bundled / host, cold: {ratio('bundled headers, cold', 'host headers, cold'):.2f}x; "
        f"warm / cold, bundled: {ratio('bundled headers, warm', 'bundled headers, cold'):.2f}x, "
        f"host: {ratio('host headers, warm', 'host headers, cold'):.2f}x; "
        f"unpacking the bundled set: {summary(unpack)[:-1]})"
    )


if __name__ == "__main__":
    main()
