"""Detection benchmarks: replay throughput, rule evaluation per update, YARA first vs cached scan.

Run on one core (the script pins itself with sched_setaffinity when it can):

    .venv/bin/python benchmarks/bench_detect.py [--events 1000000] [--processes 2000]

1. **Replay**: a synthetic recording (ProcessFacts first, then GPU opens,
   ioctl counts, connects, payloads and a GPU snapshot per second of event
   time) is replayed three ways: plain ``iter_recording`` (the decode
   baseline), decode + correlate, and decode + correlate + score with the
   shipped rules (dirty processes rescored once per second of event time, as
   a live agent does).  Reported as events/s and as a ratio to the baseline.
2. **Rule evaluation**: ``score_process`` with the shipped rules on a miner
   state and on a benign training state (every signal available), µs/call:
   a GPU-sample update, an update after a new connection, and an evaluation
   with nothing kept on the state (first sight or new facts); and the engine's
   look at a process whose GPU windows moved (the answers of every rule's
   GPU-window tests, ``RuleSet.gpu_sample_tests``), which decides whether a
   GPU sample rescores it.
3. **YARA**: scan a 5 MB executable-like file with the shipped YARA rules:
   first scan vs the cached second scan (same executable identity).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.correlate.correlator import Correlator  # noqa: E402
from gpuguard.correlate.state import ProcessKey, ProcessState  # noqa: E402
from gpuguard.detect.ruleset.load import load_ruleset  # noqa: E402
from gpuguard.detect.ruleset.shipped import shipped_rules_file  # noqa: E402
from gpuguard.detect.scoring.engine import DetectionEngine, rescore_policy  # noqa: E402
from gpuguard.detect.scoring.score import score_process  # noqa: E402
from gpuguard.detect.signals.memo import forget  # noqa: E402
from gpuguard.detect.signals.reader import SignalReader  # noqa: E402
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage  # noqa: E402
from gpuguard.events.model import Connect, GpuIoctl, GpuOpen, NetPayload  # noqa: E402
from gpuguard.events.process_facts import Ancestor, ProcessFacts  # noqa: E402
from gpuguard.events.wire import iter_recording  # noqa: E402
from gpuguard.events.wire_write import RecordingWriter  # noqa: E402

T0 = 1_700_000_000.0
# CPU time of this process, not wall time: the development VM is shared (other benchmarks and
# test suites run beside this one), and waiting for the CPU is not a cost of the code measured.
clock = time.process_time
IOCTLS = [
    ("nvidia-ctl", 0xC020462A),
    ("nvidia-ctl", 0xC030462B),
    ("nvidia-ctl", 0xC038464E),
    ("nvidia-uvm", 27),
    ("nvidia-uvm", 33),
    ("kfd", 0xC0584B02),
    ("drm-render", 0xC0186444),
]


def write_recording(path: Path, events: int, processes: int) -> int:
    """A mixed stream of ``events`` events over ``processes`` processes; returns items written."""
    rng = random.Random(1)
    items = 0
    with RecordingWriter(
        path, meta={"synthetic": True, "benchmark": "bench_detect"}, overwrite=True
    ) as writer:
        for pid in range(1000, 1000 + processes):
            miner = pid % 50 == 0
            exe = "/dev/shm/.x" if miner else "/usr/bin/python3.11"
            cmd = ["[kworker/0:1]"] if miner else ["python3", "train.py", "--epochs", "10"]
            writer.write(
                ProcessFacts(
                    pid=pid,
                    start_time=T0,
                    comm="kworker/0:1" if miner else "python3",
                    exe=exe,
                    cmdline=cmd,
                    uid=1000,
                    username="bob",
                    exe_deleted=miner,
                    ancestors=[Ancestor(900, "bash", "/usr/bin/bash")],
                )
            )
            items += 1
        per_second = max(1, events // 600)  # ten minutes of event time
        written = 0
        t = T0
        while written < events:
            for _ in range(per_second):
                pid = 1000 + rng.randrange(processes)
                roll = rng.random()
                if roll < 0.70:
                    dc, cmd = IOCTLS[rng.randrange(len(IOCTLS))]
                    item = GpuIoctl(
                        time=t, pid=pid, device_class=dc, command=cmd, count=rng.randint(1, 50)
                    )
                elif roll < 0.85:
                    # Real processes reconnect to a few peers (a pool, a store, a rendezvous).
                    item = Connect(
                        time=t,
                        pid=pid,
                        family="ipv4",
                        address=f"10.0.{pid % 250}.{rng.randrange(4)}",
                        port=rng.choice((443, 3333, 29500, 6379)),
                    )
                elif roll < 0.95:
                    item = GpuOpen(
                        time=t, pid=pid, path="/dev/nvidia-uvm", device_class="nvidia-uvm", fd=5
                    )
                else:
                    item = NetPayload(
                        time=t, pid=pid, fd=7, protocol="tls", detail={"sni": "huggingface.co"}
                    )
                writer.write(item)
                written += 1
                if written >= events:
                    break
            usage = [
                ProcessGpuUsage(
                    pid=p,
                    vendor="nvidia",
                    device_index=p % 8,
                    sm_util=95.0 + rng.random(),
                    used_memory=10 << 30,
                )
                for p in range(1000, 1000 + min(processes, 64))
            ]
            writer.write(
                GpuSnapshot(
                    time=t,
                    source="replay",
                    devices=[DeviceSample("nvidia", i, memory_total=80 << 30) for i in range(8)],
                    processes=usage,
                )
            )
            t += 1.0
        items += written
    return items


def bench_replay(path: Path, ruleset, rounds: int = 3) -> dict[str, float]:
    def timed(fn) -> tuple[float, int]:
        start = clock()
        count = fn()
        return clock() - start, count

    def baseline() -> int:
        n = 0
        for _ in iter_recording(path):
            n += 1
        return n

    def correlate_only() -> int:
        c = Correlator(rescore_policy(ruleset), facts_provider=None)
        n = 0
        for item in iter_recording(path):
            c.feed(item)
            n += 1
        return n

    scored = {"verdicts": 0}

    def correlate_and_score() -> int:
        c = Correlator(facts_provider=None)
        engine = DetectionEngine(c, ruleset)
        n = 0
        next_score = None
        for item in iter_recording(path):
            c.feed(item)
            n += 1
            t = getattr(item, "time", None)
            if t is not None:
                if next_score is None:
                    next_score = t + 1.0
                elif t >= next_score:
                    scored["verdicts"] += len(engine.score(t))
                    next_score = t + 1.0
        scored["verdicts"] += len(engine.score(next_score or T0))
        return n

    # Interleaved rounds, best of each: the VM's neighbours slow single runs by up to 30 % (even in CPU time).
    base_s = corr_s = full_s = float("inf")
    for _ in range(rounds):
        elapsed, n = timed(baseline)
        base_s = min(base_s, elapsed)
        corr_s = min(corr_s, timed(correlate_only)[0])
        scored["verdicts"] = 0
        full_s = min(full_s, timed(correlate_and_score)[0])
    return {
        "items": n,
        "baseline_s": base_s,
        "correlate_s": corr_s,
        "full_s": full_s,
        "baseline_eps": n / base_s,
        "correlate_eps": n / corr_s,
        "full_eps": n / full_s,
        "ratio": full_s / base_s,
        "verdicts": scored["verdicts"],
        "rounds": rounds,
    }


def rich_state(miner: bool) -> ProcessState:
    exe = "/dev/shm/.x" if miner else "/usr/bin/python3.11"
    cmd = (
        ["./x", "-o", "stratum+tcp://pool.supportxmr.com:3333", "--donate-level=1", "-a", "rx/0"]
        if miner
        else ["python3", "train.py", "--config", "c.yaml", "--batch-size", "256"]
    )
    state = ProcessState(ProcessKey(4242, T0), first_seen=T0, last_seen=T0)
    state.set_facts(
        ProcessFacts(
            pid=4242,
            start_time=T0,
            comm="kworker/0:1" if miner else "python3",
            exe=exe,
            cmdline=cmd,
            uid=1000,
            username="bob",
            exe_deleted=miner,
            environ_readable=True,
            ancestors=[
                Ancestor(900, "bash", "/usr/bin/bash"),
                Ancestor(1, "systemd", "/sbin/init"),
            ],
            config_files={"config.json": '{"pools": [{"url": "gulf.moneroocean.stream:10128"}]}'}
            if miner
            else {},
        )
    )
    state.gpu_device_classes.update({"nvidia", "nvidia-ctl", "nvidia-uvm"})
    for i in range(60):
        state.add_gpu_sample(
            T0 + 5 * i, 96.0 + (i % 3) * 0.5 if miner else (95.0 if i % 8 else 20.0), 10 << 30
        )
        state.add_ioctl(T0 + 5 * i, "NV_ESC_RM_CONTROL", "query", 10)
    state.add_connection("1.2.3.4", 3333 if miner else 443)
    state.add_payload(T0 + 1, "tls", {"sni": "pool.supportxmr.com" if miner else "huggingface.co"})
    state.gpu_memory_total = 16 << 30
    return state


def bench_rule_eval(ruleset, iterations: int) -> dict[str, float]:
    out = {}
    for name, miner in (("miner", True), ("benign", False)):
        state = rich_state(miner)
        score_process(state, ruleset, T0 + 300)  # warm what detect keeps for the state
        start = clock()
        for _ in range(iterations):
            state.dirty = True
            verdict = score_process(state, ruleset, T0 + 300)
        out[f"{name}_us"] = (clock() - start) / iterations * 1e6
        out[f"{name}_score"] = verdict.score
    # An update that invalidates the derived caches (a new connection) costs a re-parse too.
    state = rich_state(True)
    start = clock()
    for i in range(iterations):
        state.add_connection("5.6.7.8", 10000 + (i % 50))
        score_process(state, ruleset, T0 + 300)
    out["miner_after_new_connection_us"] = (clock() - start) / iterations * 1e6
    # The worst case: nothing kept on the state (first sight of a process, or new facts after exec).
    state = rich_state(True)
    start = clock()
    for _ in range(iterations):
        forget(state)
        score_process(state, ruleset, T0 + 300)
    out["miner_nothing_kept_us"] = (clock() - start) / iterations * 1e6
    # First sight of a process like one scored before in the same pass (a worker among many
    # started alike: the engine shares the outcomes of processes with equal inputs in a pass).
    alike: dict = {}
    start = clock()
    for _ in range(iterations):
        forget(state)
        score_process(state, ruleset, T0 + 300, None, alike)
    out["miner_alike_us"] = (clock() - start) / iterations * 1e6
    # The engine's look after a GPU sample: every GPU-window test of every rule, no short-cut.
    tests = getattr(
        ruleset, "gpu_sample_tests", ()
    )  # () in code before the GPU look (for comparisons)
    for name, miner in (("miner", True), ("benign", False)):
        state = rich_state(miner)
        start = clock()
        for _ in range(iterations):
            reader = SignalReader(state, T0 + 300)
            for test in tests:
                test(reader)
        out[f"{name}_gpu_look_us"] = (clock() - start) / iterations * 1e6
    out["gpu_tests"] = len(tests)
    return out


def bench_yara(ruleset) -> dict[str, float]:
    scanner = ruleset.yara_scanner()
    rng = random.Random(2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fake-miner"
        body = bytearray(rng.randbytes(5 * 1024 * 1024))
        for offset, text in (
            (1_000_000, b"XMRig/%s libuv/%s"),
            (3_000_000, b"donate.v2.xmrig.com"),
        ):
            body[offset : offset + len(text)] = text
        path.write_bytes(b"\x7fELF" + bytes(body))
        st = os.stat(path)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        start = time.perf_counter()
        first = scanner.scan_file(str(path), identity)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        second = scanner.scan_file(str(path), identity)
        second_s = time.perf_counter() - start
    assert first.rules == second.rules == ("xmrig_strings",), first
    return {
        "size_mb": 5.0,
        "first_ms": first_s * 1e3,
        "cached_ms": second_s * 1e3,
        "ratio": first_s / second_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument(
        "--rounds", type=int, default=3, help="replay rounds; the best of each variant is shown"
    )
    args = parser.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass
    ruleset = load_ruleset([shipped_rules_file()])
    print(
        f"python {sys.version.split()[0]}, {len(ruleset.rules)} rules, cpu affinity {sorted(os.sched_getaffinity(0))}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.ggrec"
        write_recording(path, args.events, args.processes)
        r = bench_replay(path, ruleset, args.rounds)
    print(
        f"replay: {r['items']} items ({args.processes} processes), best of {r['rounds']} interleaved rounds"
    )
    print(
        f"  decode only (baseline)        {r['baseline_eps']:>10,.0f} items/s  {r['baseline_s']:.2f} s"
    )
    print(
        f"  decode + correlate            {r['correlate_eps']:>10,.0f} items/s  {r['correlate_s']:.2f} s"
    )
    print(
        f"  decode + correlate + score    {r['full_eps']:>10,.0f} items/s  {r['full_s']:.2f} s  "
        f"({r['ratio']:.2f}x the baseline time, {r['verdicts']} verdicts)"
    )
    e = bench_rule_eval(ruleset, args.iterations)
    print(
        f"rule evaluation (score_process, {len(ruleset.rules)} rules): miner {e['miner_us']:.1f} us "
        f"(score {e['miner_score']}), benign {e['benign_us']:.1f} us (score {e['benign_score']}), "
        f"after a new connection {e['miner_after_new_connection_us']:.1f} us, "
        f"with nothing kept (first sight, new facts) {e['miner_nothing_kept_us']:.1f} us, "
        f"first sight of a process like one scored before {e['miner_alike_us']:.1f} us"
    )
    print(
        f"GPU look ({e['gpu_tests']} GPU-window tests, decides whether a GPU sample rescores): "
        f"miner {e['miner_gpu_look_us']:.1f} us, benign {e['benign_gpu_look_us']:.1f} us"
    )
    y = bench_yara(ruleset)
    print(
        f"yara 5 MB executable: first scan {y['first_ms']:.1f} ms, cached {y['cached_ms']:.3f} ms "
        f"({y['ratio']:,.0f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
