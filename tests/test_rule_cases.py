"""Every golden case under tests/cases replays to the verdicts its expected.yaml demands."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
import yaml

from gpuguard.detect.cases import replay, run_case, run_cases
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.errors import GpuguardError
from gpuguard.events.wire import iter_recording

CASES_DIR = Path(__file__).resolve().parent / "cases"
CASES = sorted(p for p in CASES_DIR.iterdir() if (p / "expected.yaml").is_file())


def expected_of(case: Path) -> dict:
    return yaml.safe_load((case / "expected.yaml").read_text())


def expects_only_clean(case: Path) -> bool:
    """A benign case, by what its expected.yaml says: every process clean, and the others too."""
    expected = expected_of(case)
    return expected.get("others") == "clean" and all(
        p.get("verdict") == "clean" for p in expected["processes"]
    )


def expects_malicious(case: Path) -> bool:
    """A miner case, by what its expected.yaml says: some process must be malicious."""
    return any(p.get("verdict") == "malicious" for p in expected_of(case)["processes"])


BENIGN = [c for c in CASES if expects_only_clean(c)]
MINERS = [c for c in CASES if expects_malicious(c)]
REQUIRED = {
    "miner_stratum_cmdline",
    "renamed_miner_shm",
    "miner_config_file",
    "miner_socks5_proxy",
    "benign_pytorch_training",
    "benign_inference_server",
    "monitoring_agents",
    "cuda_compile_nvcc",
    "idle_gpu_holder",
    "cpu_miner_stringless",
    "benign_hugepage_users",
}


@pytest.fixture(scope="module")
def ruleset():
    return load_ruleset([shipped_rules_file()])


def test_all_required_cases_exist():
    assert REQUIRED <= {p.name for p in CASES}
    # Every case is one or the other, so the two checks below cover them all.
    assert len(BENIGN) >= 5 and len(MINERS) >= 4 and set(BENIGN) | set(MINERS) == set(CASES)


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_case(case, ruleset):
    result = run_case(case, ruleset)
    assert result.passed, "\n".join(result.report_lines())


def test_no_benign_process_is_suspicious(ruleset):
    for case in BENIGN:
        verdicts, _ = replay(case / "capture.ggrec", ruleset)
        assert verdicts
        assert all(v.verdict == "clean" for v in verdicts), [v.explain() for v in verdicts]


def test_miners_are_malicious(ruleset):
    for case in MINERS:
        verdicts, _ = replay(case / "capture.ggrec", ruleset)
        assert max(v.score for v in verdicts) == 100
        assert any(v.verdict == "malicious" for v in verdicts)


def test_replay_is_deterministic(ruleset):
    case = CASES_DIR / "renamed_miner_shm" / "capture.ggrec"
    first = [v.to_json() for v in replay(case, ruleset)[0]]
    second = [v.to_json() for v in replay(case, ruleset)[0]]
    assert first == second


def test_a_wrong_expectation_fails_with_an_evidence_diff(tmp_path, ruleset):
    case = tmp_path / "miner"
    shutil.copytree(CASES_DIR / "miner_stratum_cmdline", case)
    expected = yaml.safe_load((case / "expected.yaml").read_text())
    expected["processes"][0]["rules"].append("exe-memfd")
    expected["processes"][0]["forbidden_rules"] = ["net-pool-port"]
    (case / "expected.yaml").write_text(yaml.safe_dump(expected))
    result = run_case(case, ruleset)
    assert not result.passed
    assert result.failures == [
        "comm=xmrig, exe=*/xmrig (pid 4242): missing rules exe-memfd; "
        "forbidden rules matched net-pool-port"
    ]
    assert "    - exe-memfd (expected, not matched)" in result.diffs
    assert any(
        line.startswith("    ! net-pool-port (+15) connect_ports=3333") for line in result.diffs
    )
    assert any(
        line.startswith("    = miner-cmdline-stratum (+40) cmdline_url_schemes=stratum+tcp")
        for line in result.diffs
    )


def test_disabling_a_rule_makes_a_case_fail(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(
        "version: 1\nrules:\n  - id: miner-config-keys\n    override: {enabled: false}\n"
    )
    ruleset = load_ruleset([shipped_rules_file(), site])
    result = run_case(CASES_DIR / "miner_config_file", ruleset)
    assert not result.passed
    assert "missing rules miner-config-keys" in result.failures[0]


def test_others_clean_catches_unlisted_processes(tmp_path, ruleset):
    case = tmp_path / "c"
    shutil.copytree(CASES_DIR / "miner_stratum_cmdline", case)
    (case / "expected.yaml").write_text(
        "others: clean\nprocesses:\n  - match: {comm: bash}\n    verdict: clean\n"
    )
    result = run_case(case, ruleset)
    assert result.failures == ["unlisted pid 4242 xmrig is malicious (others: clean)"]


def test_run_cases_errors(tmp_path, ruleset):
    with pytest.raises(GpuguardError, match="no golden cases"):
        run_cases(tmp_path, ruleset)
    case = tmp_path / "bad"
    case.mkdir()
    (case / "expected.yaml").write_text("processes: [{match: {comm: x}, verdict: evil}]\n")
    (result,) = run_cases(tmp_path, ruleset)  # a bad case is that case's failure, not the run's
    assert not result.passed and "verdict must be one of" in result.failures[0]


def test_a_broken_case_fails_alone_and_the_others_still_run(tmp_path, ruleset):
    for name in ("a_good", "b_binary_expected", "c_bad_capture", "d_bad_types", "e_fifo_expected"):
        shutil.copytree(CASES_DIR / "miner_stratum_cmdline", tmp_path / name)
    (tmp_path / "b_binary_expected" / "expected.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "c_bad_capture" / "capture.ggrec").write_bytes(b"\x93\x01\x02garbage" * 10)
    (tmp_path / "d_bad_types" / "expected.yaml").write_text(
        "processes: [{match: {comm: x}, rules: 5}]\n"
    )
    fifo = tmp_path / "e_fifo_expected" / "expected.yaml"
    fifo.unlink()
    os.mkfifo(fifo)
    results = {r.name: r for r in run_cases(tmp_path, ruleset)}
    assert list(results) == [
        "a_good",
        "b_binary_expected",
        "c_bad_capture",
        "d_bad_types",
        "e_fifo_expected",
    ]
    assert results["a_good"].passed
    for name in ("b_binary_expected", "c_bad_capture", "d_bad_types", "e_fifo_expected"):
        assert not results[name].passed and results[name].failures[0].startswith(
            "cannot run the case: "
        ), name
    assert "not UTF-8" in results["b_binary_expected"].failures[0]
    assert "rules must be a list" in results["d_bad_types"].failures[0]
    assert "FIFO" in results["e_fifo_expected"].failures[0]


def _load_make_cases():
    spec = importlib.util.spec_from_file_location("make_cases", CASES_DIR / "make_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_cases_still_produces_the_golden_captures(tmp_path):
    """The binary captures are what make_cases.py writes today (decoded items compared: headers carry time and host)."""
    make_cases = _load_make_cases()
    assert set(make_cases.CASES) == {c.name for c in CASES}
    for name, (description, build) in make_cases.CASES.items():
        written = make_cases.write_case(name, description, build(), out_dir=tmp_path)
        regenerated = list(iter_recording(written))
        committed = list(iter_recording(CASES_DIR / name / "capture.ggrec"))
        assert regenerated, name
        assert regenerated == committed, (
            f"{name}: tests/cases/{name}/capture.ggrec is stale; run tests/cases/make_cases.py"
        )
