"""GPU behaviour windows: cost of one per-process update, and of reading the profile.

    .venv/bin/python benchmarks/bench_behaviour.py [--updates 200000]

Measured in the same run (pinned to one core when possible):

* **baseline**: ``ProcessState.add_gpu_sample`` with only the SM and memory
  windows the state had before behaviour fingerprints (``SampleWindow.add`` x2);
* **update**: the full ``add_gpu_sample`` with the device sample of a sole user
  (memory controller, power and PCIe windows, allocation stability, duty cycle);
* **profile**: ``gpu_behaviour.profile`` on a full 5-minute window (what a rule
  evaluation pays when it reads ``gpu_profile``: at the engine's look at a process
  whose GPU windows moved, every 5 s per GPU process, and at a rescore).

Target (issue 13): an update costs <= 10 µs.  The figures are printed as µs and
as a ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.correlate.gpu_behaviour import profile  # noqa: E402
from gpuguard.correlate.state import ProcessKey, ProcessState  # noqa: E402
from gpuguard.events.gpu_snapshot import DeviceSample  # noqa: E402

T0 = 1_795_305_600.0
TARGET_US = 10.0


def _pin() -> None:
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    except (AttributeError, OSError):
        pass


def _per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=200_000)
    args = parser.parse_args()
    _pin()
    device = DeviceSample(
        "nvidia", 0, mem_util=0.0, power_w=395.0, pcie_tx_kbs=1500, pcie_rx_kbs=1400
    )

    def baseline(n: int) -> None:
        state = ProcessState(ProcessKey(1, T0))
        util, memory = state.gpu_util.add, state.gpu_memory.add
        for i in range(n):
            t = T0 + i
            util(t, 99.0)
            memory(t, 545259520.0)

    def update(n: int) -> None:
        state = ProcessState(ProcessKey(1, T0))
        add = state.add_gpu_sample
        for i in range(n):
            add(T0 + i, 99.0, 545259520, 0.0, device, False)

    state = ProcessState(ProcessKey(1, T0))
    for i in range(600):
        state.add_gpu_sample(T0 + i, 99.0 - (i % 3), 545259520, 0.0, device, False)

    def read_profile(n: int) -> None:
        for _ in range(n):
            profile(state.gpu_util, state.gpu_behaviour)

    base_us = _per_call_us(baseline, args.updates)
    update_us = _per_call_us(update, args.updates)
    profile_us = _per_call_us(read_profile, max(1000, args.updates // 100))
    print(f"baseline (SM + memory windows only): {base_us:6.2f} µs/update")
    print(
        f"behaviour update (all windows):      {update_us:6.2f} µs/update  ({update_us / base_us:.2f}x baseline)"
    )
    print(
        f"profile on a full window:            {profile_us:6.2f} µs/read    ({profile_us / base_us:.2f}x baseline)"
    )
    verdict = "OK" if update_us <= TARGET_US else "OVER"
    print(f"target <= {TARGET_US:g} µs per update: {verdict}")
    return 0 if update_us <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
