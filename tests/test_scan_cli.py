"""`gpuguard scan` as a user runs it: usage errors, a non-root run, the persistent YARA cache."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.yara.persistent import PersistentYaraScanner
from gpuguard.sources.host.yara_verdict_cache import CACHE_NAME, DEFAULT_CACHE_DIR
from gpuguard.sources.host.yara_verdict_cache import ENV as YARA_CACHE_ENV
from gpuguard.sources.proc.process import collect_process_facts
from tests.support.scan import REPO, run_scan, scan_json, sleeper


def _one_line_error(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_broken_rules_file_is_exit_2_with_position(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: x\n    weight: [\n")
    os.chmod(bad, 0o644)
    line = _one_line_error(run_scan("--rules", str(bad)))
    assert line.startswith(f"gpuguard: invalid rules: {bad}:")
    assert "(fix: " in line


def test_usage_errors_are_one_line(tmp_path: Path):
    assert "--cpu-sample -1" in _one_line_error(run_scan("--cpu-sample", "-1"))
    assert "is not a directory" in _one_line_error(run_scan("--root", str(tmp_path / "missing")))
    assert "contradict" in _one_line_error(run_scan("--json", "--format", "ocsf"))
    assert "--no-yara" in _one_line_error(run_scan("--deep", "--no-yara"))


def test_world_writable_rules_file_refused(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    shutil.copy(REPO / "rules" / "miner-rules.yaml", rules)
    os.chmod(rules, 0o666)
    assert "writable by group/others" in _one_line_error(run_scan("--rules", str(rules)))


@pytest.mark.root
@pytest.mark.self_contained
def test_non_root_scan_degrades_and_says_what_it_missed():
    with sleeper():  # at least one root-owned process the scan cannot look into
        result = run_scan("--json", "--no-yara", user="nobody")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1)
    doc = json.loads(result.stdout)
    assert doc["scanner"]["euid"] == 65534
    unseen = doc["summary"]["could_not_see"]
    exe_line = next(line for line in unseen if line.startswith("could not read /proc/PID/exe for "))
    count = int(exe_line.split()[5])
    assert count > 0
    assert (
        exe_line
        == f"could not read /proc/PID/exe for {count} processes owned by other users; run as root to see them"
    )
    assert any(line.startswith("could not read /proc/PID/fd for ") for line in unseen)


@pytest.mark.root
@pytest.mark.self_contained
def test_non_root_table_lists_blind_spots():
    result = run_scan("--no-yara", "--cpu-sample", "0", user="nobody")
    assert "Traceback" not in result.stderr and result.returncode in (0, 1)
    assert "not seen: could not read /proc/PID/exe for " in result.stdout


@pytest.mark.root
@pytest.mark.self_contained
def test_deep_scan_reads_memory(tmp_path: Path):
    rc, doc, stderr = scan_json("--deep", "--cpu-sample", "0", "--root", str(tmp_path))
    assert doc["scanner"]["options"]["deep"] is True
    assert doc["summary"]["counters"]["yara_memory_scans"] > 0
    assert "scanning memory" not in stderr  # no progress bar when stderr is not a terminal


# ---- the YARA cache --------------------------------------------------------------


@pytest.fixture
def yara_paths() -> list[Path]:
    return load_ruleset(None).yara_files


def _facts_of_self():
    return collect_process_facts(os.getpid())


@pytest.mark.root
@pytest.mark.self_contained
def test_the_yara_cache_is_where_gpuguard_yara_cache_says(tmp_path: Path, yara_paths, monkeypatch):
    """A directory of its own (the test suite's, a benchmark's), ``off``, or by default the
    host's /var/cache/gpuguard."""
    monkeypatch.setenv(YARA_CACHE_ENV, str(tmp_path / "elsewhere"))
    scanner = PersistentYaraScanner.for_files(yara_paths)
    scanner.scan_process(_facts_of_self())
    scanner.save()
    assert (tmp_path / "elsewhere" / CACHE_NAME).is_file()
    monkeypatch.setenv(YARA_CACHE_ENV, "off")
    assert PersistentYaraScanner.for_files(yara_paths).cache_dir is None
    monkeypatch.delenv(YARA_CACHE_ENV)
    assert PersistentYaraScanner.for_files(yara_paths).cache_dir == DEFAULT_CACHE_DIR


@pytest.mark.root
@pytest.mark.self_contained
def test_yara_cache_persists_across_runs(tmp_path: Path, yara_paths):
    cache_dir = tmp_path / "cache"
    first = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    first.scan_process(_facts_of_self())
    first.save()
    cache_file = cache_dir / CACHE_NAME
    st = os.stat(cache_file)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert first.stats["file_scans"] == 1

    second = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    second.scan_process(_facts_of_self())
    assert second.stats["file_scans"] == 0
    assert second.stats["disk_cache_hits"] == 1
    assert second.wants_memory is False and second.memory_capable is True


@pytest.mark.root
@pytest.mark.self_contained
def test_yara_cache_from_other_rules_is_discarded(tmp_path: Path, yara_paths):
    cache_dir = tmp_path / "cache"
    scanner = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    scanner.scan_process(_facts_of_self())
    scanner.save()
    data = json.loads((cache_dir / CACHE_NAME).read_text())
    data["rules"] = "0" * 64
    (cache_dir / CACHE_NAME).write_text(json.dumps(data))
    again = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    again.scan_process(_facts_of_self())
    assert again.stats["file_scans"] == 1 and again.stats["disk_cache_hits"] == 0


@pytest.mark.root
@pytest.mark.self_contained
def test_yara_cache_not_trusted_when_others_can_write(tmp_path: Path, yara_paths):
    cache_dir = tmp_path / "cache"
    PersistentYaraScanner.for_files(yara_paths, cache_dir).scan_process(_facts_of_self())
    scanner = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    scanner.scan_process(_facts_of_self())
    scanner.save()
    os.chown(cache_dir / CACHE_NAME, 65534, 65534)  # a file someone else owns
    owned = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    assert "not root" in owned.note
    owned.scan_process(_facts_of_self())
    assert owned.stats["disk_cache_hits"] == 0
    os.chown(cache_dir / CACHE_NAME, 0, 0)
    os.chmod(cache_dir, 0o777)  # a directory anyone can write
    open_dir = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    assert "writable by group/others" in open_dir.note
    open_dir.scan_process(_facts_of_self())
    assert open_dir.stats["disk_cache_hits"] == 0
    assert open_dir.cache_dir is None  # and it will not write there either


@pytest.mark.root
@pytest.mark.self_contained
def test_yara_cache_key_changes_when_file_rewritten_in_place(tmp_path: Path, yara_paths):
    target = tmp_path / "binary"
    target.write_bytes(b"\x7fELF" + b"\0" * 100)
    cache_dir = tmp_path / "cache"
    scanner = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    st = os.stat(target)
    scanner.scan_file(str(target), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    scanner.save()
    time.sleep(0.01)
    target.write_bytes(b"\x7fELF" + b"\1" * 100)  # same size ...
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the old mtime restored
    again = PersistentYaraScanner.for_files(yara_paths, cache_dir)
    again.scan_file(str(target), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    assert again.stats["disk_cache_hits"] == 0 and again.stats["file_scans"] == 1
