"""benchmarks/device_check.sh's driver: one pass over a GPU machine, or (--dry-run) over the fakes.

Sections in order, each timed, summary.json rewritten after each (a run cut short still leaves
what it measured): environment, gpu_tests, sampler_cost, agent, workloads (miner-like, then
training-like), files.  benchmarks/README-device.md says how to read the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO)]

try:  # a machine that cannot import these still gets a summary saying so
    import environment
    from agent_watch import CheckAgent
    from recording import README
    from sampler_cost import measure
    from workloads import ALERT_NEEDS_S, Timing, judge, run_workload

    from gpuguard.commands.gpus import first_view
    from gpuguard.outputs.gpu_table import view_to_json
    from gpuguard.outputs.jsonl import dumps_line
    from gpuguard.sources.gpu import nvml
    from gpuguard.sources.gpu.registry import SOURCE_NAMES, open_samplers
    from gpuguard.sources.gpu.sampler import SourceUnavailable
except ImportError as exc:
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

FORMAT = "gpuguard-device-check/1"
BUDGET_S = 480.0  # one H100 lease: 15 minutes, minutes of start-up, room to run it twice
RESERVE_S = 25.0  # the files and the summary at the end
WORKLOADS = ("miner-like", "training-like")


def plan(name: str) -> dict:
    """The durations of a run: the GPU machine's ("device"), or the dry run's (seconds)."""
    if name == "device":
        return {
            "miner-like": Timing(90, 8, 15, 3, 15, 30, 1.0),
            "training-like": Timing(70, 8, 15, 3, 15, 30, 1.0),
            "tests_timeout_s": 180,
            "cost_samples": 40,
        }
    return {
        "miner-like": Timing(7, 2, 3, 1, 2, 2, 1 / 256),
        "training-like": Timing(6, 2, 3, 1, 2, 2, 1 / 256),
        "tests_timeout_s": 90,
        "cost_samples": 15,
    }


class Check:
    def __init__(
        self, out: Path, dry: bool, budget_s: float, sensor: str = "auto", full: bool = False
    ) -> None:
        self.out, self.dry, self.sensor = out, dry, sensor
        self.mode = "dry-run" if dry else "device"
        self.plan = plan("device" if full else self.mode)
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.work = Path(tempfile.mkdtemp(prefix="gg-devcheck-"))
        self.traces, self.logs = self.work / "device-traces", self.work / "logs"
        self.traces.mkdir()
        self.logs.mkdir()
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "check.log", "w")
        self.host = None  # the dry run's FakeGpuHost
        self.agent: CheckAgent | None = None
        self.summary: dict = {
            "format": FORMAT,
            "mode": self.mode,
            "real": {"nvml": False, "cuda": False, "sensor": None},
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "check_pid": os.getpid(),
            "budget_s": budget_s,
            "wall_s": None,
            "within_budget": None,
            "ok": None,
            "timings": "device" if full or not dry else "dry-run",
            "sections": {},
            "files": [],
        }

    # -- bookkeeping ---------------------------------------------------------------------

    def log(self, message: str) -> None:
        line = f"{time.monotonic() - self.started:7.1f}s {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save(self) -> None:
        self.summary["wall_s"] = round(time.monotonic() - self.started, 1)
        self.summary["within_budget"] = self.summary["wall_s"] <= self.summary["budget_s"]
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1, default=str) + "\n")
        tmp.replace(self.out / "summary.json")

    def left_s(self) -> float:
        return self.deadline - RESERVE_S - time.monotonic()

    def section(self, name: str, fn, needs_s: float = 0.0) -> dict:
        """Run one section; its result (or why it failed or was skipped) goes into the summary."""
        if self.left_s() < needs_s:
            result = {
                "status": "skipped",
                "reason": f"{self.left_s():.0f} s left, needs {needs_s:g}",
            }
        else:
            self.log(f"{name} ...")
            started = time.monotonic()
            try:
                result = {"status": "ok", **fn()}
            except Exception as exc:  # noqa: BLE001 - one section's fault is recorded, the rest run
                result = {
                    "status": "error",
                    "reason": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            result["wall_s"] = round(time.monotonic() - started, 1)
        self.summary["sections"][name] = result
        self.log(f"{name}: {result['status']} {result.get('reason', '')}".rstrip())
        self.save()
        return result

    def nvml_library(self):
        """The NVML module for one more user: the real pynvml, or the dry run's fake."""
        return self.host.library() if self.host is not None else nvml.load_library()

    def samplers(self) -> tuple[list, list[str]]:
        """What ``gpuguard gpus`` opens here (the dry run: the fake NVML and the real others)."""
        unavailable: list[str] = []
        if self.host is None:
            return open_samplers(SOURCE_NAMES, on_status=unavailable.append), unavailable
        others = [s for s in SOURCE_NAMES if s != "nvml"]
        samplers = open_samplers(others, on_status=unavailable.append)
        return [nvml.open_sampler(library=self.host.library()), *samplers], unavailable

    # -- sections ------------------------------------------------------------------------

    def setup(self) -> dict:
        if not self.dry:
            try:
                nvml.open_sampler(library=nvml.load_library()).close()
            except SourceUnavailable as exc:
                raise RuntimeError(
                    f"no usable NVIDIA GPU here ({exc.cause}): run it on a GPU machine, "
                    "or pass --dry-run"
                ) from None
            self.summary["real"]["nvml"] = True
            return {"stand_ins": None}
        from fake_host import FakeGpuHost

        self.host = FakeGpuHost(self.work)
        return {"stand_ins": self.host.describe()}

    def environment(self) -> dict:
        return {
            "host": environment.host(),
            "nvml": environment.nvml_facts(self.nvml_library()),
            "nvidia_smi": environment.nvidia_smi(),
            "gpu_nodes": environment.gpu_nodes(),
            "packages": environment.packages(),
            "probes": environment.probes(),
            "tests_package": environment.tests_package(),
        }

    def gpu_tests(self) -> dict:
        files = sorted(
            str(p.relative_to(REPO))
            for p in (REPO / "tests").glob("test_*.py")
            if "mark.gpu" in p.read_text()
        )
        junit = self.logs / "gpu-tests.xml"
        env = dict(os.environ, GPUGUARD_REAL_NVML="0" if self.dry else "1")
        argv = [sys.executable, "-m", "pytest", *files, "-m", "gpu", "-p", "no:cacheprovider"]
        argv += ["-p", "no:xdist", "-q", "-rfE", f"--junitxml={junit}"]
        with open(self.logs / "gpu-tests.out", "w") as out:
            run = subprocess.run(
                argv,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=self.plan["tests_timeout_s"],
                check=False,
            )
        result = {
            "nvml": "real" if not self.dry else "fake",
            "files": files,
            "exit": run.returncode,
        }
        result.update(_junit(junit))
        if run.returncode != 0 or result.get("failed") or not result.get("passed"):
            result["status"] = "failed"
        return result

    def sampler_cost(self) -> dict:
        return {"idle": measure(self.nvml_library(), self.plan["cost_samples"], 0.1)}

    def start_agent(self) -> dict:
        openers = None
        if self.host is not None:
            host = self.host
            openers = {"nvml": lambda: nvml.open_sampler(library=host.library())}
        self.agent = CheckAgent(self.work, openers, self.sensor)
        start_s = self.agent.start()
        sensor = self.agent.sensor()
        self.summary["real"]["sensor"] = sensor["mode"]
        return {
            "start_s": round(start_s, 2),
            "sensor": sensor,
            "probes_loaded": sensor["mode"] == "ebpf",
        }

    def idle_view(self) -> dict:
        samplers, unavailable = self.samplers()
        try:
            view = first_view(samplers, unavailable, "/proc")
        finally:
            for sampler in samplers:
                sampler.close()
        (self.traces / "idle.gpus.json").write_text(dumps_line(view_to_json(view)) + "\n")
        return {
            "devices": sum(len(s.devices) for s in view.snapshots),
            "unavailable": view.unavailable,
        }

    def workload(self, name: str) -> dict:
        timing = self.plan[name]
        room = self.left_s() - 20
        if room < timing.seconds:  # late: shorter, never past the budget
            timing = replace(timing, seconds=max(room, timing.steady_at_s + timing.steady_s + 2))
        busy = self.busy_cost if name == "miner-like" else None
        samplers, unavailable = self.samplers()
        try:
            run, watch = run_workload(
                name,
                timing,
                self.agent,
                (samplers, unavailable),
                self.traces,
                self.logs,
                self.host,
                busy,
            )
        finally:
            for sampler in samplers:
                sampler.close()
        result = judge(run, watch, timing.seconds)
        cuda = result["cuda"].get("cuda")
        if cuda and not self.dry and "running" in result["cuda"]:
            self.summary["real"]["cuda"] = True
        result["status"] = "ok" if result.pop("ok") else "failed"
        return result

    def busy_cost(self) -> dict:
        """The sampler's cost while the miner-like workload keeps the GPU busy."""
        return measure(self.nvml_library(), max(self.plan["cost_samples"] // 2, 10), 0.1)

    def files(self) -> dict:
        self.pack()
        return {"traces": sorted(p.name for p in self.traces.iterdir())}

    def pack(self) -> None:
        """traces.tar.gz and logs.tar.gz as they stand (again after each workload: a run cut
        short still leaves its recordings)."""
        self.agent_logs()
        origin = self.origin()
        timing = self.plan["miner-like"]
        (self.traces / "README.md").write_text(
            README.format(
                origin=origin,
                launch_s=timing.launch_s,
                steady_s=timing.steady_s,
                steady_at_s=timing.steady_at_s,
            )
        )
        made = []
        for name, folder in (("traces.tar.gz", self.traces), ("logs.tar.gz", self.logs)):
            with tarfile.open(self.out / name, "w:gz") as tar:
                tar.add(folder, arcname=folder.name)
            made.append(name)
        self.summary["files"] = ["summary.json", "check.log", *made]

    def agent_logs(self) -> None:
        for name in ("agent.log", "status.json"):
            if (self.work / name).exists():
                shutil.copy(self.work / name, self.logs / name)
        if self.agent is not None:
            (self.logs / "agent.stderr").write_text("\n".join(self.agent.stderr) + "\n")

    def origin(self) -> str:
        if self.dry:
            return (
                "DRY RUN: no GPU.  NVML was the fake pynvml playing tests/traces/h100, libcuda a "
                "stand-in that does no GPU work: none of these figures is a GPU measurement."
            )
        facts = self.summary["sections"].get("environment", {}).get("nvml", {})
        gpus = ", ".join(str(g.get("name")) for g in facts.get("gpus", []))
        return (
            f"Recorded {self.summary['started']} on {gpus or 'a GPU machine'}, driver "
            f"{facts.get('driver_version')}, kernel {os.uname().release}."
        )

    def run(self) -> int:
        try:
            setup = self.section("setup", self.setup)
            if setup["status"] != "ok":
                return self.finish()
            self.section("environment", self.environment)
            self.section("gpu_tests", self.gpu_tests, 30)
            self.section("sampler_cost", self.sampler_cost, 20)
            self.section("idle_view", self.idle_view, 5)
            agent = self.section("agent", self.start_agent, 30)
            for name in WORKLOADS:
                if agent["status"] != "ok":
                    break
                need = self.plan[name].steady_at_s + self.plan[name].steady_s + 25
                self.section(name, lambda n=name: self.workload(n), need)
                self.pack()
        finally:
            if self.agent is not None:
                self.agent.stop()
            if self.host is not None:
                self.host.close()
        return self.finish()

    def finish(self) -> int:
        self.section("files", self.files)
        sections = self.summary["sections"]
        self.summary["ok"] = all(s["status"] == "ok" for s in sections.values())
        self.summary["alert_needs_s"] = ALERT_NEEDS_S
        self.save()
        self.log(
            f"summary: {self.out / 'summary.json'} ok={self.summary['ok']} "
            f"wall={self.summary['wall_s']} s of {self.summary['budget_s']:g}"
        )
        shutil.rmtree(self.work, ignore_errors=True)
        return 0 if self.summary["ok"] else 1


def _junit(path: Path) -> dict:
    if not path.exists():
        return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failures, counts = [], {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in cases:
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            message = (bad.get("message") or "").splitlines() or [""]
            failures.append({"test": case.get("name"), "message": message[0][:300]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: the fakes and stand-ins")
    parser.add_argument(
        "--out", required=True, type=Path, help="where summary.json and the rest go"
    )
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument(
        "--sensor",
        choices=("auto", "proc"),
        default="auto",
        help="the agent's sensor (proc: the reduced mode a GPU machine without bcc gets)",
    )
    parser.add_argument(
        "--full-length",
        action="store_true",
        help="the GPU machine's durations, also in a dry run (a rehearsal: about 4 minutes)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanups (finally) still run
    if IMPORT_ERROR is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        reason = (
            f"{IMPORT_ERROR} (fix: carry its cp312 wheel in .device-wheels, as "
            "benchmarks/device_prep.sh does for the locked packages the image lacks)"
        )
        summary = {
            "format": FORMAT,
            "ok": False,
            "sections": {"setup": {"status": "error", "reason": reason}},
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"device_check: cannot start: {reason}", file=sys.stderr)
        return 1
    check = Check(args.out, args.dry_run, args.budget_s, args.sensor, args.full_length)
    return check.run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
