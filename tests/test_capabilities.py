"""Least privilege, measured on real agents: each is started by setpriv with only the capability
set the packaging grants (gpuguard/agent/capabilities.py), as root, every other capability out
of its bounding set, and must still do its job; a set short of one says so or shows the loss
docs/deploy.md ("Capabilities") names.  Miners are the selftest's simulator (root, private
namespaces) and a stand-in run as nobody from a 0700 home, logging in to a loopback pool."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.agent.capabilities import ENFORCE_CAPABILITIES, MONITOR_CAPABILITIES
from gpuguard.proving.enforce_scope import EnforceScope
from gpuguard.sources.proc.capabilities import CAPABILITY_BITS
from tests.support.agent_run import REPO, AgentProcess, actions_on, finding_for, simulator_rules
from tests.support.payloads import LOGIN  # a Monero wallet, an XMRig agent
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]
NOBODY = 65534


def only(caps) -> tuple[str, ...]:
    """setpriv: root with exactly ``caps`` (the bounding set bounds what root's exec gets)."""
    named = ",".join(f"+{c.removeprefix('CAP_').lower()}" for c in caps)
    return (
        "setpriv",
        f"--bounding-set=-all{',' + named if named else ''}",
        "--inh-caps=-all",
        "--",
    )


def effective(pid: int) -> set[str]:
    line = next(
        x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("CapEff")
    )
    bits = int(line.split()[1], 16)
    names = {name for name, bit in CAPABILITY_BITS.items() if bits >> bit & 1}
    others = bits & ~sum(1 << b for b in CAPABILITY_BITS.values())
    assert not others, f"capabilities beyond the named ones: {others:#x}"
    return names


class Pool:
    """A loopback 'pool' that accepts and holds the miners' connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]


@contextlib.contextmanager
def agent(tmp: Path, caps, *args: str, config: str = "", pool: Pool | None = None) -> Iterator:
    tmp.mkdir(parents=True, exist_ok=True)
    rules, site = simulator_rules(tmp, *([pool.port] if pool is not None else []))
    extra: tuple[str, ...] = ()
    if config:
        (tmp / "agent.yaml").write_text(config)
        (tmp / "agent.yaml").chmod(0o600)
        extra = ("--config", str(tmp / "agent.yaml"))
    proc = AgentProcess(
        tmp,
        *extra,
        "--rules",
        str(rules),
        "--rules",
        str(site),
        *args,
        wrapper=only(caps),
    )
    try:
        proc.wait_ready(120)
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def nobodys_miner(tmp: Path, pool: Pool, cgroup: Path | None = None) -> Iterator:
    """A stand-in miner named xmrig, owned by nobody, mode 0700 in nobody's 0700 home, run as
    nobody: it connects to the pool, logs in with a wallet, and waits."""
    home = tmp / "home-nobody"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    home.chmod(0o700)
    binary = home / "xmrig"
    shutil.copy(build_workload(), binary)
    os.chown(binary, NOBODY, NOBODY)
    binary.chmod(0o700)
    join = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup is not None else ""
    steps = [f"connect:127.0.0.1:{pool.port}", f"send:0:{LOGIN.hex()}", "ready", "sleep:60000"]
    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            join + f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- "$@"',
        ]
        + ["sh", str(binary), *steps],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline().strip() == b"ready"
        proc.sha256 = hashlib.sha256(binary.read_bytes()).hexdigest()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def settled(agent: AgentProcess, pid: int, timeout: float = 20) -> dict:
    """The latest record of the finding on ``pid``, once its network evidence is in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [r for r in agent.records() if finding_for(pid)(r)]
        if mine and "net-pool-protocol" in mine[-1]["gpuguard"]["rule_ids"]:
            return mine[-1]
        time.sleep(0.1)
    raise AssertionError(f"no finding with its pool on {pid}: {agent.stderr()}")


def troubles(agent: AgentProcess) -> list:
    return [
        (r["event"]["action"], r["message"])
        for r in agent.records()
        if r.get("gpuguard", {}).get("kind") == "lifecycle"
        and r["event"]["action"] in ("degraded", "fault", "reload-failed")
    ]


def test_monitor_capabilities_attach_the_probes_pass_the_selftest_and_find_miners(tmp_path):
    pool = Pool()
    with agent(tmp_path, MONITOR_CAPABILITIES, "--sensor", "ebpf", pool=pool) as running:
        assert effective(running.proc.pid) == set(MONITOR_CAPABILITIES)
        status = running.status()
        assert status["sensor"] == "ebpf" and status["probes_attached"] > 10, status
        selftest = subprocess.run(
            [sys.executable, "-m", "gpuguard", "selftest", "--state-file", str(running.state)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert selftest.returncode == 0 and selftest.stdout.startswith("PASS"), (
            selftest.stdout + selftest.stderr
        )
        with nobodys_miner(tmp_path, pool) as miner:
            found = settled(running, miner.pid)
        assert found["gpuguard"]["verdict"] == "malicious"
        # another user's 0700 executable: read for its hash (DAC_READ_SEARCH), its /proc entries
        # followed (SYS_PTRACE)
        assert found["process"]["executable"] == str(tmp_path / "home-nobody" / "xmrig")
        assert found["process"]["hash"]["sha256"] == miner.sha256
        assert found["user"]["id"] == str(NOBODY)
        assert troubles(running) == []


@pytest.mark.parametrize("dropped", ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"])
def test_without_one_of_the_proc_capabilities_another_users_executable_goes_unread(
    tmp_path, dropped
):
    pool = Pool()
    caps = [c for c in MONITOR_CAPABILITIES if c != dropped]
    with agent(tmp_path, caps, "--sensor", "ebpf", pool=pool) as running:
        assert effective(running.proc.pid) == set(caps)
        with nobodys_miner(tmp_path, pool) as miner:
            found = settled(running, miner.pid)
    assert found["gpuguard"]["verdict"] == "malicious"  # named and dialling: still found
    assert "hash" not in found["process"], found["process"]  # but its executable is not read


def test_bpf_and_perfmon_load_the_probes_and_without_them_the_agent_says_reduced_mode(tmp_path):
    probes = [c for c in MONITOR_CAPABILITIES if c != "CAP_SYS_ADMIN"]
    with agent(tmp_path / "a", probes, "--sensor", "ebpf") as running:
        assert running.status()["probes_attached"] > 10  # CAP_SYS_ADMIN is not what loads them
    blind = ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"]
    with agent(tmp_path / "b", blind, "--sensor", "auto") as running:
        assert running.status()["sensor"] == "proc"
        # the log's writer may be a moment behind the state file that says "ready"
        said = running.wait_record(
            lambda r: (
                r.get("gpuguard", {}).get("kind") == "lifecycle"
                and r["event"]["action"] == "degraded"
                and "reduced mode" in r["message"]
            )
        )["message"]
        assert "eBPF sensor unavailable" in said, troubles(running)


def test_sys_admin_enters_a_containers_network_namespace_for_its_tcp_counters(tmp_path):
    """The session signals read tcp_info from inside each process's network namespace: setns,
    which needs CAP_SYS_ADMIN (the rest of the monitor set cannot)."""
    contained = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        until = time.monotonic() + 10
        while (
            Path(f"/proc/{contained.pid}/ns/net").resolve() == Path("/proc/self/ns/net").resolve()
        ):
            assert time.monotonic() < until, "the namespace never appeared"
            time.sleep(0.05)
        probe = (
            "from gpuguard.sources.net.tcp_sessions import netlink_socket_in\n"
            f"netlink_socket_in({contained.pid}).close()\nprint('entered')\n"
        )
        results = {}
        for name, caps in (
            ("monitor", MONITOR_CAPABILITIES),
            ("no SYS_ADMIN", [c for c in MONITOR_CAPABILITIES if c != "CAP_SYS_ADMIN"]),
        ):
            run = subprocess.run(
                [*only(caps), sys.executable, "-c", probe],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=60,
            )
            results[name] = (run.returncode, run.stdout.strip(), run.stderr.strip()[-200:])
    finally:
        contained.kill()
        contained.wait()
    assert results["monitor"][:2] == (0, "entered"), results
    assert (
        results["no SYS_ADMIN"][0] != 0 and "Operation not permitted" in results["no SYS_ADMIN"][2]
    )


def test_enforce_without_cap_kill_says_so_in_one_line_and_exits(tmp_path):
    scope = EnforceScope(tmp_path, prefix="gg-caps-test")
    try:
        config = tmp_path / "agent.yaml"
        config.write_text("mode: enforce\n" + scope.response_section())
        config.chmod(0o600)
        short = [c for c in ENFORCE_CAPABILITIES if c != "CAP_KILL"]
        run = subprocess.run(
            [*only(short), sys.executable, "-m", "gpuguard", "agent", "--config", str(config)]
            + ["--sensor", "proc", "--state-file", str(tmp_path / "s.json")]
            + ["--log", str(tmp_path / "a.log")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
    finally:
        scope.close()
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("gpuguard: enforce mode needs CAP_KILL for kill"), line
    assert "grant KILL" in line and "--mode monitor" in line and "NET_ADMIN" not in line


def test_enforce_capabilities_carry_out_the_response_on_another_users_miner(tmp_path):
    """The enforce set kills a miner of another user (CAP_KILL), acting only in a cgroup this
    test made; an enforce agent whose actions need no more than the monitor set starts with it."""
    pool = Pool()
    scope = EnforceScope(tmp_path, prefix="gg-caps-test")
    try:
        config = "mode: enforce\nsampling: {sources: []}\n" + scope.response_section().replace(
            "response:\n",
            "response:\n  actions: {malicious: [kill-on-touch, block-egress, kill]}\n",
        )
        with agent(
            tmp_path / "e", ENFORCE_CAPABILITIES, "--sensor", "ebpf", config=config, pool=pool
        ) as running:
            assert effective(running.proc.pid) == set(ENFORCE_CAPABILITIES)
            with nobodys_miner(tmp_path, pool, scope.cgroup) as miner:
                deadline = time.monotonic() + 30
                while miner.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                killed = miner.poll() is not None
            if killed:  # the record of the kill is written after the kill itself
                running.wait_record(
                    lambda r: r in actions_on([r], miner.pid) and r["gpuguard"]["action"] == "kill",
                    timeout=10,
                )
            outcomes = {
                r["gpuguard"]["action"]: r["gpuguard"]["status"]
                for r in actions_on(running.records(), miner.pid)
            }
        assert killed and outcomes.get("kill") == "done", outcomes
        # quarantine and kill-on-touch are eBPF and cgroup programs: the monitor set suffices
        lean = "mode: enforce\nsampling: {sources: []}\n" + scope.response_section().replace(
            "response:\n", "response:\n  actions: {malicious: [kill-on-touch, quarantine]}\n"
        )
        with agent(tmp_path / "m", MONITOR_CAPABILITIES, "--sensor", "proc", config=lean) as ok:
            assert ok.status()["mode"] == "enforce"
    finally:
        scope.close()


def test_a_reload_to_enforce_without_cap_kill_is_refused_and_monitoring_goes_on(tmp_path):
    scope = EnforceScope(tmp_path, prefix="gg-caps-test")
    try:
        section = scope.response_section()
        with agent(
            tmp_path / "a",
            MONITOR_CAPABILITIES,
            "--sensor",
            "proc",
            config="mode: monitor\n" + section,
        ) as running:
            (tmp_path / "a" / "agent.yaml").write_text("mode: enforce\n" + section)
            running.signal(signal.SIGHUP)
            refused = running.wait_record(
                lambda r: r.get("event", {}).get("action") == "reload-failed", timeout=20
            )
            assert "enforce mode needs CAP_KILL" in refused["message"], refused["message"]
            assert running.status()["mode"] == "monitor"
    finally:
        scope.close()
