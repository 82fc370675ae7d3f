"""Host findings on CPU-miner tuning: the msr module's allow_writes and huge-page reservations.

The sysfs/procfs files are laid out in a temporary tree passed as ``--root`` (this
kernel has no msr module to load); the real reservation is in test_huge_pages_root.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.detect.host.checks import apply_thresholds
from gpuguard.detect.host.tuning_checks import check_host_tuning, host_tuning_findings
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.sources.proc.huge_pages import read_host_tuning
from tests.support.scan import scan_json

GIB = 1 << 30


def tuned_tree(root: Path, allow_writes: str | None, one_gib: int = 0, two_mib: int = 0) -> Path:
    """sysfs/procfs files as the kernel shows them (``hugepages-<kB>kB`` directories, one value a file)."""
    if allow_writes is not None:
        (root / "sys/module/msr/parameters").mkdir(parents=True)
        (root / "sys/module/msr/parameters/allow_writes").write_text(allow_writes + "\n")
    for size_kb, count in (("1048576", one_gib), ("2048", two_mib)):
        directory = root / f"sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
        directory.mkdir(parents=True)
        (directory / "nr_hugepages").write_text(f"{count}\n")
        (directory / "free_hugepages").write_text(f"{count}\n")
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/nr_hugepages").write_text(f"{two_mib}\n")
    return root


def test_msr_writes_on_and_1gib_pages_are_read_and_judged(tmp_path):
    root = tuned_tree(tmp_path, "on", one_gib=3)
    tuning = read_host_tuning(str(root))
    assert (tuning.msr_allow_writes, tuning.nr_hugepages, tuning.reserved) == ("on", 0, {GIB: 3})
    findings = host_tuning_findings(str(root))
    apply_thresholds(findings, Thresholds(40, 75))
    by_rule = {f.rule_id: f for f in findings}
    assert set(by_rule) == {"host-msr-writes-enabled", "host-hugepages-reserved"}
    assert by_rule["host-msr-writes-enabled"].verdict == "suspicious"
    assert by_rule["host-msr-writes-enabled"].evidence == [
        "/sys/module/msr/parameters/allow_writes = on"
    ]
    reserved = by_rule["host-hugepages-reserved"]
    assert reserved.verdict == "clean"  # huge pages alone are never a verdict
    assert "3 x 1 GiB" in reserved.detail and "1gb-pages" in reserved.detail
    assert reserved.evidence == ["/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages = 3"]


@pytest.mark.parametrize("allow_writes", ["off", "default", None])
def test_msr_writes_not_enabled_is_no_finding(tmp_path, allow_writes):
    root = tuned_tree(tmp_path, allow_writes)
    assert read_host_tuning(str(root)).reserved == {}
    assert host_tuning_findings(str(root)) == []


def test_database_sized_2mib_reservation_is_informational(tmp_path):
    findings = check_host_tuning(read_host_tuning(str(tuned_tree(tmp_path, None, two_mib=4096))))
    apply_thresholds(findings, Thresholds(40, 75))
    assert [(f.rule_id, f.verdict) for f in findings] == [("host-hugepages-reserved", "clean")]
    assert "4096 x 2 MiB huge pages reserved (8 GiB in all)" == findings[0].detail
    assert sorted(findings[0].evidence) == [
        "/proc/sys/vm/nr_hugepages = 4096",
        "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages = 4096",
    ]


def test_scan_reports_msr_writes_under_root(tmp_path):
    root = tuned_tree(tmp_path / "root", "on", one_gib=2)
    code, doc, _ = scan_json("--root", str(root), "--cpu-sample", "0")
    host = {f["rule"]["id"]: f for f in doc["findings"] if f["gpuguard"]["kind"] == "host"}
    assert host["host-msr-writes-enabled"]["gpuguard"]["verdict"] == "suspicious"
    assert (
        host["host-msr-writes-enabled"]["file"]["path"] == "/sys/module/msr/parameters/allow_writes"
    )
    assert host["host-hugepages-reserved"]["gpuguard"]["verdict"] == "clean"
    assert code == 1  # a suspicious finding
