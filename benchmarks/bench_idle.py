"""The agent's idle cost: its own CPU time, wake-ups and RSS with the probes attached and nothing happening (root).

    .venv/bin/python benchmarks/bench_idle.py [--seconds 600] [--warmup-s 20]
        [--commit REV] [--baseline-tree DIR | --baseline-commit REV] [--json]

One agent (a child process: :class:`~gpuguard.agent.pipeline.Agent` with the eBPF sensor, the
shipped rules, a metrics endpoint on loopback and GPU sampling on through the fake NVML
library the tests use, two idle H100s) starts, settles for ``--warmup-s``, and is then watched
for ``--seconds``:

* CPU: utime + stime of the agent process from /proc/PID/stat over the window, as a
  percentage of one core (the host's load does not enter it: it is the agent's own time),
  and per thread (named by the child: sensor, sampler, detect loop, log writer...);
* wake-ups: voluntary + involuntary context switches of all its threads per second;
* RSS (VmRSS) when the window starts and when it ends;
* state-file writes in the window (its mtime is sampled once a second).

With ``--baseline-tree`` (another checkout) or ``--baseline-commit`` (a revision of this
repository, exported to a temporary directory) a second agent from that tree runs at the
same time under the same load, so before and after come from one run.  Both agents see
the whole host: what the other jobs on a shared machine do (execs from /tmp, connects)
reaches them too, equally.  The load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def child(tree: Path, workdir: Path) -> None:
    """Run one agent from ``tree`` until SIGTERM; write its threads' names once it is ready."""
    sys.path.insert(0, str(tree))
    import threading

    from gpuguard.agent.config import AgentConfig
    from gpuguard.agent.pipeline import Agent
    from gpuguard.sources.gpu import nvml
    from tests.fakes.fake_pynvml import FakeGpu, FakeNvml

    fake = FakeNvml(
        [
            FakeGpu(),
            FakeGpu(bus_id="00000000:2A:00.0", uuid="GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c02"),
        ]
    )
    config = AgentConfig(
        sensor="ebpf",
        log_path=str(workdir / "agent.log"),
        status_path=workdir / "status.json",
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(
        config,
        stderr=lambda line: None,
        sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module)},
    )

    def recorder() -> None:
        """Names the threads once, then each second (process CPU, sensor events so far) until
        the parent asks for the series (a file ``dump``): quiet seconds are told from busy ones."""
        if not agent.ready.wait(300):
            return
        time.sleep(1.0)
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
        (workdir / "threads.json").write_text(json.dumps(names))
        series = []
        dump = workdir / "dump"
        while not dump.exists():
            series.append((time.monotonic(), time.process_time(), agent.counters.events_total()))
            time.sleep(1.0)
        (workdir / "series.json").write_text(json.dumps(series))

    threading.Thread(target=recorder, name="bench-recorder", daemon=True).start()
    sys.exit(agent.run())


def _stat(path: str) -> tuple[float, int, int]:
    """(cpu seconds, voluntary, involuntary switches) of a process or a thread."""
    with open(f"{path}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    switches = [0, 0]
    with open(f"{path}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                switches[0] = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                switches[1] = int(line.split()[1])
    return cpu, switches[0], switches[1]


def threads(pid: int) -> dict[int, tuple[float, int]]:
    """tid -> (cpu seconds, context switches) for every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            cpu, vol, invol = _stat(f"/proc/{pid}/task/{tid}")
            out[int(tid)] = (cpu, vol + invol)
    return out


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


class Watched:
    """One agent child and its figures."""

    def __init__(self, label: str, tree: Path, workdir: Path) -> None:
        self.label, self.tree, self.workdir = label, tree, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), str(workdir)],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "stderr", "wb"),
        )
        self.status_writes = 0
        self._mtime = 0.0

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.workdir / "threads.json").exists():
                return
            if self.proc.poll() is not None:
                err = (self.workdir / "stderr").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{self.label}: the agent exited ({self.proc.returncode}): {err}")
            time.sleep(0.2)
        raise SystemExit(f"{self.label}: the agent did not start in {timeout:g} s")

    def begin(self) -> None:
        pid = self.proc.pid
        self.names = {
            int(k): v for k, v in json.loads((self.workdir / "threads.json").read_text()).items()
        }
        self.cpu0, vol, invol = _stat(f"/proc/{pid}")
        self.threads0 = threads(pid)
        self.rss0 = rss_mb(pid)
        self._mtime = self._status_mtime()

    def _status_mtime(self) -> float:
        try:
            return (self.workdir / "status.json").stat().st_mtime
        except OSError:
            return 0.0

    def tick(self) -> None:
        mtime = self._status_mtime()
        if mtime != self._mtime:
            self._mtime = mtime
            self.status_writes += 1

    def quiet(self, start: float) -> tuple[int, float | None, float]:
        """(quiet seconds, CPU % of a core in them, sensor events/s over the window): a quiet
        second is one with no sensor event in it nor in the seconds either side."""
        (self.workdir / "dump").touch()
        path = self.workdir / "series.json"
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        series = [s for s in json.loads(path.read_text()) if s[0] >= start]
        steps = [
            (b[0] - a[0], b[1] - a[1], b[2] - a[2])
            for a, b in zip(series, series[1:], strict=False)
        ]
        picked = [
            steps[i]
            for i in range(1, len(steps) - 1)
            if steps[i - 1][2] == steps[i][2] == steps[i + 1][2] == 0
        ]
        span = sum(s[0] for s in steps) or 1.0
        events = sum(s[2] for s in steps) / span
        if not picked:
            return 0, None, events
        return len(picked), 100 * sum(s[1] for s in picked) / sum(s[0] for s in picked), events

    def end(self, seconds: float, start: float) -> dict:
        pid = self.proc.pid
        cpu1, _, _ = _stat(f"/proc/{pid}")
        after = threads(pid)
        quiet_s, quiet_cpu, events_per_s = self.quiet(start)
        per_thread = {}
        switches = 0
        for tid, (cpu, sw) in after.items():
            cpu_b, sw_b = self.threads0.get(tid, (0.0, 0))
            switches += sw - sw_b
            name = self.names.get(tid, f"tid {tid}")
            if tid == pid:
                name = "main (detect loop)"
            per_thread[name] = round(100 * (cpu - cpu_b) / seconds, 4)
        return {
            "label": self.label,
            "seconds": round(seconds, 1),
            "cpu_percent_of_core": round(100 * (cpu1 - self.cpu0) / seconds, 4),
            "sensor_events_per_s": round(events_per_s, 2),
            "quiet_seconds": quiet_s,
            "quiet_cpu_percent_of_core": None if quiet_cpu is None else round(quiet_cpu, 4),
            "wakeups_per_s": round(switches / seconds, 2),
            "rss_start_mb": round(self.rss0, 1),
            "rss_end_mb": round(rss_mb(pid), 1),
            "status_writes": self.status_writes,
            "threads_percent_of_core": dict(sorted(per_thread.items(), key=lambda kv: -kv[1])),
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--baseline-commit")
    parser.add_argument("--commit", help="measure this revision (exported) instead of the tree")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_idle: run as root (the agent attaches eBPF probes)")
    with tempfile.TemporaryDirectory(prefix="gg-bench-idle-") as tmp:
        base = Path(tmp)

        def export(rev: str, name: str) -> Path:
            out = base / name
            out.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
            subprocess.run(["chmod", "-R", "go-w", str(out)], check=True)  # rules: root's only
            return out

        trees = [
            (f"this tree {args.commit}", export(args.commit, "tree"))
            if args.commit
            else ("this tree", REPO)
        ]
        if args.baseline_commit:
            trees.append(
                (f"baseline {args.baseline_commit}", export(args.baseline_commit, "baseline"))
            )
        elif args.baseline_tree:
            trees.append((f"baseline {args.baseline_tree}", args.baseline_tree.resolve()))
        agents = []
        try:
            for i, (label, tree) in enumerate(trees):
                agents.append(Watched(label, tree, base / f"agent{i}"))
            for agent in agents:
                agent.wait_ready()
            time.sleep(args.warmup_s)
            load_start = loadavg()
            for agent in agents:
                agent.begin()
            start = time.monotonic()
            while time.monotonic() - start < args.seconds:
                time.sleep(1.0)
                for agent in agents:
                    agent.tick()
            elapsed = time.monotonic() - start
            results = [agent.end(elapsed, start) for agent in agents]
            load_end = loadavg()
        finally:
            for agent in agents:
                agent.stop()
    report = {"load_start": load_start, "load_end": load_end, "agents": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"idle window {elapsed:.0f} s, load average {load_start} -> {load_end}")
    head = ("CPU % core", "quiet s", "quiet CPU %", "events/s", "wakeups/s", "RSS MB", "writes")
    print(f"{'agent':<26}" + "".join(f"{h:>12}" for h in head))
    for r in results:
        quiet = r["quiet_cpu_percent_of_core"]
        cells = (
            f"{r['cpu_percent_of_core']:.3f}",
            str(r["quiet_seconds"]),
            "-" if quiet is None else f"{quiet:.3f}",
            f"{r['sensor_events_per_s']:.1f}",
            f"{r['wakeups_per_s']:.1f}",
            f"{r['rss_start_mb']:.0f}->{r['rss_end_mb']:.0f}",
            str(r["status_writes"]),
        )
        print(f"{r['label'][:26]:<26}" + "".join(f"{c:>12}" for c in cells))
        for name, pct in r["threads_percent_of_core"].items():
            if pct > 0:
                print(f"    {name:<40} {pct:.3f} %")


if __name__ == "__main__":
    main()
