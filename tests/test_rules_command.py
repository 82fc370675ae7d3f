"""`gpuguard rules validate|test|list|signals` through the CLI: output and exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuguard.detect.ruleset.shipped import shipped_rules_dir, shipped_rules_file

REPO = Path(__file__).resolve().parent.parent
CASES_DIR = REPO / "tests" / "cases"


def gpuguard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validate_shipped_rules():
    done = gpuguard("validate", str(shipped_rules_file()))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok: {shipped_rules_file()}\n"


def test_validate_defaults():
    done = gpuguard("validate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {shipped_rules_file()}")


def test_validate_reports_every_problem_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nrules:\n  - id: r\n    description: d\n    severity: high\n    weight: 5\n"
        "    condition: {signal: cmdline, matches: '(x'}\n  - id: s\n    description: d\n    severity: nope\n"
        "    weight: 5\n    condition: {signal: uid, is: 0}\n"
    )
    done = gpuguard("validate", str(bad))
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f"{bad}:7:43: rule r: bad regular expression '(x': missing ), unterminated subpattern at position 0",
        f"{bad}:10:15: rule s: severity 'nope' must be one of info, low, medium, high, critical",
    ]
    assert done.stderr == "2 problems\n"
    assert "Traceback" not in done.stderr


def test_validate_site_file_with_defaults(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("version: 1\nlists:\n  pool_ports: {extend: [2222]}\n")
    alone = gpuguard("validate", str(site))
    assert alone.returncode == 2 and "--with-defaults" in alone.stdout
    layered = gpuguard("validate", "--with-defaults", str(site))
    assert layered.returncode == 0, layered.stdout


def test_validate_refuses_world_writable_copy(tmp_path):
    copy = tmp_path / "miner-rules.yaml"
    shutil.copy(shipped_rules_file(), copy)
    shutil.copytree(shipped_rules_dir() / "yara", tmp_path / "yara")
    copy.chmod(0o644)
    assert gpuguard("validate", str(copy)).returncode == 0
    os.chmod(copy, 0o646)
    done = gpuguard("validate", str(copy))
    assert done.returncode == 2
    assert done.stdout == (
        f"{copy}:1:1: refusing rules file {copy}: it is writable by group/others (mode 0646) "
        f"(fix: chmod go-w {copy})\n"
    )


def test_test_passes_on_shipped_cases():
    done = gpuguard("test")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[-1] == f"{len(lines) - 1} passed, 0 failed"
    assert all(line.startswith("PASS ") for line in lines[:-1])


def test_test_fails_with_diff_and_exit_1(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(
        "version: 1\nrules:\n  - id: net-pool-protocol\n    override: {enabled: false}\n"
    )
    done = gpuguard(
        "test",
        "--rules",
        str(shipped_rules_file()),
        "--rules",
        str(site),
        "--cases",
        str(CASES_DIR / "miner_socks5_proxy"),
    )
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "FAIL miner_socks5_proxy"
    assert "    comm=dbus-worker (pid 6200): missing rules net-pool-protocol" in done.stdout
    assert "      - net-pool-protocol (expected, not matched)" in done.stdout
    assert done.stdout.splitlines()[-1] == "0 passed, 1 failed"


def test_test_with_broken_rules_is_one_line_exit_2(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\nrules: [\n")
    done = gpuguard("test", "--rules", str(broken))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        f"gpuguard: invalid rules: {broken}:3:1: YAML syntax error"
    )


def test_list_and_signals():
    listing = gpuguard("list")
    assert listing.returncode == 0
    assert any(
        line.startswith("miner-cmdline-stratum") and "+40" in line
        for line in listing.stdout.splitlines()
    )
    assert "(disabled)" in listing.stdout
    signals = gpuguard("signals")
    assert signals.returncode == 0
    assert any(
        line.split()[1:3] == ["gpu_util_variance", "number"]
        for line in signals.stdout.splitlines()
        if line.strip()
    )
    assert "operator domain_in_list" in signals.stdout


def test_no_action_prints_usage():
    done = gpuguard()
    assert done.returncode == 2 and "usage: gpuguard rules" in done.stderr
