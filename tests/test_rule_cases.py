"""Every golden case under tests/cases replays to the verdicts its expected.yaml demands."""

from __future__ import annotations

import shutil

import pytest
import yaml

from gpuguard.detect.cases import default_cases_dir, replay, run_case, run_cases
from gpuguard.detect.rules import load_ruleset
from gpuguard.detect.shipped import shipped_rules_file
from gpuguard.errors import GpuguardError

CASES = sorted(p for p in default_cases_dir().iterdir() if (p / "expected.yaml").is_file())
REQUIRED = {"miner_stratum_cmdline", "renamed_miner_shm", "miner_config_file", "miner_socks5_proxy",
            "benign_pytorch_training", "benign_inference_server", "monitoring_agents", "cuda_compile_nvcc",
            "idle_gpu_holder"}


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def test_all_required_cases_exist():
    assert REQUIRED <= {p.name for p in CASES}


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_case(case, ruleset):
    result = run_case(case, ruleset)
    assert result.passed, "\n".join(result.report_lines())


def test_no_benign_process_is_suspicious(ruleset):
    for case in CASES:
        if case.name.startswith(("miner", "renamed")):
            continue
        verdicts, _ = replay(case / "capture.ggrec", ruleset)
        assert verdicts
        assert all(v.verdict == "clean" for v in verdicts), [v.explain() for v in verdicts]


def test_miners_are_malicious(ruleset):
    for case in CASES:
        if case.name.startswith(("miner", "renamed")):
            verdicts, _ = replay(case / "capture.ggrec", ruleset)
            assert max(v.score for v in verdicts) == 100
            assert any(v.verdict == "malicious" for v in verdicts)


def test_replay_is_deterministic(ruleset):
    case = default_cases_dir() / "renamed_miner_shm" / "capture.ggrec"
    first = [v.to_json() for v in replay(case, ruleset)[0]]
    second = [v.to_json() for v in replay(case, ruleset)[0]]
    assert first == second


def test_a_wrong_expectation_fails_with_an_evidence_diff(tmp_path, ruleset):
    case = tmp_path / "miner"
    shutil.copytree(default_cases_dir() / "miner_stratum_cmdline", case)
    expected = yaml.safe_load((case / "expected.yaml").read_text())
    expected["processes"][0]["rules"].append("exe-memfd")
    expected["processes"][0]["forbidden_rules"] = ["net-pool-port"]
    (case / "expected.yaml").write_text(yaml.safe_dump(expected))
    result = run_case(case, ruleset)
    assert not result.passed
    assert result.failures == ["comm=xmrig, exe=*/xmrig (pid 4242): missing rules exe-memfd; "
                               "forbidden rules matched net-pool-port"]
    assert "    - exe-memfd (expected, not matched)" in result.diffs
    assert any(line.startswith("    ! net-pool-port (+15) connect_ports=3333") for line in result.diffs)
    assert any(line.startswith("    = miner-cmdline-stratum (+40) cmdline_url_schemes=stratum+tcp") for line in result.diffs)


def test_disabling_a_rule_makes_a_case_fail(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("version: 1\nrules:\n  - id: miner-config-keys\n    override: {enabled: false}\n")
    ruleset = load_ruleset([shipped_rules_file(), site])
    result = run_case(default_cases_dir() / "miner_config_file", ruleset)
    assert not result.passed
    assert "missing rules miner-config-keys" in result.failures[0]


def test_others_clean_catches_unlisted_processes(tmp_path, ruleset):
    case = tmp_path / "c"
    shutil.copytree(default_cases_dir() / "miner_stratum_cmdline", case)
    (case / "expected.yaml").write_text("others: clean\nprocesses:\n  - match: {comm: bash}\n    verdict: clean\n")
    result = run_case(case, ruleset)
    assert result.failures == ["unlisted pid 4242 xmrig is malicious (others: clean)"]


def test_run_cases_errors(tmp_path, ruleset):
    with pytest.raises(GpuguardError, match="no golden cases"):
        run_cases(tmp_path, ruleset)
    case = tmp_path / "bad"
    case.mkdir()
    (case / "expected.yaml").write_text("processes: [{match: {comm: x}, verdict: evil}]\n")
    with pytest.raises(GpuguardError, match="verdict must be one of"):
        run_cases(tmp_path, ruleset)
