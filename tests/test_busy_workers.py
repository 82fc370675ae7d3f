"""Busy workers beside real Debian servers stay below suspicious in `scan` and in an enforcing
agent; a RandomX stand-in beside them is convicted and killed.

Six benign workers (tests/support/busy_workers.py) run as nobody, each keeping a core busy
with compression, hashing or numeric code (three in Python, three in C) and holding one quiet
session to memcached, beanstalkd, redis-server or PostgreSQL; memcached's and beanstalkd's
default ports lie in the pool-port range, so three of them show the three generic facts that
used to add up to 45 (a quiet session, a pool-like port, a thread that never sleeps).  Beside
them, the string-free RandomX stand-in runs as nobody over TLS without SNI.  Time is a rules
parameter here (tests/support/short_windows.py): the rules' two-minute windows become 20 s,
and the servers hand out jobs every 2-8 s, so a minute shows what the five-minute soak
(benchmarks/bench_precision.py) shows.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuguard.agent.config import load_config
from gpuguard.agent.pipeline import Agent
from gpuguard.proving.enforce_scope import EnforceScope
from tests.support.agent_run import actions_on, agent_running, finding_for, log_records, until
from tests.support.busy_workers import (
    CORPUS,
    IN_POOL_RANGE,
    Servers,
    remove_installed,
    start_worker,
)
from tests.support.load import own_cpu_group
from tests.support.randomx import INSTALL_DIR, LoopbackPool, start_standin, stop
from tests.support.scan import findings_for_pid, scan_json
from tests.support.short_windows import short_window_rules

WARM_S = 35.0  # the workers' age before the scan: past the short windows (20 s)
AGENT_WATCH_S = 40.0  # the agent watches the workers at least this long (2 short windows)
AGENT_WATCH_MAX_S = 90.0  # and on, to this, until the generic facts have added up where expected
STANDIN_DEADLINE_S = 150.0

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]


def _join(cgroup: Path, pid: int) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


@pytest.fixture(scope="module")
def corpus():
    """Servers, workers and the stand-in (all in one enforce scope), and one scan of them."""
    with tempfile.TemporaryDirectory(prefix="gg-busy-") as tmp:
        workdir = Path(tmp)
        rules = short_window_rules(workdir)
        pool = LoopbackPool(workdir, tls=True, push_s=(10, 40))
        workers: dict[str, subprocess.Popen] = {}
        standin = None

        def stop_all() -> None:  # before the scope goes: it cannot be removed while they run
            for proc in workers.values():
                stop(proc)
            stop(standin)

        try:
            with (
                Servers(push_s=(2, 8)) as servers,
                EnforceScope(workdir) as scope,
                own_cpu_group(tasks=0.25) as standin_cpu,
                contextlib.ExitStack() as ending,
            ):
                ending.callback(stop_all)
                for worker in CORPUS:
                    workers[worker.name] = start_worker(worker, servers, heartbeat_s=5)
                    _join(scope.cgroup, workers[worker.name].pid)
                # in a cpu group of its own, of the load group's weight: inside the load group,
                # beside the workers and the other host tests' hogs, it was once starved past
                # any verdict; at an ordinary weight its two threads took two tasks' share of
                # the run for a minute
                standin = start_standin(pool, "metricsd", user="nobody", submit_s=15)
                if standin_cpu is not None:
                    standin_cpu.write_text(str(standin.pid))
                _join(scope.cgroup, standin.pid)
                time.sleep(WARM_S)
                code, doc, _ = scan_json("--no-yara", *(a for r in rules for a in ("--rules", r)))
                yield {
                    "workdir": workdir,
                    "rules": rules,
                    "scope": scope,
                    "servers": servers,
                    "workers": workers,
                    "standin": standin,
                    "scan": (code, doc),
                }
        finally:
            stop_all()
            pool.close()
            remove_installed()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)


def _scan_finding(doc: dict, pid: int) -> dict | None:
    found = findings_for_pid(doc, pid)
    return found[0]["gpuguard"] if found else None


def test_scan_keeps_every_busy_worker_below_suspicious_and_convicts_the_standin(corpus):
    code, doc = corpus["scan"]
    assert code == 1  # the stand-in
    standin = _scan_finding(doc, corpus["standin"].pid)
    assert standin is not None and standin["verdict"] == "malicious", standin
    assert "cpu-fpu-rounding-random" in standin["rule_ids"] and not standin["score_capped"]
    capped = []
    for worker in CORPUS:
        finding = _scan_finding(doc, corpus["workers"][worker.name].pid)
        if finding is None:
            assert worker.server not in IN_POOL_RANGE, worker  # nothing matched at all
            continue
        assert finding["verdict"] == "clean" and finding["score"] < 40, (worker, finding)
        if finding["score_capped"]:
            capped.append(worker.name)
            # only generic rules, and the record names them
            cap = finding["score_cap"]
            assert cap["uncapped_score"] >= 40 and cap["limit"] == 39, finding
            for rule in finding["rule_ids"]:
                assert rule in cap["reason"], finding
    # the three workers on memcached's and beanstalkd's default ports showed the three generic
    # facts (20 + 15 + 10 = 45): the cap, not an absent fact, is what kept them clean
    expected = {w.name for w in CORPUS if w.server in IN_POOL_RANGE}
    assert set(capped) == expected, (capped, doc["findings"])


def test_an_enforcing_agent_leaves_every_busy_worker_alone_and_kills_the_standin(corpus):
    workdir, scope = corpus["workdir"], corpus["scope"]
    log = workdir / "agent.log"
    config = workdir / "agent.yaml"
    config.write_text(
        f"mode: enforce\nsensor: ebpf\nrules: {corpus['rules']}\n"
        f"log: {{path: {log}}}\nstatus: {{path: {workdir / 'status.json'}}}\n"
        "sampling: {sources: []}\n"
        + scope.response_section()
        + "  actions: {clean: [], suspicious: [kill, block-egress], malicious: [kill, block-egress]}\n"
    )
    config.chmod(0o600)
    agent = Agent(load_config(config), install_signals=False, stderr=lambda line: None)
    workers = {name: proc for name, proc in corpus["workers"].items()}
    standin = corpus["standin"]
    seen: dict[str, int] = {name: 0 for name in workers}  # the highest uncapped score seen
    worst: dict[str, str] = {name: "clean" for name in workers}

    def look() -> None:
        for name, proc in workers.items():
            state = agent.correlator.state_of(proc.pid) if agent.correlator else None
            verdict = state.verdict if state is not None else None
            if verdict is None:
                continue
            uncapped = verdict.cap.uncapped if verdict.cap is not None else verdict.score
            seen[name] = max(seen[name], uncapped)
            if verdict.verdict != "clean":
                worst[name] = verdict.verdict

    with agent_running(agent):
        started = time.monotonic()
        killed = until(
            lambda: [
                r
                for r in actions_on(log_records(log), standin.pid)
                if r["gpuguard"]["action"] == "kill" and r["gpuguard"]["status"] == "done"
            ],
            STANDIN_DEADLINE_S,
        )
        assert killed[0]["gpuguard"]["verdict"] == "malicious", killed
        expected = [w.name for w in CORPUS if w.server in IN_POOL_RANGE]
        while time.monotonic() - started < AGENT_WATCH_S or (
            time.monotonic() - started < AGENT_WATCH_MAX_S
            and not all(seen[name] >= 40 for name in expected)
        ):
            look()
            time.sleep(1)
        look()
        watched = time.monotonic() - started
    records = log_records(log)
    for name, proc in workers.items():
        assert proc.poll() is None, f"{name} was killed"
        assert not [r for r in records if finding_for(proc.pid)(r)], name
        assert not actions_on(records, proc.pid), name
        assert worst[name] == "clean", (name, worst[name])
    # the agent saw the generic facts add up on the workers whose servers listen in the range
    for name in expected:
        assert seen[name] >= 40, (name, seen, f"watched {watched:.0f} s")
