"""Agent CPU per process start, by kind of start (issue 38), with the kernel filter's share (root).

    .venv/bin/python benchmarks/bench_exec_mix.py [--windows 12] [--rate 20] [--window-s 1]
        [--kinds shell,python,...] [--baseline-tree DIR] [--json]

One eBPF agent (monitor mode, the shipped rules) runs while this script starts processes of
one kind at ``--rate`` a second, each kind in a cgroup of its own.  The kinds: a shell pipeline, ``python3 -c``,
``perl -e`` living 20 ms, ``git``, a compiled program living 5-50 ms from /usr and the same
file from /tmp, a never-seen binary from /tmp (a distinct file each start), and a shell script
that execs three children.  Kinds and idle windows alternate, round after round, so the shared
host's drift hits both alike.

Per window (``--window-s``, ``rate * window`` starts) the agent's CPU is the sum of its
threads' run time (``/proc/PID/task/*/schedstat``, ns); a kind's per-start figure is (window -
the mean idle window) / starts, reported as the median and p99 over its windows with the mean.
The mean, not the median, of the idle windows: an idle agent's periodic work comes in bunches
(its detect loop turns every 10 s), so most idle seconds hold none of it and their median is 0
while the idle rate is not; the mean is that rate. The agent batches (its ring is read every
250 ms), so a window, not a single start, is the unit. The kernel filter's share: the fraction
of the kind's execs kept in the kernel (never sent up: the agent's per-cgroup count) and the
agent's BPF programs' run time per start above idle (kernel BPF statistics, charged to the
starting processes, not to the agent). ``--baseline-tree`` runs another checkout's agent (e.g.
``git archive main``) through the same windows first, for before/after figures from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.agent_run import AgentProcess  # noqa: E402
from tests.support.workloads import build_c_program  # noqa: E402

_BPF_ENABLE_STATS = 32
SCRIPT = "#!/bin/sh\nuname >/dev/null\ndate >/dev/null\nexec cat /dev/null\n"
KINDS = ("shell", "python", "perl", "git", "c_usr", "c_tmp", "new_tmp", "script")
LABELS = {
    "shell": "shell pipeline (sh -c 'echo | tr | wc')",
    "python": "python3 -c pass",
    "perl": "perl -e, living 20 ms",
    "git": "git --version / git rev-parse",
    "c_usr": "C program 5-50 ms, /usr/local",
    "c_tmp": "same C program 5-50 ms, /tmp",
    "new_tmp": "never-seen C binary, /tmp",
    "script": "sh script execing 3 children",
}


def agent_cpu_ns(pid: int) -> int:
    """The agent's threads' run time so far (ns)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def bpf_ns(pid: int) -> int:
    """Run time (ns) the kernel counted for the BPF programs the agent holds open."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                text = f.read()
            if "prog_id:" not in text:
                continue
            for line in text.splitlines():
                if line.startswith("run_time_ns:"):
                    total += int(line.split()[1])
    return total


def enable_bpf_stats() -> int | None:
    """An fd that keeps the kernel's per-program run time counting while open (None: refused)."""
    import ctypes as ct

    libc = ct.CDLL(None, use_errno=True)
    attr = (ct.c_uint32 * 4)(0)  # BPF_STATS_RUN_TIME
    fd = libc.syscall(321, _BPF_ENABLE_STATS, ct.byref(attr), ct.sizeof(attr))
    return fd if fd >= 0 else None


class Workloads:
    """The programs each kind starts, built under /usr/local/lib and /tmp (removed at the end)."""

    def __init__(self, new_count: int) -> None:
        live = build_c_program(REPO / "benchmarks" / "live_ms.c")
        self.usr = Path(tempfile.mkdtemp(prefix="gg-exec-mix-", dir="/usr/local/lib"))
        self.tmp = Path(tempfile.mkdtemp(prefix="gg-exec-mix-", dir="/tmp"))
        self.c_usr = self.usr / "live_ms"
        self.c_tmp = self.tmp / "live_ms"
        shutil.copy(live, self.c_usr)
        shutil.copy(live, self.c_tmp)
        self.script = self.usr / "children.sh"
        self.script.write_text(SCRIPT)
        self.script.chmod(0o755)
        self.new: list[Path] = []
        body = live.read_bytes()
        for i in range(new_count):
            path = self.tmp / f"new-{i}"
            path.write_bytes(body + i.to_bytes(4, "little"))  # a distinct file, same program
            path.chmod(0o755)
            self.new.append(path)
        self.python = shutil.which("python3", path="/usr/bin") or "/usr/bin/python3"

    def argv(self, kind: str, i: int) -> list[str]:
        ms = str(5 + (i * 7) % 46)
        if kind == "shell":
            return ["/bin/sh", "-c", "echo a | tr a b | wc -c >/dev/null"]
        if kind == "python":
            return [self.python, "-c", "pass"]
        if kind == "perl":
            return ["/usr/bin/perl", "-e", "select(undef, undef, undef, 0.02)"]
        if kind == "git":
            return (
                ["/usr/bin/git", "--version"]
                if i % 2
                else ["/usr/bin/git", "-C", str(REPO), "rev-parse", "HEAD"]
            )
        if kind == "c_usr":
            return [str(self.c_usr), ms]
        if kind == "c_tmp":
            return [str(self.c_tmp), ms]
        if kind == "new_tmp":
            return [str(self.new.pop()), ms]
        if kind == "script":
            return [str(self.script)]
        raise ValueError(kind)

    def remove(self) -> None:
        shutil.rmtree(self.usr, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


class KindCgroups:
    """A cgroup per kind (and one for the idle windows): this process moves into a kind's before
    its window, so every start of it is counted there by the exec filter."""

    def __init__(self, kinds: list[str]) -> None:
        from gpuguard.respond.cgroup_blocks import cgroup2_mount, cgroup2_of

        self.mount = Path(cgroup2_mount())
        self.home = self.mount / cgroup2_of(os.getpid()).lstrip("/")
        self.paths = {k: self.mount / f"gg-bench-exec-mix-{os.getpid()}-{k}" for k in kinds}
        self.paths[None] = self.mount / f"gg-bench-exec-mix-{os.getpid()}-idle"
        for path in self.paths.values():
            path.mkdir()
        self.ids = {k: os.stat(path).st_ino for k, path in self.paths.items()}

    def enter(self, kind: str | None) -> None:
        (self.paths[kind] / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        for path in self.paths.values():
            for _ in range(50):
                with contextlib.suppress(OSError):
                    path.rmdir()
                    break
                time.sleep(0.1)


def kept_by_cgroup(agent: AgentProcess) -> dict[int, int]:
    """The exec filter's kept-in-kernel count per cgroup id (the ten busiest), from the state
    file: the kernel's counts are read at the sensor's drain (every 5 s on a host with no GPU
    process) and written at the next status check."""
    execs = agent.status().get("counters", {}).get("execs", {})
    return {int(k): int(v) for k, v in execs.get("aggregated_by_cgroup", {}).items()}


def window(agent: AgentProcess, load: Workloads, kind: str | None, args) -> tuple[int, int, int]:
    """One window: (agent CPU ns, agent BPF ns, execs started) with ``kind`` starting (None: idle)."""
    pid = agent.proc.pid
    starts = int(args.rate * args.window_s) if kind else 0
    period = 1.0 / args.rate
    cpu0, bpf0, t0 = agent_cpu_ns(pid), bpf_ns(pid), time.monotonic()
    for i in range(starts):
        subprocess.run(load.argv(kind, i), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        pause = t0 + (i + 1) * period - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    pause = t0 + args.window_s - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    return agent_cpu_ns(pid) - cpu0, bpf_ns(pid) - bpf0, starts


EXECS_PER_START = {"shell": 3, "script": 4}  # sh, tr, wc (echo is built in) / sh + 3 children


def run_agent(tree: Path | None, args) -> dict:
    """Every kind's windows on one agent (``tree``: another checkout's)."""
    load = Workloads((args.windows + 1) * int(args.rate * args.window_s) + 8)
    wrapper = ("env", "-C", str(tree)) if tree else ()
    result: dict = {"tree": str(tree or REPO), "load_start": os.getloadavg()[0], "kinds": {}}
    with tempfile.TemporaryDirectory(prefix="gg-bench-mix-") as tmp:
        agent = AgentProcess(Path(tmp), "--sensor", "ebpf", wrapper=wrapper)
        cgroups = KindCgroups(list(args.kinds))
        try:
            agent.wait_ready()
            time.sleep(5.0)
            for kind in args.kinds:  # one warm-up window each: first sights of the programs
                cgroups.enter(kind)
                window(agent, load, kind, args)
            cgroups.enter(None)
            time.sleep(8.0)  # the warm-up's counts: a drain, then a status check
            kept0 = kept_by_cgroup(agent)
            idle: list[tuple[int, int]] = []
            per: dict[str, list[tuple[int, int, int]]] = {k: [] for k in args.kinds}
            for _ in range(args.windows):
                for kind in args.kinds:
                    cgroups.enter(None)
                    cpu, bpf, _n = window(agent, load, None, args)
                    idle.append((cpu, bpf))
                    cgroups.enter(kind)
                    per[kind].append(window(agent, load, kind, args))
                    time.sleep(1.0)  # what the window sent up is handled before the next one
            cgroups.enter(None)
            time.sleep(8.0)  # the last windows' counts: a drain, then a status check
            kept1 = kept_by_cgroup(agent)
            idle_cpu = statistics.mean(c for c, _ in idle)
            idle_bpf = statistics.mean(b for _, b in idle)
            result["idle_window_us"] = {
                "mean": round(idle_cpu / 1e3, 1),
                "median": round(statistics.median(c for c, _ in idle) / 1e3, 1),
                "p99": round(_p99([c for c, _ in idle]) / 1e3, 1),
                "core_fraction": round(idle_cpu / (args.window_s * 1e9), 6),
            }
            for kind, rows in per.items():
                us = [(c - idle_cpu) / n / 1e3 for c, _, n in rows]
                bpf = [(b - idle_bpf) / n / 1e3 for _, b, n in rows]
                starts = sum(n for _, _, n in rows)
                cg = cgroups.ids[kind]
                kept = kept1.get(cg, 0) - kept0.get(cg, 0)
                result["kinds"][kind] = {
                    "starts": starts,
                    "median_us": round(statistics.median(us), 1),
                    "p99_us": round(_p99(us), 1),
                    "mean_us": round(statistics.mean(us), 1),
                    "bpf_us_per_start": round(statistics.median(bpf), 2),
                    "kept_in_kernel": round(kept / (starts * EXECS_PER_START.get(kind, 1)), 3),
                }
            counters = agent.status().get("counters", {})
            result["counters"] = counters.get("stages", {}).get("enrich", {})
            execs = counters.get("execs", {})
            result["execs"] = {k: v for k, v in execs.items() if k != "aggregated_by_cgroup"}
        finally:
            agent.stop()
            load.remove()
            cgroups.remove()
    result["load_end"] = os.getloadavg()[0]
    return result


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def print_result(result: dict, rate: float, window_s: float) -> None:
    idle = result["idle_window_us"]
    print(
        f"### {result['tree']} (load {result['load_start']:.1f} -> {result['load_end']:.1f}; "
        f"idle {idle['core_fraction'] * 100:.3f}% of a core (mean), window {window_s:g} s at {rate:g}/s; "
        f"exec filter {result.get('execs')})"
    )
    print("| kind | starts | agent µs/start median | p99 | mean | kept in kernel | BPF µs/start |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, row in result["kinds"].items():
        print(
            f"| {LABELS[kind]} | {row['starts']} | {row['median_us']:.0f} | {row['p99_us']:.0f} "
            f"| {row['mean_us']:.0f} | {row['kept_in_kernel']:.2f} | {row['bpf_us_per_start']:.1f} |"
        )
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=12, help="windows per kind")
    parser.add_argument("--rate", type=float, default=20.0, help="starts a second")
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, measured first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    stats = enable_bpf_stats()
    results = []
    try:
        if args.baseline_tree:
            results.append(run_agent(args.baseline_tree.resolve(), args))
        results.append(run_agent(None, args))
    finally:
        if stats is not None:
            os.close(stats)
    for result in results:
        if args.json:
            print(json.dumps(result))
        else:
            print_result(result, args.rate, args.window_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
