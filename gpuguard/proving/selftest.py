"""``gpuguard selftest``: prove a deployed agent catches a miner, like an antivirus test file.

Data flow: find the running agent through its state file (or start one for
the test, with its own state file and log in a temporary directory) -> start
the harmless simulator (:mod:`gpuguard.proving.simulator`) in private
namespaces -> watch the agent's state file for a finding on the simulator's
miner (and, in enforce mode, an action that was carried out) -> stop the
simulator (and the agent it started) -> PASS or FAIL with the time from the
miner's start to the finding.

An enforce agent started for the test is confined to a cgroup made for the
simulator (:class:`~gpuguard.proving.enforce_scope.EnforceScope`: its own
cgroup, pin root and block records, no host-wide firewall sets), so on a real
host it can act on the simulator and nothing else; everything it blocked is
lifted afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard.agent.status_file import agent_alive, read_status
from gpuguard.detect.ruleset.model import ALERT_VERDICTS
from gpuguard.errors import GpuguardError
from gpuguard.proving.enforce_scope import EnforceScope
from gpuguard.proving.simulator import (
    DEFAULT_POOL_PORT,
    parse_ready,
    start_simulator,
    stop_simulator,
)
from gpuguard.respond.actions import BY_NAME as ACTIONS_BY_NAME

POLL_S = 0.02
ENFORCED = ("done", "dry-run")


@dataclass(slots=True)
class SelftestResult:
    passed: bool
    message: str
    detect_s: float | None = None
    miner_pid: int = 0
    sensor: str = ""  # the agent's: "ebpf", or "proc" in reduced mode


def _try_status(path: Path) -> dict[str, Any] | None:
    try:
        return read_status(path)
    except GpuguardError:
        return None


def running_agent(path: Path) -> dict[str, Any] | None:
    """The state document of a live agent at ``path``, else None."""
    doc = _try_status(path)
    return doc if doc is not None and agent_alive(doc)[0] else None


def wait_for_agent(
    path: Path, started_after: float, timeout: float, proc: subprocess.Popen | None = None
) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = _try_status(path)
        if doc is not None and doc.get("running") and float(doc.get("started", 0)) >= started_after:
            return doc
        if proc is not None and proc.poll() is not None:
            raise GpuguardError(
                f"the agent started for the test exited with status {proc.returncode}",
                "run `gpuguard agent` by hand to see why",
            )
        time.sleep(0.1)
    raise GpuguardError(
        f"the agent did not start within {timeout:.0f} s", "run `gpuguard agent` by hand to see why"
    )


def _finding_for(doc: dict, pid: int, start: float) -> dict | None:
    for finding in doc.get("last_findings", []):
        if (
            finding.get("pid") == pid
            and finding.get("verdict") in ALERT_VERDICTS
            and float(finding.get("time", 0)) >= start - 1
        ):
            return finding
    return None


def _action_for(doc: dict, pid: int) -> dict | None:
    for action in doc.get("last_actions", []):
        if (
            action.get("pid") == pid
            and getattr(ACTIONS_BY_NAME.get(action.get("action")), "acts", False)
            and action.get("status") in ENFORCED
        ):
            return action
    return None


def check_detection(
    state_path: Path,
    mode: str,
    timeout: float,
    pool_port: int = DEFAULT_POOL_PORT,
    cgroup: Path | None = None,
) -> SelftestResult:
    """Run the simulator once (inside ``cgroup`` if given) against the agent writing ``state_path``."""
    sim = start_simulator(pool_port=pool_port, cgroup=cgroup)
    try:
        line = sim.stdout.readline().decode("utf-8", "replace")
        try:
            ready = parse_ready(line)
        except ValueError:
            err = sim.stderr.read(2000).decode("utf-8", "replace").strip().splitlines()
            return SelftestResult(
                False, f"the simulator did not start: {err[-1] if err else line.strip()!r}"
            )
        pid, start = int(ready["pid"]), ready["start"]
        deadline = time.monotonic() + timeout
        finding = action = None
        while time.monotonic() < deadline:
            doc = _try_status(state_path) or {}
            finding = finding or _finding_for(doc, pid, start)
            if finding is not None and mode == "enforce":
                action = _action_for(doc, pid)
                if action is not None or not os.path.exists(f"/proc/{pid}"):
                    break
            elif finding is not None:
                break
            time.sleep(POLL_S)
        if finding is None:
            return SelftestResult(
                False,
                f"no finding on the miner simulator (pid {pid}) within {timeout:.0f} s",
                miner_pid=pid,
            )
        detect_s = float(finding["time"]) - start
        said = (
            f"{finding['verdict']} (score {finding['score']}; {', '.join(finding.get('rule_ids', [])[:3])}) "
            f"in {detect_s * 1000:.0f} ms"
        )
        if mode == "enforce" and action is None and os.path.exists(f"/proc/{pid}"):
            return SelftestResult(
                False,
                f"found the miner simulator {said}, but no response action was carried out",
                detect_s,
                pid,
            )
        if mode == "enforce":
            did = f"{action['action']} {action['status']}" if action else "the miner is gone"
            said += f"; response: {did}"
        return SelftestResult(True, f"found the miner simulator (pid {pid}) {said}", detect_s, pid)
    finally:
        stop_simulator(sim)


def start_agent(
    workdir: Path, mode: str, sensor: str, extra: list[str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """An agent for the test only: its own state file and log under ``workdir``."""
    state = workdir / "status.json"
    argv = [
        sys.executable,
        "-m",
        "gpuguard",
        "agent",
        "--mode",
        mode,
        "--sensor",
        sensor,
        "--state-file",
        str(state),
        "--log",
        str(workdir / "agent.log"),
        *(extra or []),
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "agent.stderr", "wb"),
        close_fds=True,
    )
    return proc, state


def stop_agent(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_selftest(
    state_path: Path,
    mode: str | None,
    timeout: float,
    sensor: str = "auto",
    own_agent: bool = False,
) -> SelftestResult:
    """The whole selftest: the running agent, or one started for it."""
    if os.geteuid() != 0:
        raise GpuguardError(
            "selftest needs root (private namespaces, GPU-named device nodes)",
            "run it as root: sudo gpuguard selftest",
        )
    doc = None if own_agent else running_agent(state_path)
    if doc is not None:
        agent_mode = doc.get("mode", "monitor")
        if mode == "enforce" and agent_mode != "enforce":
            raise GpuguardError(
                "the running agent is in monitor mode, so a response cannot be checked",
                "run `gpuguard selftest --mode monitor`, or --own-agent to start an enforce agent",
            )
        result = check_detection(state_path, mode or agent_mode, timeout)
        result.sensor = str(doc.get("sensor") or "")
        result.message = (
            f"running agent (pid {doc.get('pid')}, sensor {doc.get('sensor')}): {result.message}"
        )
        return result
    with tempfile.TemporaryDirectory(prefix="gpuguard-selftest-") as tmp:
        workdir = Path(tmp)
        scope = EnforceScope(workdir, prefix="gpuguard-selftest") if mode == "enforce" else None
        try:
            extra = ["--config", str(_scoped_config(workdir, scope))] if scope is not None else []
            begun = time.time()
            proc, own_state = start_agent(workdir, mode or "monitor", sensor, extra)
            try:
                started = wait_for_agent(own_state, begun, 60, proc)
                result = check_detection(
                    own_state,
                    mode or "monitor",
                    timeout,
                    cgroup=scope.cgroup if scope is not None else None,
                )
                where = f", acting only in cgroup {scope.scope}" if scope is not None else ""
                result.sensor = str(started.get("sensor") or "")
                result.message = f"agent started for the test (sensor {started.get('sensor')}{where}): {result.message}"
                return result
            finally:
                stop_agent(proc)
        finally:
            if scope is not None:
                scope.close()


def _scoped_config(workdir: Path, scope: EnforceScope) -> Path:
    """An agent config holding only the scope's ``response:`` section (root-only, like any agent config)."""
    path = workdir / "agent.yaml"
    path.write_text(scope.response_section())
    path.chmod(0o600)
    return path
