"""The agent's GPU host findings, end to end: a real agent run over the fake NVML library.

Values are an H100 80GB as the real traces show it (tests/fakes/fake_pynvml.py;
``idle.gpus.json`` of the H100 traces: 81559 MiB total, 480 MiB used with no
process, the driver's own reservation).  Orphaned memory appears (used memory
no process accounts for, then memory a real zombie child still holds); the
agent logs exactly one finding for each, with the device, the amount and the
likely owner, ``gpuguard status`` lists it, a material growth is one update,
and a resolved record follows once the memory is freed.  The idle reservation
produces nothing, and enforce mode never acts on a host finding.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.pipeline import Agent
from gpuguard.commands.status import render
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot
from gpuguard.sources.gpu import nvml
from tests.fakes.fake_pynvml import MIB, FakeAccounting, FakeGpu, FakeNvml, FakeProcess
from tests.support.agent_run import log_records, until

pytestmark = [pytest.mark.root, pytest.mark.self_contained]

GIB = 1024 * MIB
IDLE_USED = 480 * MIB  # idle.gpus.json: memory_used 503316480 with no process
BUS = "00000000:18:00.0"
DEVICE = f"nvidia gpu0 ({BUS})"
CHECK_S = 0.3  # host-check interval of these runs
QUIET_S = 2.0  # how long "no second record" is watched (several checks)


def _host(doc: dict, fmt: str) -> dict | None:
    """The gpuguard part of a host finding record, whatever the format."""
    if fmt == "ocsf":
        if doc.get("class_uid") != 2004:
            return None
        mine = doc["unmapped"]["gpuguard"]
        return mine if mine.get("kind") == "host" else None
    mine = doc.get("gpuguard", {})
    return mine if mine.get("kind") == "host" else None


def _hostlog_records(log: Path, fmt: str) -> list[dict]:
    return [d for d in log_records(log) if _host(d, fmt) is not None]


def _status_field(doc: dict, fmt: str) -> str:
    """ "active" or "resolved", read from the format's own fields."""
    if fmt == "ocsf":
        return {1: "active", 2: "active", 4: "resolved"}[doc["status_id"]]
    return "resolved" if doc["event"]["type"] == ["end"] else "active"


def _pid_of(doc: dict, fmt: str) -> int | None:
    if fmt == "ocsf":
        return doc["evidences"][0].get("process", {}).get("pid")
    return doc.get("process", {}).get("pid")


def _zombie() -> subprocess.Popen:
    """A real zombie child: it exited, and nobody has waited for it yet."""
    child = subprocess.Popen(["true"])
    until(lambda: open(f"/proc/{child.pid}/stat").read().rsplit(") ", 1)[1][0] == "Z", 5)
    return child


class AgentRun:
    def __init__(
        self, tmp_path: Path, fmt: str, mode: str = "monitor", rules: list[Path] | None = None
    ) -> None:
        self.fake = FakeNvml([FakeGpu(bus_id=BUS, memory_used=IDLE_USED)])
        self.fmt = fmt
        self.log = tmp_path / "agent.log"
        self.status = tmp_path / "status.json"
        config = AgentConfig(
            sensor="proc",
            mode=mode,
            dry_run=mode == "enforce",
            rules=rules,
            log_path=str(self.log),
            log_format=fmt,
            status_path=self.status,
            sample_interval_s=0.1,
            host_check_interval_s=CHECK_S,
            sweep_interval_s=1.0,
            status_interval_s=0.3,
            metrics_address="127.0.0.1:0",
        )
        self.agent = Agent(
            config,
            install_signals=False,
            stderr=lambda line: None,
            sampler_openers={"nvml": lambda: nvml.open_sampler(library=self.fake.module)},
        )
        # The host-tuning checks read a tree of our own, not this host's /proc and /sys: a test
        # asserts about what it set up (another job may have reserved huge pages here).
        (tmp_path / "host").mkdir()
        self.agent.host_findings.tuning_root = str(tmp_path / "host")
        self.thread = threading.Thread(target=self.agent.run, daemon=True)

    def __enter__(self) -> AgentRun:
        self.thread.start()
        until(lambda: self.agent.ready.is_set() or not self.thread.is_alive(), 60)
        assert self.agent.ready.is_set(), "the agent did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.agent.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    @property
    def gpu(self) -> FakeGpu:
        return self.fake.gpus[0]

    def checks_pass(self, n: int) -> None:
        """Wait until the agent has sampled the current fake state and run ``n`` more host checks."""
        start = self.agent.counters.samples["nvml"]
        until(lambda: self.agent.counters.samples["nvml"] >= start + 2)
        time.sleep(n * CHECK_S + 0.2)

    def gauge(self, rule: str) -> float:
        """The gauge as a scrape of /metrics sees it (a scrape has the loop sync the totals)."""
        server = self.agent.telemetry.server
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            body = r.read().decode()
        for line in body.splitlines():
            if line.startswith(f'gpuguard_host_findings_active{{rule="{rule}"}}'):
                return float(line.split()[-1])
        return -1.0

    def status_doc(self) -> dict:
        return json.loads(self.status.read_text())


@pytest.mark.parametrize("fmt", ["ecs", "ocsf"])
def test_orphaned_memory_is_one_finding_then_one_resolved_record(tmp_path, fmt):
    with AgentRun(tmp_path, fmt) as run:
        # -- the idle driver reservation is not an orphan ---------------------------------------
        run.checks_pass(4)
        assert _hostlog_records(run.log, fmt) == []
        assert run.status_doc()["host_findings"] == []

        # -- 20 GiB used that no process accounts for; accounting remembers who had it ----------
        now_us = int(time.time() * 1e6)
        run.gpu.accounting_mode = 1
        run.gpu.accounting = {
            3_999_001: FakeAccounting(40, 2, 20 * GIB, now_us - 200_000_000, 120_000, running=False)
        }
        until(
            lambda: [r.pid for r in run.agent.host_findings.accounting()] == [3_999_001]
        )  # read before the memory shows
        run.gpu.memory_used = IDLE_USED + 20 * GIB
        (found,) = until(lambda: _hostlog_records(run.log, fmt))
        mine = _host(found, fmt)
        assert mine["host_gpu"] == {
            "device": DEVICE,
            "memory_bytes": IDLE_USED + 20 * GIB,
            "owner_pid": 3_999_001,
            "status": "active",
        }
        assert _status_field(found, fmt) == "active"
        assert _pid_of(found, fmt) == 3_999_001  # the likely owner is the related process
        message = found["message"]
        assert message == (
            f"host-gpu-memory-orphaned: {DEVICE}: 20.5 GiB of 79.6 GiB in use by no live process; "
            "likely owner: exited pid 3999001 (peak 20.0 GiB)"
        )
        if fmt == "ocsf":
            assert (found["activity_id"], found["status"]) == (1, "New")
        else:
            assert (
                found["event"]["action"] == "host-clean"
                and found["rule"]["id"] == "host-gpu-memory-orphaned"
            )

        # gpuguard status shows it, the gauge counts it
        until(lambda: run.status_doc()["host_findings"])
        (row,) = run.status_doc()["host_findings"]
        assert (row["rule_id"], row["device"], row["memory_bytes"], row["owner_pid"]) == (
            "host-gpu-memory-orphaned",
            DEVICE,
            IDLE_USED + 20 * GIB,
            3_999_001,
        )
        shown = render(run.status_doc(), True, "running", time.time())
        assert "active host findings (1):" in shown
        assert any("host-gpu-memory-orphaned" in line and "20.5 GiB" in line for line in shown)
        until(lambda: run.gauge("host-gpu-memory-orphaned") == 1)

        # -- it persists, and grows by less than a quarter: nothing new -------------------------
        run.gpu.memory_used = IDLE_USED + 22 * GIB
        run.checks_pass(QUIET_S / CHECK_S)
        assert len(_hostlog_records(run.log, fmt)) == 1

        # -- it grows by half: one update --------------------------------------------------------
        run.gpu.memory_used = IDLE_USED + 30 * GIB
        until(lambda: len(_hostlog_records(run.log, fmt)) == 2)
        update = _hostlog_records(run.log, fmt)[1]
        assert _host(update, fmt)["host_gpu"]["memory_bytes"] == IDLE_USED + 30 * GIB
        if fmt == "ocsf":
            assert (update["activity_id"], update["activity_name"]) == (2, "Update")
        else:
            assert update["event"]["type"] == ["change"]

        # -- freed: one resolved record, and nothing after it -----------------------------------
        run.gpu.memory_used = IDLE_USED
        until(lambda: len(_hostlog_records(run.log, fmt)) == 3)
        cleared = _hostlog_records(run.log, fmt)[2]
        assert _status_field(cleared, fmt) == "resolved"
        assert _host(cleared, fmt)["host_gpu"]["status"] == "resolved"
        if fmt == "ocsf":
            is_alert = cleared["unmapped"]["gpuguard"][
                "is_alert"
            ]  # OCSF 1.4's, kept off 1.3's top level
            assert (cleared["activity_id"], cleared["status"], is_alert) == (
                3,
                "Resolved",
                False,
            )
            assert (
                cleared["finding_info"]["uid"] == found["finding_info"]["uid"]
            )  # the same finding, closed
        else:
            assert (cleared["event"]["action"], cleared["event"]["kind"]) == (
                "host-resolved",
                "event",
            )
        until(lambda: run.status_doc()["host_findings"] == [])
        until(lambda: run.gauge("host-gpu-memory-orphaned") == 0)
        run.checks_pass(QUIET_S / CHECK_S)
        assert len(_hostlog_records(run.log, fmt)) == 3


@pytest.mark.parametrize("fmt", ["ecs", "ocsf"])
def test_memory_held_by_a_zombie_is_reported_until_it_is_reaped(tmp_path, fmt):
    zombie = _zombie()
    try:
        with AgentRun(tmp_path, fmt) as run:
            run.gpu.compute = [FakeProcess(zombie.pid, 8 * GIB)]
            run.gpu.memory_used = IDLE_USED + 8 * GIB
            (found,) = until(lambda: _hostlog_records(run.log, fmt))
            assert _host(found, fmt)["host_gpu"] == {
                "device": DEVICE,
                "memory_bytes": 8 * GIB,
                "owner_pid": zombie.pid,
                "status": "active",
            }
            assert _pid_of(found, fmt) == zombie.pid
            assert found["message"] == (
                f"host-gpu-memory-orphaned: {DEVICE}: 8.0 GiB memory held by pid "
                f"{zombie.pid}, which is zombie"
            )
            until(
                lambda: [r["owner_pid"] for r in run.status_doc()["host_findings"]] == [zombie.pid]
            )
            run.checks_pass(QUIET_S / CHECK_S)
            assert len(_hostlog_records(run.log, fmt)) == 1  # no duplicate while it persists

            zombie.wait()  # reaped: the driver lets the memory go with it
            run.gpu.compute = []
            run.gpu.memory_used = IDLE_USED
            until(lambda: len(_hostlog_records(run.log, fmt)) == 2)
            assert _status_field(_hostlog_records(run.log, fmt)[1], fmt) == "resolved"
            run.checks_pass(QUIET_S / CHECK_S)
            assert len(_hostlog_records(run.log, fmt)) == 2
    finally:
        zombie.wait()


def test_enforce_mode_never_acts_on_a_host_finding(tmp_path):
    """With thresholds that make the zombie's finding suspicious, an enforce agent (dry run: it would
    log what it would do to any verdict handed to it) reports the finding and plans no action."""
    rules = tmp_path / "rules.yaml"
    shutil.copytree(
        shipped_rules_file().parent / "yara", tmp_path / "yara"
    )  # the rules name their YARA files
    text = shipped_rules_file().read_text()
    assert "  suspicious: 40\n" in text
    rules.write_text(text.replace("  suspicious: 40\n", "  suspicious: 25\n", 1))
    rules.chmod(0o644)
    zombie = _zombie()
    try:
        with AgentRun(tmp_path, "ecs", mode="enforce", rules=[rules]) as run:
            run.gpu.compute = [FakeProcess(zombie.pid, 8 * GIB)]
            run.gpu.memory_used = IDLE_USED + 8 * GIB
            (found,) = until(lambda: _hostlog_records(run.log, "ecs"))
            assert (found["gpuguard"]["verdict"], found["event"]["kind"]) == ("suspicious", "alert")
            run.checks_pass(3)
            actions = [
                d for d in log_records(run.log) if d.get("gpuguard", {}).get("kind") == "action"
            ]
            assert [a for a in actions if a.get("process", {}).get("pid") == zombie.pid] == []
    finally:
        zombie.wait()


# -- the tracker alone: when a record is due ----------------------------------------------------


def _snapshot(used: int, processes=()) -> GpuSnapshot:

    device = DeviceSample("nvidia", 0, memory_used=used, memory_total=81559 * MIB, pci_bus_id=BUS)
    return GpuSnapshot(time=time.time(), source="nvml", devices=[device], processes=list(processes))


def _exited(pid: int, peak: int, util: float = 40.0, duration_s: float = 120.0):
    from gpuguard.events.gpu_accounting import GpuAccounting

    return GpuAccounting(
        pid, "nvidia", 0, None, util, 1.0, peak, time.time() - duration_s - 60, duration_s, False
    )


def test_tracker_reports_growth_beyond_a_quarter_and_a_new_owner_only():
    from gpuguard.agent.stages.s5_report.host_findings import MATERIAL_GROWTH, GpuHostFindings

    tracker = GpuHostFindings(10.0)

    def check(used: int, *accounting) -> list[tuple[str, int | None, int | None]]:
        tracker.observe(_snapshot(used))
        for record in accounting:
            tracker.observe(record)
        return [
            (f.activity, f.host_gpu["memory_bytes"], f.host_gpu["owner_pid"])
            for f in tracker.check(time.time(), Thresholds(40, 75))
        ]

    assert check(IDLE_USED) == []
    assert check(10 * GIB) == []  # found once: confirmed by the next sample
    assert (
        tracker.check(time.time(), Thresholds(40, 75)) == []
    )  # the same sample again confirms nothing
    assert check(10 * GIB) == [("create", 10 * GIB, None)]
    assert check(10 * GIB) == []
    assert check(int(10 * GIB * (1 + MATERIAL_GROWTH))) == []  # exactly a quarter: not material
    assert check(int(10 * GIB * (1 + MATERIAL_GROWTH)) + GIB) == [
        ("update", int(12.5 * GIB) + GIB, None)
    ]
    assert check(8 * GIB) == []  # shrinking is not news
    assert check(8 * GIB, _exited(3_999_002, 9 * GIB)) == [
        ("update", 8 * GIB, 3_999_002)
    ]  # the owner is known now
    assert [r["owner_pid"] for r in tracker.active()] == [3_999_002]
    # its accounting record not re-read within the tracker's horizon (a late sampler) and then
    # read again: neither is news (no update without the owner, then one with it again)
    tracker._accounting.clear()
    assert check(8 * GIB) == []
    assert check(8 * GIB, _exited(3_999_002, 9 * GIB)) == []
    assert check(8 * GIB, _exited(3_999_004, 9 * GIB)) == [("update", 8 * GIB, 3_999_004)]
    assert check(8 * GIB, _exited(3_999_002, 9 * GIB)) == [("update", 8 * GIB, 3_999_002)]
    assert tracker.active_by_rule() == {"host-gpu-memory-orphaned": 1}
    assert check(IDLE_USED) == [("close", 8 * GIB, 3_999_002)]
    assert tracker.active() == [] and tracker.active_by_rule() == {}


def test_tracker_past_heavy_user_is_written_once_and_never_active():
    from gpuguard.agent.stages.s5_report.host_findings import GpuHostFindings

    tracker = GpuHostFindings(10.0)
    heavy = _exited(3_999_003, 520 * MIB, util=98.0, duration_s=3600.0)
    tracker.observe(_snapshot(IDLE_USED))
    tracker.observe(heavy)
    (found,) = tracker.check(time.time(), Thresholds(40, 75))  # history: no second sample needed
    assert (found.rule_id, found.activity, found.process.pid) == (
        "host-gpu-past-heavy-user",
        "create",
        3_999_003,
    )
    assert found.host_gpu == {
        "device": "nvidia gpu0",
        "memory_bytes": 520 * MIB,
        "owner_pid": 3_999_003,
        "status": "active",
    }
    assert tracker.active() == [] and tracker.active_by_rule() == {}
    tracker.observe(_snapshot(IDLE_USED))
    tracker.observe(heavy)
    assert (
        tracker.check(time.time(), Thresholds(40, 75)) == []
    )  # not repeated while accounting remembers it


def test_a_holder_that_exits_after_the_sample_is_not_reported():
    """A real process listed by the last sample exits before the check: it looks vanished until a
    newer sample (without it) arrives, so nothing is reported."""
    from gpuguard.agent.stages.s5_report.host_findings import GpuHostFindings
    from gpuguard.events.gpu_snapshot import ProcessGpuUsage

    tracker = GpuHostFindings(10.0)
    holder = subprocess.Popen(["sleep", "60"])
    listed = ProcessGpuUsage(holder.pid, "nvidia", 0, used_memory=8 * GIB)
    tracker.observe(_snapshot(IDLE_USED + 8 * GIB, [listed]))
    assert tracker.check(time.time(), Thresholds(40, 75)) == []
    holder.kill()
    holder.wait()
    assert (
        tracker.check(time.time(), Thresholds(40, 75)) == []
    )  # "gone" on the old sample: pending only
    tracker.observe(_snapshot(IDLE_USED))  # the newer sample no longer lists it
    assert tracker.check(time.time(), Thresholds(40, 75)) == []
    assert tracker.active() == []


def test_a_resolved_host_finding_in_cef():
    from gpuguard.detect.host.checks import HostFinding
    from gpuguard.outputs.finding import finding_from_host
    from tests.support.records import render_record

    host = HostFinding(
        "host-gpu-memory-orphaned",
        subject=DEVICE,
        detail=f"{DEVICE}: 8.0 GiB ...",
        device=DEVICE,
        amount=8 * GIB,
    )
    active = render_record(finding_from_host(host, "create", 1.0), "cef")
    closed = render_record(finding_from_host(host, "close", 2.0), "cef")
    assert "act=alert" in active and "act=resolved" in closed
    assert "msg=resolved: host-gpu-memory-orphaned:" in closed


def test_tracker_reports_host_tuning_without_gpu_samples_and_resolves_it(tmp_path):
    """MSR writes enabled and huge pages reserved, read from a host tree: written when they appear
    (no sample race to confirm), again when the reservation grows, resolved when undone."""
    from gpuguard.agent.stages.s5_report.host_findings import GpuHostFindings

    msr = tmp_path / "sys/module/msr/parameters/allow_writes"
    pages = tmp_path / "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    msr.parent.mkdir(parents=True)
    pages.parent.mkdir(parents=True)
    msr.write_text("off\n")
    pages.write_text("0\n")
    tracker = GpuHostFindings(10.0, str(tmp_path))
    assert tracker.check(time.time(), Thresholds(40, 75)) == []
    msr.write_text("on\n")
    pages.write_text("1024\n")  # a RandomX dataset's worth of 2 MiB pages
    found = tracker.check(time.time(), Thresholds(40, 75))
    assert sorted((f.rule_id, f.activity, f.verdict) for f in found) == [
        ("host-hugepages-reserved", "create", "clean"),
        ("host-msr-writes-enabled", "create", "suspicious"),
    ]
    assert tracker.check(time.time(), Thresholds(40, 75)) == []  # persists: nothing new
    pages.write_text("1536\n")  # +50 %: material
    (grown,) = tracker.check(time.time(), Thresholds(40, 75))
    assert (grown.rule_id, grown.activity) == ("host-hugepages-reserved", "update")
    assert "1536 x 2 MiB" in grown.explanation
    msr.write_text("off\n")
    pages.write_text("0\n")
    assert sorted(
        (f.rule_id, f.activity) for f in tracker.check(time.time(), Thresholds(40, 75))
    ) == [
        ("host-hugepages-reserved", "close"),
        ("host-msr-writes-enabled", "close"),
    ]
    assert tracker.active() == []
