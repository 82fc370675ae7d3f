"""One workload under watch: started, traced, judged.

The CUDA workload (cuda_workload.py) starts and waits; it is put in a kubelet-named pod
cgroup, tracefs and the fd reader start, then it is told to go.  Meanwhile: the recorder
writes its ``gpus`` lines, the agent's view of it is read twice a second, its launch and
steady-state ioctls are captured and decoded.  After it ends, :func:`judge` compares what the
agent said with what the workload is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent_watch import ALERTS, CheckAgent, WorkloadWatch
from peers import C10dPeer, StratumPool
from recording import GpuRecorder
from tracefs_ioctls import FdWatch, IoctlCapture, decode, fds_listing, write_trace

HERE = Path(__file__).resolve().parent
CUDA_WORKLOAD = HERE / "cuda_workload.py"
SHAPES = {"miner-like": "hash", "training-like": "train"}
CONTAINERS = {"miner-like": "hasher", "training-like": "trainer"}
# The shipped rules' GPU windows (gpu-hashing-shape, gpu-sustained-flat-load...) need 60 s of
# samples: a shorter run cannot be expected to raise them.
ALERT_NEEDS_S = 75.0


@dataclass
class Timing:
    seconds: float  # how long the workload runs
    launch_s: float  # the start-up ioctl capture: from go to this
    steady_at_s: float  # the steady capture starts here...
    steady_s: float  # ...and lasts this long
    share_s: float  # the miner's share period
    notify_s: float  # the pool's job period
    scale: float  # the training buffers' size factor


@dataclass
class Run:
    name: str
    pid: int = 0
    events: list[dict] = field(default_factory=list)
    peer_counts: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    busy_cost: dict | None = None
    pod: dict | None = None  # the pod's names, when its cgroup could be made
    notes: list[str] = field(default_factory=list)


def _read_events(proc: subprocess.Popen, run: Run) -> None:
    for line in proc.stdout:
        try:
            run.events.append(json.loads(line))
        except ValueError:
            run.notes.append(f"workload said: {line.strip()[:200]}")


def _sleep_until(deadline: float, proc: subprocess.Popen) -> None:
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)


def run_workload(
    name: str,
    timing: Timing,
    agent: CheckAgent,
    recorder_samplers: tuple[list, list[str]],
    traces: Path,
    logs: Path,
    host=None,
    busy_cost=None,
) -> tuple[Run, WorkloadWatch | None]:
    shape = SHAPES[name]
    run = Run(name)
    server = StratumPool(notify_s=timing.notify_s) if shape == "hash" else C10dPeer()
    argv = [sys.executable, str(CUDA_WORKLOAD), shape, "--seconds", f"{timing.seconds:g}"]
    argv.append("--wait-go")
    if shape == "hash":
        argv += ["--pool", f"127.0.0.1:{server.port}", "--share-s", f"{timing.share_s:g}"]
    else:
        argv += ["--peer", f"127.0.0.1:{server.port}", "--scale", f"{timing.scale:g}"]
    env = None
    if host is not None:
        argv, env = host.command(argv, shape)
    pod = watch = capture = recorder = fdwatch = None
    stderr = open(logs / f"{name}.stderr", "w")
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True
    )
    try:
        ready = json.loads(proc.stdout.readline() or "{}")
        if ready.get("event") != "ready":
            raise RuntimeError(f"the workload did not start: {ready} (see logs/{name}.stderr)")
        run.pid = ready["pid"]
        try:
            pod = agent.pod("devcheck", f"{name}-0", CONTAINERS[name])
            pod.add(run.pid)
            run.pod = pod.labels()
        except OSError as exc:
            run.notes.append(f"no pod cgroup: {exc}")
            pod = None
        fdwatch = FdWatch()
        fdwatch.watch(run.pid)
        fdwatch.start()
        capture = IoctlCapture(name)
        recorder = GpuRecorder(*recorder_samplers, traces / f"{name}.gpus.jsonl")
        recorder.start()
        capture.start()
        started = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        threading.Thread(target=_read_events, args=(proc, run), daemon=True).start()
        if host is not None:
            host.play(shape, run.pid)
        watch = WorkloadWatch(agent, run.pid, pod, started)
        watch.start()
        _sleep_until(started + timing.launch_s, proc)
        run.phases["launch"] = _phase(capture.stop(), fdwatch, run.pid, traces / f"{name}.launch")
        _sleep_until(started + timing.steady_at_s, proc)
        (traces / f"{name}.fds").write_text(fds_listing(run.pid))
        capture.start()
        _sleep_until(started + timing.steady_at_s + timing.steady_s, proc)
        run.phases["steady"] = _phase(capture.stop(), fdwatch, run.pid, traces / f"{name}.steady")
        if busy_cost is not None and proc.poll() is None:
            run.busy_cost = busy_cost()
        proc.wait(timing.seconds + 60)
        if host is not None:
            host.rest()  # NVML forgets a process that exited
        return run, watch
    finally:
        for part in (watch, recorder):
            if part is not None:
                part.stop.set()
        if watch is not None:
            watch.join(10)
        if recorder is not None:
            recorder.finish()
            if recorder.error:
                run.notes.append(f"recorder: {recorder.error}")
        if fdwatch is not None:
            fdwatch.stop.set()
        if capture is not None:
            capture.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stderr.close()
        run.peer_counts = dict(server.counts)
        if isinstance(server, StratumPool):
            run.peer_counts["methods"] = server.methods[:8]
        server.close()
        if host is not None:
            host.rest()
        if pod is not None:
            pod.close()


def _phase(lines: list[str], fdwatch: FdWatch, pid: int, stem: Path) -> dict:
    write_trace(lines, stem.with_name(stem.name + ".ioctl.gz"))
    return decode(lines, fdwatch, {pid})


def _expect(what: str, ok: bool | None, got, why: str = "") -> dict:
    out = {"what": what, "ok": ok, "got": got}
    if ok is None:
        out["not_judged"] = why
    return out


def judge(run: Run, watch: WorkloadWatch | None, seconds: float) -> dict:
    """The workload's result: what happened, and each expectation met or not (None: not judged)."""
    by_event = {}
    for event in run.events:
        by_event.setdefault(event.get("event"), event)
    report = watch.report() if watch is not None else {}
    first = report.get("first_s", {})
    series = report.get("series", {})
    alerts = [v for v in report.get("verdicts", []) if v["verdict"] in ALERTS]
    launch = run.phases.get("launch", {})
    sm = series.get("process process_gpu_sm_percent", {})
    expectations = [
        _expect("the CUDA workload ran", "running" in by_event, by_event.get("error")),
        _expect("the agent knew the process", "known" in first, first.get("known")),
        _expect(
            "NVML gave the agent its GPU use", "gpu_samples" in first, first.get("gpu_samples")
        ),
        _expect(
            "its start-up ioctls were seen on GPU files",
            launch.get("ioctls", {}).get("gpu", 0) > 0,
            launch.get("ioctls"),
        ),
        _expect("a per-process GPU series", bool(sm), sm),
        _expect(
            "a per-pod GPU series with the pod's names",
            bool(series.get("pod pod_gpu_sm_percent")) if run.pod else None,
            {"pod": run.pod, "series": series.get("pod pod_gpu_sm_percent")},
            "" if run.pod else "no pod cgroup could be made here",
        ),
    ]
    if run.name == "miner-like":
        long_enough = seconds >= ALERT_NEEDS_S
        expectations += [
            _expect(
                "an alert (suspicious or malicious) while it ran",
                bool(alerts) if long_enough else None,
                alerts[:1],
                "" if long_enough else f"ran {seconds:g} s; the GPU rules need {ALERT_NEEDS_S:g} s",
            ),
            _expect(
                "its SM series near full (>= 80 %)",
                sm.get("mean", 0) >= 80 if sm else False,
                sm.get("mean"),
            ),
            _expect(
                "shares reached the pool", run.peer_counts.get("shares", 0) >= 1, run.peer_counts
            ),
        ]
    else:
        expectations += [
            _expect("no alert", not alerts, alerts[:1]),
            _expect(
                "all-reduces reached the peer",
                run.peer_counts.get("all_reduces", 0) >= 1,
                run.peer_counts,
            ),
        ]
    judged = [e["ok"] for e in expectations if e["ok"] is not None]
    return {
        "pid": run.pid,
        "seconds": seconds,
        "ok": all(judged),
        "expectations": expectations,
        "cuda": {k: by_event.get(k) for k in ("cuda", "running", "done", "error") if k in by_event},
        "agent": report,
        "peer": run.peer_counts,
        "ioctls": run.phases,
        "sampler_cost_busy": run.busy_cost,
        "notes": run.notes,
    }
