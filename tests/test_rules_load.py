"""Loading the shipped rules and layered site files; refusing untrusted files."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import (
    default_rule_paths,
    shipped_rules_dir,
    shipped_rules_file,
)
from gpuguard.errors import GpuguardError

REPO = Path(__file__).resolve().parent.parent
# A copy of shared/reference/indicators.md, so this runs in any clone (refresh it when the reference changes).
INDICATORS = Path(__file__).resolve().parent / "data" / "indicators.md"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_shipped_rules_dir_is_the_checkout_rules_dir():
    assert shipped_rules_dir() == REPO / "rules"
    assert shipped_rules_file() == REPO / "rules" / "miner-rules.yaml"


def test_shipped_rules_load():
    ruleset = load_ruleset([shipped_rules_file()])
    ids = [r.id for r in ruleset.rules]
    assert len(ids) == len(set(ids)) >= 30
    assert "miner-cmdline-stratum" in ids and "gpu-sustained-flat-load" in ids
    assert [r.id for r in ruleset.disabled] == ["policy-gpu-off-hours"]
    assert (ruleset.thresholds.suspicious, ruleset.thresholds.malicious) == (40, 75)
    assert ruleset.actions == {"clean": "none", "suspicious": "alert", "malicious": "alert"}
    assert [p.name for p in ruleset.yara_files] == ["miners.yar"]
    assert all("T1496" in r.tags for r in ruleset.rules if r.id.startswith(("miner-", "net-pool")))


def test_default_paths_add_site_files_sorted(tmp_path):
    write(tmp_path, "b.yaml", "version: 1\n")
    write(tmp_path, "a.yaml", "version: 1\n")
    write(tmp_path, "ignored.txt", "x")
    assert default_rule_paths(tmp_path) == [
        shipped_rules_file(),
        tmp_path / "a.yaml",
        tmp_path / "b.yaml",
    ]
    assert default_rule_paths(tmp_path / "missing") == [shipped_rules_file()]


def test_shipped_lists_cover_indicators():
    text = INDICATORS.read_text()
    lists = load_ruleset([shipped_rules_file()]).lists
    section = text.split("## Miner fingerprints")[1]
    names = re.search(r"Binary names: (.*?)\.\n- Flags", section, re.S)[1]
    for name in re.split(r",\s*", names.replace("\n", " ")):
        name = name.split(" (")[0].strip().lower()
        optional = re.match(r"^(.*)\((-\w+)\)$", name)  # "cpuminer(-opt)": both spellings
        for spelling in [optional[1], optional[1] + optional[2]] if optional else [name]:
            assert spelling in lists["miner_names"], spelling
    assert "miner" not in lists["miner_names"]  # gminer's generic name would flag too much
    for scheme in re.findall(r"([a-z0-9+]+)://", section.split("URL schemes:")[1].split("\n- ")[0]):
        assert scheme in lists["stratum_schemes"], scheme
    suffixes = text.split("Pool domain suffixes:")[1].split("\n- ")[0]
    for domain in re.findall(r"[a-z0-9-]+\.[a-z.]+[a-z]", suffixes):
        assert domain in lists["pool_domains"], domain
    algos = section.split("Algorithms in command lines:")[1].split("\n- ")[0]
    for algo in re.split(r",\s*", algos.replace("\n", " ").rstrip(". ")):
        algo = algo.strip()
        spellings = ["cuckatoo31", "cuckatoo32"] if algo == "cuckatoo31/32" else [algo]
        for spelling in spellings:
            assert spelling in lists["algorithms"], spelling
    ports = text.split("Ports seen:")[1].split(";")[0]
    numeric = {p for p in lists["pool_ports"] if isinstance(p, int)}
    for port in re.findall(r"\b(\d{4,5})\b", ports):
        port = int(port)
        in_range = any(
            isinstance(r, str) and int(r.split("-")[0]) <= port <= int(r.split("-")[1])
            for r in lists["pool_ports"]
        )
        assert port in numeric or in_range or port in (8080, 8888), port
    for flag in (
        "--donate-level",
        "--nicehash",
        "--cpu-max-threads-hint",
        "--pause-on-active",
        "--randomx-1gb-pages",
        "--low-load",
        "--lock-cclock",
        "--coin",
        "-wal",
        "-pool",
    ):
        assert flag in lists["miner_flags"], flag
    for name in ("kworker*", "kthreadd", "kdevtmpfs*", "bioset*"):
        assert name in lists["kernel_thread_names"]


def test_site_file_extends_and_overrides(tmp_path):
    site = write(
        tmp_path,
        "site.yaml",
        """\
version: 1
lists:
  pool_ports: {extend: [1234, 3333]}
  pool_domains: {remove: [nicehash.com]}
  shells: [fish]
rules:
  - id: exe-deleted
    override: {enabled: false}
  - id: net-pool-port
    override: {weight: 5, severity: medium}
  - id: site-own-rule
    description: GPU compute by the intern account
    severity: low
    weight: 10
    condition: {signal: user, is: intern}
allowlist:
  - id: site-trainer
    exe: /opt/train/bin/trainer
  - id: nvidia-smi
    override: {enabled: false}
thresholds: {suspicious: 30}
actions: {malicious: kill}
""",
    )
    ruleset = load_ruleset([shipped_rules_file(), site])
    assert ruleset.lists["pool_ports"].count(3333) == 1 and ruleset.lists["pool_ports"][-1] == 1234
    assert "nicehash.com" not in ruleset.lists["pool_domains"]
    assert ruleset.lists["shells"] == ["fish"]
    assert ruleset.rule("exe-deleted").enabled is False
    assert ruleset.rule("exe-deleted") in ruleset.disabled
    assert (ruleset.rule("net-pool-port").weight, ruleset.rule("net-pool-port").severity) == (
        5,
        "medium",
    )
    assert ruleset.rules[-1].id == "site-own-rule" and ruleset.rules[-1].signals == ("user",)
    assert [e.id for e in ruleset.allowlist.entries] == [
        "nvidia-persistenced",
        "dcgm-hostengine",
        "site-trainer",
    ]
    assert (ruleset.thresholds.suspicious, ruleset.thresholds.malicious) == (30, 75)
    assert ruleset.actions["malicious"] == "kill"


def test_override_of_condition_uses_the_site_position(tmp_path):
    site = write(
        tmp_path,
        "site.yaml",
        """\
version: 1
rules:
  - id: exe-deleted
    override:
      condition: {signal: exe_deleted, is: 3}
""",
    )
    with pytest.raises(GpuguardError) as err:
        load_ruleset([shipped_rules_file(), site])
    assert f"{site}:5:44: rule exe-deleted: is: exe_deleted is a bool signal" in err.value.cause


def test_invalid_file_is_one_line_error_with_position(tmp_path):
    bad = write(
        tmp_path,
        "bad.yaml",
        "version: 1\nrules:\n  - id: x\n    description: d\n    severity: high\n"
        "    weight: 10\n    condition: {signal: no_such_signal, is: true}\n",
    )
    with pytest.raises(GpuguardError) as err:
        load_ruleset([bad])
    line = err.value.one_line()
    assert "\n" not in line
    assert line.startswith(f"invalid rules: {bad}:7:25: rule x: unknown signal 'no_such_signal'")
    assert "gpuguard rules validate" in err.value.fix


def test_missing_file(tmp_path):
    with pytest.raises(GpuguardError, match="rules file not found"):
        load_ruleset([tmp_path / "nope.yaml"])


def test_refuses_world_writable_copy(tmp_path):
    copy = tmp_path / "miner-rules.yaml"
    shutil.copy(shipped_rules_file(), copy)
    shutil.copytree(shipped_rules_dir() / "yara", tmp_path / "yara")
    copy.chmod(0o644)
    assert load_ruleset([copy]).rules
    os.chmod(copy, 0o646)  # chmod o+w
    with pytest.raises(GpuguardError) as err:
        load_ruleset([copy])
    assert (
        err.value.cause == f"refusing rules file {copy}: it is writable by group/others (mode 0646)"
    )
    assert err.value.fix == f"chmod go-w {copy}"


def test_refuses_group_writable_yara_file(tmp_path):
    copy = tmp_path / "miner-rules.yaml"
    shutil.copy(shipped_rules_file(), copy)
    shutil.copytree(shipped_rules_dir() / "yara", tmp_path / "yara")
    os.chmod(tmp_path / "yara" / "miners.yar", 0o664)
    with pytest.raises(
        GpuguardError, match="refusing YARA file .*miners.yar: it is writable by group/others"
    ):
        load_ruleset([copy])


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership rule applies when running as root")
def test_refuses_file_owned_by_non_root_when_root(tmp_path):
    path = write(tmp_path, "site.yaml", "version: 1\n")
    os.chown(path, 1000, 1000)
    with pytest.raises(GpuguardError) as err:
        load_ruleset([path])
    assert "owned by uid 1000, not root" in err.value.cause
    assert err.value.fix == f"chown root: {path}"


def test_refuses_file_in_world_writable_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    path = write(shared, "site.yaml", "version: 1\n")
    os.chmod(shared, 0o777)
    with pytest.raises(GpuguardError, match="its directory .* is writable by group/others"):
        load_ruleset([path])
    os.chmod(shared, 0o1777)  # sticky: others cannot replace root's file
    assert load_ruleset([path]).rules == []
