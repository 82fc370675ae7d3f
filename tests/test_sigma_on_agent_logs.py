"""The shipped Sigma rules, executed: pySigma's DuckDB backend runs each one over real agent logs.

Four runs of the real agent (eBPF sensor) at once, each in its own UTS namespace so each has
its own host name, as four hosts of a fleet would; each keeps the records of its own jobs'
pids and its own lifecycle records (every agent sees the whole kernel):

* ``gg-sigma-a`` sees a benign GPU job: it opens the GPU nodes, issues a burst of CUDA-like
  ioctls and sends an HTTP request to a loopback web server;
* ``gg-sigma-b``, ``-c`` and ``-d`` each see a miner stand-in: the same GPU start-up, then a
  stratum login (Monero wallet, XMRig agent) to one loopback "pool" address they all share;
  ``-c`` is then sent SIGHUP with a broken agent.yaml (a failed reload).

Each single-event rule must match the miner's own record and no record of the benign job's;
the agent-blind rule must match the failed reload and nothing on the healthy runs; and the
correlation rule must fire on the merged logs of the three miner hosts, for that pool
address, and not on fewer hosts.  The host runs other engineers' tests too, so assertions
name the processes and the addresses this module started (docs/siem.md).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sigma.collection import SigmaCollection

from tests.support import sigma_exec
from tests.support.agent_run import (
    REPO,
    finding_for,
    lifecycle,
    miner_simulator,
    running_agent,
    simulator_rules,
)
from tests.support.payloads import LOGIN
from tests.support.workloads import build_workload, run_with_gpu_nodes

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

SIGMA = REPO / "packaging" / "sigma"
NV_ESC_RM_ALLOC = (3 << 30) | (48 << 16) | (ord("F") << 8) | 0x2B
HTTP = b"GET /v1/models HTTP/1.1\r\nHost: inference.local\r\n\r\n"


@dataclass
class Run:
    host: str
    records: list[dict] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)  # workload name -> pid


class Server:
    """A loopback TCP server on ``ip`` that reads what clients send and keeps them connected."""

    def __init__(self, ip: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((ip, 0))
        self.sock.listen(16)
        self.address = self.sock.getsockname()
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.clients.append(client)
            client.settimeout(5)
            try:
                client.recv(4096)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        for client in self.clients:
            client.close()


def loopback_ip() -> str:
    """An address of 127.0.0.0/8 no other test uses (the whole /8 is local on Linux)."""
    return f"127.{random.randint(32, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"


def gpu_job(server: Server, payload: bytes) -> list[str]:
    """Open the GPU nodes, a CUDA-like ioctl burst, then one connection carrying ``payload``."""
    ip, port = server.address
    return [
        str(build_workload()),
        "open:/dev/nvidiactl",
        "open:/dev/nvidia0",
        "open:/dev/nvidia-uvm",
        f"ioctl:1:{NV_ESC_RM_ALLOC}:2000",
        f"connect:{ip}:{port}",
        f"send:3:{payload.hex()}",
        "ready",
    ]


def agent_run(
    workdir: Path, host: str, pool: Server, jobs: dict[str, list[str]], break_config: bool
) -> Run:
    """One agent named ``host`` watching ``jobs`` (name -> workload steps) one after another."""
    run = Run(host)
    # the simulator's pool is on its own loopback, the jobs' pool on ours
    rules, site = simulator_rules(workdir, pool.address[1])
    config = workdir / "agent.yaml"
    # every GPU source on, as shipped: this host has no GPU, so each is `source-absent`
    # (information), and the agent-blind rule must not take a healthy start for blindness
    config.write_text("mode: monitor\n")
    os.chmod(config, 0o600)
    hostname = ("unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', host)
    with running_agent(
        workdir,
        "--config",
        str(config),
        "--sensor",
        "ebpf",
        "--rules",
        str(rules),
        "--rules",
        str(site),
        wrapper=hostname,
    ) as agent:
        for name, steps in jobs.items():
            if name == "exec-miner":
                run.pids[name] = exec_miner(agent)
                continue
            job = run_with_gpu_nodes(steps)
            try:
                assert job.stdout.readline() == b"ready\n", job.stderr.read()
                run.pids[name] = job.pid
                if name == "miner":
                    agent.wait_record(
                        lambda r, pid=job.pid: (
                            finding_for(pid)(r) and r["gpuguard"]["verdict"] == "malicious"
                        ),
                        timeout=30,
                    )
                else:
                    time.sleep(4)  # what the agent would say of it, it says within this
            finally:
                job.stdin.close()
                job.wait(10)
        if break_config:
            config.write_text("mode: monitor\nsampling: {interval_s: fast}\n")
            agent.signal(signal.SIGHUP)
            agent.wait_record(lifecycle("reload-failed"), timeout=20)
    records = agent.records()  # read after the stop: the final scoring is in
    assert records and all(r["host"]["name"] == host for r in records), host
    # The other hosts' agents run beside this one on the same kernel (so do other tests): keep
    # the records of this host's own jobs and the agent's own (lifecycle) ones, as if only
    # this host's workloads ran on it.
    run.records = [r for r in records if _of_this_host(r, set(run.pids.values()))]
    return run


def _of_this_host(record: dict, pids: set[int]) -> bool:
    """A record of the agent itself, or of no process, or of one of ``pids``."""
    if record.get("gpuguard", {}).get("kind") == "lifecycle":
        return True
    pid = record.get("process", {}).get("pid")
    return pid is None or pid in pids


def exec_miner(agent) -> int:
    """The selftest's miner simulator: malicious at exec from its command line alone, it opens
    the GPU nodes and logs in to its pool afterwards (issue 21's "most obvious miner")."""
    with miner_simulator() as miner:
        assert miner["pool"] == 1, "the simulator never logged in to its pool"
        agent.wait_record(finding_for(miner["pid"]), timeout=30)
        deadline = time.monotonic() + 20  # later evidence reaches the log in an update record
        while time.monotonic() < deadline and not [
            r for r in agent.records() if finding_for(miner["pid"])(r) and r.get("destination")
        ]:
            time.sleep(0.5)
        return miner["pid"]


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Run]]:
    pool, web = Server(loopback_ip()), Server(loopback_ip())
    try:
        with tempfile.TemporaryDirectory(prefix="gg-sigma-") as tmp:
            hosts = (
                ("a", {"benign": gpu_job(web, HTTP)}, False),
                ("b", {"miner": gpu_job(pool, LOGIN), "exec-miner": []}, False),
                ("c", {"miner": gpu_job(pool, LOGIN)}, True),
                ("d", {"miner": gpu_job(pool, LOGIN)}, False),
            )
            for name, _, _ in hosts:
                (Path(tmp) / name).mkdir()
            # the four hosts of the fleet run at once, as a fleet does (and in a quarter of
            # the time four runs in a row took)
            with ThreadPoolExecutor(len(hosts)) as pool_of_hosts:
                started = {
                    name: pool_of_hosts.submit(
                        agent_run, Path(tmp) / name, f"gg-sigma-{name}", pool, jobs, broken
                    )
                    for name, jobs, broken in hosts
                }
                out = {name: future.result() for name, future in started.items()}
            out["pool_ip"] = pool.address[0]  # type: ignore[assignment]
            out["web_ip"] = web.address[0]  # type: ignore[assignment]
            yield out
    finally:
        pool.close()
        web.close()


def rule_query(name: str) -> str:
    """The DuckDB query pySigma makes of one shipped single-event rule."""
    (query,) = sigma_exec.queries(SigmaCollection.from_yaml((SIGMA / name).read_text()))
    assert query.startswith("SELECT * FROM logs WHERE "), query
    return query


def pids(records: list[dict]) -> set:
    return {r.get("process", {}).get("pid") for r in records}


@pytest.mark.parametrize(
    "rule", ["gpuguard_malicious_on_gpu_node.yml", "gpuguard_pool_connection.yml"]
)
def test_rule_fires_on_the_miner_and_stays_silent_on_the_benign_job(runs, rule):
    query = rule_query(rule)
    for name in ("b", "c", "d"):
        hits = sigma_exec.matching_records(query, runs[name].records)
        mine = [r for r in hits if r["process"]["pid"] == runs[name].pids["miner"]]
        assert mine, (rule, name, [r["event"]["action"] for r in runs[name].records])
        if rule == "gpuguard_pool_connection.yml":
            assert {r["destination"]["ip"] for r in mine} == {runs["pool_ip"]}, mine
        else:
            assert "nvidia" in mine[0]["gpuguard"]["gpu"]["device_classes"], mine[0]
    benign = runs["a"]
    hits = sigma_exec.matching_records(query, benign.records)
    assert benign.pids["benign"] not in pids(hits), hits
    assert not [r for r in hits if r.get("destination", {}).get("ip") == runs["web_ip"]], hits


@pytest.mark.parametrize(
    "rule", ["gpuguard_malicious_on_gpu_node.yml", "gpuguard_pool_connection.yml"]
)
def test_rule_fires_on_a_miner_that_was_malicious_at_exec(runs, rule):
    """Its GPU nodes and its pool come after the first verdict: they reach the SIEM in an update."""
    hits = sigma_exec.matching_records(rule_query(rule), runs["b"].records)
    assert runs["b"].pids["exec-miner"] in pids(hits), [
        (r["event"]["action"], r.get("destination"), r["gpuguard"].get("gpu"))
        for r in runs["b"].records
        if finding_for(runs["b"].pids["exec-miner"])(r)
    ]


def test_agent_blind_fires_on_a_failed_reload_and_not_on_a_healthy_run(runs):
    query = rule_query("gpuguard_agent_blind.yml")
    hits = sigma_exec.matching_records(query, runs["c"].records)
    assert [r["event"]["action"] for r in hits] == ["reload-failed"], hits
    assert "sampling.interval_s" in hits[0]["message"]
    for name in ("a", "b", "d"):  # lifecycle records are this agent's own
        assert sigma_exec.matching_records(query, runs[name].records) == [], name


def test_the_correlation_fires_on_three_hosts_that_see_the_same_pool(runs):
    collection = SigmaCollection.load_ruleset([SIGMA])
    (query,) = [q for q in sigma_exec.queries(collection) if "COUNT(DISTINCT" in q]
    assert '"host.name"' in query and 'GROUP BY "destination.ip"' in query, query

    def fired(names: str) -> list[dict]:
        merged = [r for name in names for r in runs[name].records]
        return [
            row for row in sigma_exec.run(query, merged) if row["destination.ip"] == runs["pool_ip"]
        ]

    assert [row["value_count"] for row in fired("bcd")] == [3]
    assert [row["value_count"] for row in fired("abcd")] == [3]  # the benign host adds nothing
    assert fired("bc") == [] and fired("abd") == []  # two hosts are not a campaign


def test_every_shipped_rule_is_executed_here():
    executed = {
        "gpuguard_malicious_on_gpu_node.yml",
        "gpuguard_pool_connection.yml",
        "gpuguard_agent_blind.yml",
        "gpuguard_pool_on_many_hosts.yml",
    }
    assert {p.name for p in SIGMA.glob("*.yml")} == executed
