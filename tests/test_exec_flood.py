"""An exec flood neither blinds nor wedges the agent: a miner started during the flood is flagged,
and SIGTERM during the flood still stops the agent (issue 20; the rates are in bench_agent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import load
from tests.support.agent_run import AgentProcess, lifecycle
from tests.support.touch_scope import scope_cgroup
from tests.support.workloads import build_c_program, build_exit0, exit0_named

EXEC_FLOOD = Path(__file__).resolve().parent / "workloads" / "exec_flood.c"
MINER_ARGS = ["-o", "stratum+tcp://pool.example.invalid:3333", "--donate-level", "1"]
RATE, FLOODERS = 2000, 2
STOP_BOUND_S = 20.0  # generous: a loaded host; the <= 2 s target is bench_agent's figure


def start_flood(rate: float, cgroup: Path, program: Path | None = None) -> subprocess.Popen:
    """exec_flood (vfork+execve of ``program``, the static exit0 by default) inside ``cgroup``
    from its first instruction."""
    argv = [str(build_c_program(EXEC_FLOOD)), str(rate), "0", str(program or build_exit0())]
    return load.start_flood(
        argv, cgroup, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def kept_in_kernel(doc: dict, cgroup_id: int) -> int:
    return doc["counters"]["execs"].get("aggregated_by_cgroup", {}).get(str(cgroup_id), 0)


@pytest.mark.root
@pytest.mark.host_mutator  # thousands of execs a second and a miner-shaped process: loads the whole host
def test_a_miner_started_during_an_exec_flood_is_flagged_and_sigterm_stops_the_agent(tmp_path):
    agent = AgentProcess(tmp_path, "--sensor", "ebpf")
    miner = None
    floods: list[subprocess.Popen] = []
    took = None
    with scope_cgroup() as (_, cgroup):
        cgroup_id = os.stat(cgroup).st_ino
        try:
            agent.wait_ready()
            # 2,000 execs/s asked, until stopped (a loaded host may do fewer)
            floods = [start_flood(RATE / FLOODERS, cgroup) for _ in range(FLOODERS)]
            agent.wait_status(lambda d: kept_in_kernel(d, cgroup_id) > 5000, 60)
            # a miner known only by its command line, through a shell; it never connects
            argv = [sys.executable, "-c", "import time; time.sleep(120)", *MINER_ARGS]
            miner = subprocess.Popen(["/bin/sh", "-c", "exec " + " ".join(map(_quote, argv))])
            doc = agent.wait_status(
                lambda d: any(f["pid"] == miner.pid for f in d.get("last_findings", [])), 30
            )
            flooding_at_finding = all(f.poll() is None for f in floods)
            sent = time.monotonic()
            agent.signal(signal.SIGTERM)
            try:
                agent.proc.wait(STOP_BOUND_S * 3)
                took = time.monotonic() - sent
            except subprocess.TimeoutExpired:
                pass
            flooding_at_stop = all(f.poll() is None for f in floods)
        finally:
            if miner is not None:
                miner.kill()
                miner.wait()
            done = 0
            for f in floods:
                f.terminate()
                done += int(f.communicate(timeout=30)[0].strip() or 0)
            agent.stop()
    (finding,) = [f for f in doc["last_findings"] if f["pid"] == miner.pid]
    assert finding["verdict"] in ("suspicious", "malicious")
    assert flooding_at_finding and flooding_at_stop
    assert kept_in_kernel(doc, cgroup_id) > 5000  # the flood stayed in the kernel
    assert done > kept_in_kernel(doc, cgroup_id)
    assert took is not None and took < STOP_BOUND_S, f"SIGTERM took {took} s under the flood"
    assert agent.proc.returncode == 0, agent.stderr()
    assert any(lifecycle("stop")(r) for r in agent.records())


@pytest.mark.root
@pytest.mark.host_mutator  # thousands of execs a second and a miner-shaped process: loads the whole host
def test_reload_and_sigterm_end_under_a_flood_of_execs_that_are_all_sent_up(tmp_path):
    """exit0 named lspci (a name the rules list): every exec goes up in full, more than the agent
    reads on this host; a reload and a stop still come through, and what was left is counted."""
    agent = AgentProcess(tmp_path, "--sensor", "ebpf")
    floods: list[subprocess.Popen] = []
    reloaded = took = None
    with scope_cgroup() as (_, cgroup):
        try:
            agent.wait_ready()
            floods = [start_flood(RATE / FLOODERS, cgroup, exit0_named("lspci")) for _ in range(2)]
            agent.wait_status(lambda d: d["counters"]["events_by_kind"].get("exec", 0) > 2000, 60)
            sent = time.monotonic()
            agent.signal(signal.SIGHUP)
            agent.wait_record(lifecycle("reload"), STOP_BOUND_S * 3)
            reloaded = time.monotonic() - sent
            sent = time.monotonic()
            agent.signal(signal.SIGTERM)
            try:
                agent.proc.wait(STOP_BOUND_S * 3)
                took = time.monotonic() - sent
            except subprocess.TimeoutExpired:
                pass
            flooding_at_stop = all(f.poll() is None for f in floods)
        finally:
            for f in floods:
                f.terminate()
                f.communicate(timeout=30)
            agent.stop()
    assert flooding_at_stop
    assert reloaded < STOP_BOUND_S, f"SIGHUP took {reloaded} s to reload under the flood"
    assert took is not None and took < STOP_BOUND_S, f"SIGTERM took {took} s under the flood"
    assert agent.proc.returncode == 0, agent.stderr()
    (stop,) = [r for r in agent.records() if lifecycle("stop")(r)]
    assert stop["gpuguard"]["detail"]["events"] > 2000
