"""`gpuguard agent` as a subprocess on the real kernel, against the selftest's miner simulator.

The simulator (gpuguard/agent/simulator.py) runs in private mount and network
namespaces: GPU-named nodes on a private /dev tmpfs, a CUDA-like ioctl burst,
a stratum login to a loopback pool.  One eBPF agent serves most tests; the
reduced-mode and start-order tests run their own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.agent_run import REPO, AgentProcess, finding_for, lifecycle, miner_simulator, running_agent

pytestmark = pytest.mark.root
TARGET_LATENCY_S = 1.0


@pytest.fixture(scope="module")
def ebpf_agent():
    with tempfile.TemporaryDirectory(prefix="gg-agent-") as tmp:
        rules_dir = Path(tmp) / "rules"
        rules_dir.mkdir(mode=0o700)
        shutil.copytree(REPO / "rules", rules_dir, dirs_exist_ok=True)
        site = rules_dir / "site.yaml"
        site.write_text("version: 1\nlists: {pool_ports: {extend: [3333]}}\n")
        with running_agent(Path(tmp), "--sensor", "ebpf", "--rules", str(rules_dir / "miner-rules.yaml"),
                           "--rules", str(site)) as agent:
            agent.rules_dir = rules_dir
            yield agent


def test_miner_is_found_within_the_target_latency_with_its_evidence(ebpf_agent):
    with miner_simulator() as miner:
        assert miner["pool"] == 1, "the simulator never logged in to its pool"
        finding = ebpf_agent.wait_record(finding_for(miner["pid"]), timeout=10)
        # network evidence arrives after the exec: wait for the verdict to reach its final score
        doc = ebpf_agent.wait_status(lambda d: any(f["pid"] == miner["pid"] for f in d["last_findings"]))
    detected = [f for f in doc["last_findings"] if f["pid"] == miner["pid"]][0]
    assert detected["time"] - miner["start"] <= TARGET_LATENCY_S, detected
    assert finding["gpuguard"]["verdict"] == "malicious"
    assert finding["event"]["kind"] == "alert" and finding["event"]["dataset"] == "gpuguard.agent"
    rules = set(finding["gpuguard"]["rule_ids"])
    assert {"miner-cmdline-stratum", "miner-cmdline-wallet", "miner-cmdline-flags"} <= rules
    assert "stratum+tcp://127.0.0.1:3333" in finding["process"]["command_line"]
    assert "T1496" in finding["threat"]["technique"]["id"]
    # one line per verdict change, not one per rescore
    records = ebpf_agent.records()
    assert sum(1 for r in records if finding_for(miner["pid"])(r)) == 1
    alert = [r for r in records if r["gpuguard"].get("kind") == "action" and r["gpuguard"]["pid"] == miner["pid"]]
    assert [a["gpuguard"]["action"] for a in alert] == ["alert"]


def test_status_shows_the_running_agent(ebpf_agent):
    run = subprocess.run([sys.executable, "-m", "gpuguard", "status", "--state-file", str(ebpf_agent.state)],
                         capture_output=True, text=True, cwd=REPO, timeout=30)
    assert run.returncode == 0, run.stderr
    assert f"running (running), pid {ebpf_agent.proc.pid}" in run.stdout
    assert "mode:       monitor" in run.stdout
    doc = ebpf_agent.status()
    assert doc["sensor"] == "ebpf" and doc["probes_attached"] > 5 and doc["blind_spots"] == []
    assert len(doc["rules"]["version"]) == 12 and doc["rules"]["generation"] >= 1
    assert oct(os.stat(ebpf_agent.state).st_mode & 0o777) == "0o600"


def test_selftest_passes_against_the_running_agent(ebpf_agent):
    run = subprocess.run([sys.executable, "-m", "gpuguard", "selftest", "--state-file", str(ebpf_agent.state)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("PASS: running agent") and "malicious" in run.stdout


def test_sighup_with_a_broken_rules_file_keeps_the_old_rules(ebpf_agent):
    site = ebpf_agent.rules_dir / "site.yaml"
    good = site.read_text()
    before = ebpf_agent.status()["rules"]
    try:
        site.write_text("version: 1\nrules:\n  - id: broken\n    weight: lots\n")
        ebpf_agent.signal(signal.SIGHUP)
        failed = ebpf_agent.wait_record(lambda r: lifecycle("reload-failed")(r) and "SIGHUP" in r["message"])
        assert "keeping the previous rules" in failed["message"] and "site.yaml" in failed["message"]
        doc = ebpf_agent.wait_status(lambda d: d["rules"]["error"])
        assert doc["rules"]["generation"] == before["generation"] and doc["rules"]["version"] == before["version"]
        with miner_simulator() as miner:     # the old rules still detect
            ebpf_agent.wait_record(finding_for(miner["pid"]), timeout=10)
    finally:
        site.write_text(good)
    ebpf_agent.signal(signal.SIGHUP)
    ebpf_agent.wait_record(lambda r: lifecycle("reload")(r) and "rules reloaded" in r["message"])
    assert ebpf_agent.wait_status(lambda d: not d["rules"]["error"])["rules"]["generation"] > before["generation"]


def test_reduced_mode_lists_blind_spots_and_finds_the_miner(tmp_path):
    with running_agent(tmp_path, "--sensor", "proc") as agent:
        doc = agent.status()
        assert doc["sensor"] == "proc" and doc["probes_attached"] == 0
        assert any("ioctl" in spot for spot in doc["blind_spots"])
        degraded = agent.wait_record(lambda r: lifecycle("degraded")(r) and "reduced mode" in r["message"])
        assert "reduced mode" in degraded["message"] and degraded["gpuguard"]["detail"]["blind_spots"]
        with miner_simulator() as miner:
            finding = agent.wait_record(finding_for(miner["pid"]), timeout=15)
        assert finding["gpuguard"]["verdict"] == "malicious"
        assert "blind spot" in agent.stderr()


def test_a_miner_started_before_the_agent_is_found_by_the_start_sweep(tmp_path):
    with miner_simulator() as miner:
        agent = AgentProcess(tmp_path, "--sensor", "ebpf")
        try:
            ready = agent.wait_ready()
            finding = agent.wait_record(finding_for(miner["pid"]), timeout=10)
            assert finding["gpuguard"]["verdict"] == "malicious"
            # scored by the seed sweep, before the agent said it had started
            assert any(f["pid"] == miner["pid"] for f in ready["last_findings"])
        finally:
            agent.stop()


def test_closed_stdout_is_survived_and_sigterm_writes_a_summary(tmp_path):
    agent = AgentProcess(tmp_path, "--sensor", "ebpf", log_to_stdout=True)
    try:
        agent.wait_ready()
        first = json.loads(agent.proc.stdout.readline())
        assert first["gpuguard"]["kind"] in ("process", "lifecycle", "action")
        agent.proc.stdout.close()          # the reader goes away
        with miner_simulator() as miner:
            doc = agent.wait_status(lambda d: any(f["pid"] == miner["pid"] for f in d["last_findings"]), 15)
        doc = agent.wait_status(lambda d: d["drops"]["output_errors"] > 0)
        assert agent.proc.poll() is None
    finally:
        rc = agent.stop()
    assert rc == 0
    stderr = agent.stderr()
    assert "cannot write the log to stdout (the reader of stdout went away)" in stderr
    assert stderr.count("cannot write the log to stdout") == 1       # reported once, not per line
    assert "agent stopped after" in stderr and "Traceback" not in stderr
    final = json.loads(agent.state.read_text())
    assert final["running"] is False


def test_sigterm_drains_and_detaches_the_probes(tmp_path):
    agent = AgentProcess(tmp_path, "--sensor", "ebpf")
    agent.wait_ready()
    pid = agent.proc.pid
    assert any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("anon_inode:bpf") for fd in os.listdir(f"/proc/{pid}/fd"))
    assert agent.stop() == 0
    stop = [r for r in agent.records() if lifecycle("stop")(r)]
    assert len(stop) == 1 and stop[0] == agent.records()[-1]
    assert "agent stopped after" in stop[0]["message"]
    run = subprocess.run([sys.executable, "-m", "gpuguard", "status", "--state-file", str(agent.state)],
                         capture_output=True, text=True, cwd=REPO, timeout=30)
    assert run.returncode == 3 and "not running (stopped)" in run.stdout


def test_auto_sensor_without_ebpf_runs_in_reduced_mode_and_ebpf_refuses():
    """An unprivileged agent cannot load probes: `auto` falls back and says why, `ebpf` exits 2 in one line."""
    with tempfile.TemporaryDirectory(prefix="gg-agent-nobody-") as tmp:
        os.chmod(tmp, 0o777)
        _unprivileged_agent(Path(tmp))


def _unprivileged_agent(workdir: Path) -> None:
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    base = [sys.executable, "-m", "gpuguard", "agent", "--state-file", str(workdir / "status.json"),
            "--log", str(workdir / "agent.log")]
    refused = subprocess.run(unprivileged + base + ["--sensor", "ebpf"], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "the eBPF sensor needs root" in refused.stderr
    agent = AgentProcess(workdir, wrapper=tuple(unprivileged))
    try:
        doc = agent.wait_ready()
        assert doc["sensor"] == "proc" and doc["blind_spots"]
        degraded = agent.wait_record(lambda r: lifecycle("degraded")(r) and "reduced mode" in r["message"])
        assert "eBPF sensor unavailable" in degraded["message"] and "needs root" in degraded["message"]
    finally:
        assert agent.stop() == 0, agent.stderr()


def test_selftest_starts_its_own_agent_when_none_runs(tmp_path):
    run = subprocess.run([sys.executable, "-m", "gpuguard", "selftest", "--state-file", str(tmp_path / "none.json"),
                          "--sensor", "proc"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("PASS: agent started for the test (sensor proc): found the miner simulator")


def test_selftest_refuses_without_root_in_one_line(tmp_path):
    run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                          "gpuguard", "selftest"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "selftest needs root" in run.stderr


def test_a_full_disk_is_reported_once_and_scoring_goes_on(tmp_path):
    """The log lives on a 12 KiB tmpfs in the agent's own mount namespace: it fills within the first lines."""
    full = tmp_path / "full"
    full.mkdir()
    script = 'mount -t tmpfs -o size=12k gpuguard-test-full "$0" && exec "$@"'
    agent = AgentProcess(tmp_path, "--sensor", "ebpf", log_path=full / "agent.log",
                         wrapper=("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(full)))
    try:
        agent.wait_ready()
        with miner_simulator() as miner:       # the state file (outside the tmpfs) still shows the finding
            agent.wait_status(lambda d: any(f["pid"] == miner["pid"] for f in d["last_findings"]), 15)
        doc = agent.wait_status(lambda d: d["drops"]["output_errors"] > 0)
        assert doc["running"]
    finally:
        assert agent.stop() == 0
    stderr = agent.stderr()
    assert stderr.count("(the disk is full)") == 1 and "Traceback" not in stderr, stderr
