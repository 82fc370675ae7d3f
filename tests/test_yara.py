"""YARA: real compilation, a real miner-like program scanned through /proc (file, deleted file, memory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_dir, shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.yara import scan as yara_scan
from gpuguard.detect.yara.scan import YaraScanner, compile_files, yara_problems
from gpuguard.sources.proc.config_files import attach_config_files
from gpuguard.sources.proc.process import collect_process_facts

MARKER = "gpuguard-memory-marker mining.set_target"
KEY = 0x5A
C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* Strings a miner binary carries (indicators.md), plus a marker that only exists decoded in the heap. */
static const char banner[] = "XMRig/%s libuv/%s";
static const char keys[] = "'h' hashrate, 'p' pause, 'r' resume";
static const char donate[] = "donate.v2.xmrig.com";
static const unsigned char encoded[] = { ENCODED };
int main(void) {
    char *heap = malloc(1 << 20);
    for (size_t i = 0; i < sizeof(encoded); i++) heap[i] = encoded[i] ^ KEY;
    heap[sizeof(encoded)] = 0;
    volatile const char *keep[] = { banner, keys, donate, heap };
    printf("ready %p\n", (void *)keep);
    fflush(stdout);
    pause();
    return 0;
}
"""
MEMORY_RULE = f"""
rule heap_marker : miner
{{
    meta:
        scope = "memory"
    strings:
        $m = "{MARKER}"
    condition:
        $m
}}
"""

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


@pytest.fixture(scope="module")
def miner_binary(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    work = tmp_path_factory.mktemp("miner")
    encoded = ", ".join(str(ord(c) ^ KEY) for c in MARKER)
    source = work / "fake_miner.c"
    source.write_text(C_SOURCE.replace("ENCODED", encoded).replace("KEY", str(KEY)))
    binary = work / "fake_miner"
    subprocess.run(["gcc", "-O0", "-o", str(binary), str(source)], check=True)
    assert MARKER.encode() not in binary.read_bytes()  # only the decoded heap copy holds it
    return binary


def start(binary: Path) -> subprocess.Popen:
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"ready")
    return proc


@pytest.fixture
def scanner() -> YaraScanner:
    return YaraScanner.from_files(sorted((shipped_rules_dir() / "yara").glob("*.yar")))


@pytest.fixture
def memory_scanner(tmp_path) -> YaraScanner:
    path = tmp_path / "memory.yar"
    path.write_text(MEMORY_RULE)
    return YaraScanner.from_files([path])


def test_shipped_yara_compiles_once(scanner):
    paths = sorted((shipped_rules_dir() / "yara").glob("*.yar"))
    assert compile_files(paths) is compile_files(paths)
    assert scanner.wants_memory
    assert set(scanner._scopes) == {
        "xmrig_strings",
        "cpuminer_strings",
        "stratum_client_strings",
        "stratum_url_in_cmdline",
    }


def test_a_validated_file_is_not_compiled_again(tmp_path, monkeypatch):
    """Loading rules validates the YARA file by compiling it; a scan's compile_files reuses that
    (one file: compiled once per scan, not twice), and a file with problems is not kept."""
    good = tmp_path / "one.yar"
    good.write_text('rule one { strings: $a = "xmrig-marker" condition: $a }\n')
    bad = tmp_path / "bad.yar"
    bad.write_text('rule bad { meta: scope = "nowhere" strings: $a = "x" condition: $a }\n')
    assert yara_problems([good]) == []
    compiled = []
    real = yara_scan.yara.compile
    monkeypatch.setattr(yara_scan.yara, "compile", lambda **kw: compiled.append(kw) or real(**kw))
    rules = compile_files([good])
    assert compiled == []
    assert [m.rule for m in rules.match(data=b"an xmrig-marker here")] == ["one"]
    assert yara_problems([bad]) != [] and len(compiled) == 1
    compile_files([bad])
    assert len(compiled) == 2  # compiled for the scan: the one with problems was not kept


def test_memory_rules_never_demand_an_elf_header():
    for path in (shipped_rules_dir() / "yara").glob("*.yar"):
        assert "0x464c457f" not in path.read_text().lower()


def test_scan_file(miner_binary, scanner):
    result = scanner.scan_file(str(miner_binary))
    assert result.rules == ("xmrig_strings",) and result.tags == ("miner",)
    assert scanner.scan_file(sys.executable).rules == ()


def test_scan_running_process_and_cache_by_identity(miner_binary, scanner):
    first, second = start(miner_binary), start(miner_binary)
    try:
        facts1, facts2 = collect_process_facts(first.pid), collect_process_facts(second.pid)
        assert facts1.exe_identity == facts2.exe_identity
        assert scanner.scan_process(facts1).rules == ("xmrig_strings",)
        assert scanner.scan_process(facts2).rules == ("xmrig_strings",)
        assert (scanner.stats["file_scans"], scanner.stats["file_cache_hits"]) == (1, 1)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def test_scan_deleted_executable_through_proc(miner_binary, scanner, tmp_path):
    copy = tmp_path / "kworker"
    shutil.copy(miner_binary, copy)
    proc = start(copy)
    try:
        copy.unlink()
        facts = collect_process_facts(proc.pid)
        assert facts.exe_deleted
        assert scanner.scan_process(facts).rules == ("xmrig_strings",)
    finally:
        proc.kill()
        proc.wait()


def test_memory_scan_finds_what_the_file_does_not(miner_binary, memory_scanner):
    proc = start(miner_binary)
    try:
        assert memory_scanner.scan_file(f"/proc/{proc.pid}/exe").rules == ()
        result = memory_scanner.scan_memory(proc.pid)
        assert result.rules == ("heap_marker",) and result.tags == ("miner",)
        assert memory_scanner.scan_process(collect_process_facts(proc.pid)).rules == (
            "heap_marker",
        )
        assert 0 < memory_scanner.stats["memory_bytes"] <= 2 * memory_scanner.memory_bytes
    finally:
        proc.kill()
        proc.wait()


def test_memory_scan_respects_the_byte_cap(miner_binary, tmp_path):
    path = tmp_path / "memory.yar"
    path.write_text(MEMORY_RULE)
    capped = YaraScanner.from_files([path], memory_bytes=4096)
    proc = start(miner_binary)
    try:
        capped.scan_memory(proc.pid)
        assert capped.stats["memory_bytes"] <= 4096
    finally:
        proc.kill()
        proc.wait()


def test_memory_scan_of_a_vanished_process(memory_scanner):
    assert memory_scanner.scan_memory(2**22 + 12345).rules == ()
    assert memory_scanner.stats["errors"] == 1


def test_cmdline_and_environ_scopes(scanner):
    env = dict(os.environ, POOL="stratum+ssl://pool.example:443")
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "stratum+tcp://a.b:3333"]
    )
    quiet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.2)
        assert scanner.scan_process(collect_process_facts(proc.pid)).rules == (
            "stratum_url_in_cmdline",
        )
        assert scanner.scan_process(collect_process_facts(quiet.pid)).rules == (
            "stratum_url_in_cmdline",
        )
        assert (
            scanner.scan_data(b"stratum+tcp://a.b:1", "memory").rules == ()
        )  # out of the rule's scope
    finally:
        for p in (proc, quiet):
            p.kill()
            p.wait()


def test_correlator_scans_new_processes_and_the_rule_fires(miner_binary):
    ruleset = load_ruleset([shipped_rules_file()])
    proc = start(miner_binary)
    try:
        correlator = Correlator(
            facts_provider=collect_process_facts, config_reader=attach_config_files
        )
        engine = DetectionEngine(correlator, ruleset, yara_scanner=ruleset.yara_scanner())
        correlator.feed(collect_process_facts(proc.pid))
        state = correlator.state_of(proc.pid)
        assert state.yara_matches == {"xmrig_strings"} and state.yara_tags == {"miner"}
        (verdict,) = engine.score(time.time())
        assert "yara-miner" in {e.rule_id for e in verdict.evidence}
        assert (
            next(e for e in verdict.evidence if e.rule_id == "yara-miner").detail
            == "yara_tags contains miner"
        )
    finally:
        proc.kill()
        proc.wait()


def test_same_command_line_and_environment_matched_once(scanner):
    """Workers started alike cost one match each way; a different content is matched anew,
    and each scope keeps its own answer for the same bytes."""
    data = b"miner\0-o\0stratum+tcp://a.b:3333"
    first = scanner.scan_data(data, "cmdline")
    assert first.rules == ("stratum_url_in_cmdline",)
    assert scanner.scan_data(data, "cmdline") == first
    assert scanner.stats["data_cache_hits"] == 1
    assert scanner.scan_data(data, "memory").rules == ()  # same bytes, another scope
    assert scanner.scan_data(b"sleep\x003600", "cmdline").rules == ()
    assert scanner.scan_data(data, "cmdline") == first
    assert scanner.stats["data_cache_hits"] == 2
