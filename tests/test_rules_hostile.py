"""Hostile and careless rule inputs (issue 10): limits before composing, special files, RE2, short excerpts.

Each test here failed (hung, crashed or leaked) on the code before this change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.config.yaml_marks import MAX_DEPTH, MAX_NODES
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import MAX_RULES_FILE_BYTES, load_ruleset, validate_rules
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.score import score_process
from gpuguard.errors import GpuguardError
from gpuguard.events.process_facts import ProcessFacts
from tests.support.scan import run_scan

REPO = Path(__file__).resolve().parent.parent
HEAD = "version: 1\n"


def rules_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=timeout,
    )


def only_problem(path: Path) -> str:
    problems = validate_rules([path])
    assert len(problems) == 1, [str(p) for p in problems]
    return str(problems[0])


def alias_bomb() -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) values from ~600 bytes."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=False):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return HEAD + "\n".join(lines) + "\n"


# ---- limits before composing ---------------------------------------------------------


def test_alias_bomb_is_refused_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 700
    started = time.thread_time()  # CPU time: the bound holds on a busy host
    line = only_problem(path)
    assert time.thread_time() - started < 2
    assert f"more than {MAX_NODES:,} values once aliases are expanded" in line


def test_deep_nesting_is_refused_without_crashing(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(HEAD + "x: " + "[" * 50_000 + "]" * 50_000 + "\n")
    # In a child: before, the C composer recursed 50,000 levels and the interpreter died with SIGSEGV.
    done = rules_cli("validate", str(path))
    # Whichever parser refuses first (gpuguard's depth bound, or a YAML library that has one of
    # its own), gpuguard says so in one line that names the file and a line:column in it.
    assert done.returncode == 2, done.stderr
    assert done.stdout.count("\n") == 1, done.stdout
    line = done.stdout.strip()
    assert re.match(rf"{re.escape(str(path))}:2:\d+: \S", line), line
    assert "Traceback" not in done.stdout + done.stderr
    # Deeper than gpuguard's bound but shallow for any YAML library: gpuguard's own refusal.
    path.write_text(HEAD + "x: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n")
    assert f"nesting deeper than {MAX_DEPTH} levels" in only_problem(path)


def test_huge_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + "lists:\n  names: [" + "a, " * 1000 + "]\n")
    os.truncate(path, 50 << 20)  # 50 MB (sparse: the test itself stays cheap)
    started = time.thread_time()  # CPU time: the bound holds on a busy host
    line = only_problem(path)
    assert time.thread_time() - started < 2
    assert (
        line
        == f"{path}:1:1: rules file is larger than the {MAX_RULES_FILE_BYTES // 1024} KiB limit "
        f"(fix: split it into smaller files (each under {MAX_RULES_FILE_BYTES // 1024} KiB))"
    )


# ---- special files --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_rules_path_that_is_not_a_file_says_what_it_is(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "rules.yaml"
        os.mkfifo(path)
        expected = "a FIFO (named pipe)"
    elif kind == "directory":
        path, expected = tmp_path, "a directory"
    else:
        path, expected = Path("/dev/zero"), "a character device"
    done = rules_cli("validate", str(path), timeout=20)
    assert done.returncode == 2
    assert (
        done.stdout
        == f"{path}:1:1: rules file is {expected}, not a regular file (fix: name a regular file)\n"
    )
    with pytest.raises(GpuguardError, match=re.escape(f"rules file is {expected}")):
        load_ruleset([path])


def _rules_with_fifo_yara(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "miners.yar")
    path = tmp_path / "site.yaml"
    path.write_text(HEAD + "yara: [miners.yar]\n")
    return path


def test_fifo_yara_file_does_not_hang_validate(tmp_path):
    path = _rules_with_fifo_yara(tmp_path)
    done = rules_cli("validate", str(path), timeout=30)
    assert done.returncode == 2
    assert done.stdout == (
        f"{tmp_path / 'miners.yar'}:1:1: YARA file is a FIFO (named pipe), not a regular file "
        "(fix: name a regular file)\n"
    )


@pytest.mark.root
@pytest.mark.self_contained
def test_fifo_yara_file_does_not_hang_scan_even_with_no_yara(tmp_path):
    path = _rules_with_fifo_yara(tmp_path)
    done = run_scan("--rules", str(path), "--no-yara", "--cpu-sample", "0", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "YARA file is a FIFO (named pipe), not a regular file" in done.stderr


# ---- regexes run in linear time ----------------------------------------------------------

CATASTROPHIC = (
    HEAD
    + """rules:
  - id: greedy
    description: a regex that backtracks exponentially in a backtracking engine
    severity: low
    weight: 50
    condition: {signal: cmdline, matches: '(a+)+$'}
"""
)


def test_catastrophic_regex_scores_an_attacker_command_line_in_linear_time(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(CATASTROPHIC)
    ruleset = load_ruleset([path])
    state = ProcessState(ProcessKey(4242, 1.0), first_seen=1.0, last_seen=1.0)
    state.set_facts(
        ProcessFacts(pid=4242, start_time=1.0, comm="x", exe="/x", cmdline=["x", "a" * 4000 + "!"])
    )
    started = time.thread_time()  # CPU time: the bound holds on a busy host
    verdict = score_process(state, ruleset, 2.0)
    assert time.thread_time() - started < 1  # Python's re: 2**4000 steps
    assert verdict.score == 0
    state.set_facts(
        ProcessFacts(pid=4242, start_time=1.0, comm="x", exe="/x", cmdline=["x", "aaaa"])
    )
    assert score_process(state, ruleset, 2.0).score == 50
    # Invalid UTF-8 in an argument (kept as surrogate escapes) is searched, never an error.
    state.set_facts(
        ProcessFacts(pid=4242, start_time=1.0, comm="x", exe="/x", cmdline=["x", "\udcff\udcfeaa"])
    )
    assert score_process(state, ruleset, 2.0).score == 50


@pytest.mark.root
@pytest.mark.self_contained
def test_catastrophic_regex_does_not_hang_scan(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(CATASTROPHIC)
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "a" * 3000 + "!"]
    )
    try:
        done = run_scan(
            "--rules", str(path), "--no-yara", "--cpu-sample", "0", "--json", timeout=60
        )
    finally:
        victim.kill()
        victim.wait()
    assert done.returncode in (0, 1), done.stderr
    json.loads(done.stdout)


def test_patterns_re2_cannot_run_are_rejected_at_validation(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(CATASTROPHIC.replace("'(a+)+$'", "'(a)\\1'"))
    line = only_problem(path)
    assert (
        "rule greedy: bad regular expression '(a)\\\\1': RE2 cannot run it in linear time" in line
    )


# ---- what is quoted back -----------------------------------------------------------------


def test_a_symlink_to_a_secret_file_is_not_quoted_back(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text(
        "".join(
            f"user{i}:$y$j9T$salt$SECRETHASH{i:02d}SECRETHASH:19000:0:99999:7:::\n"
            for i in range(25)
        )
    )
    secret.chmod(0o600)
    link = tmp_path / "rules.yaml"
    link.symlink_to(secret)
    done = rules_cli("validate", str(link))
    assert done.returncode == 2
    assert done.stdout.count("\n") == 1 and "SECRETHASH" not in done.stdout + done.stderr
    assert "not a gpuguard rules file" in done.stdout


def test_long_values_are_cut_to_an_excerpt(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "rulez" + "x" * 5000 + ": 1\n")
    line = only_problem(path)
    assert len(line) < len(str(path)) + 200


# ---- every problem, clear messages -----------------------------------------------------------


def test_every_problem_in_one_rule_is_reported(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        HEAD + "rules:\n  - id: r\n    description: [a list]\n    severity: nope\n    weight: 999\n"
        "    tags: x\n    condition: {signal: no_such_signal, is: 1}\n"
    )
    messages = [p.cause for p in validate_rules([path])]
    assert messages == [
        "description must be non-empty text",
        "severity 'nope' must be one of info, low, medium, high, critical",
        "weight 999 must be a whole number from -100 to 100",
        "tags must be a list of text",
        "unknown signal 'no_such_signal' (`gpuguard rules signals` lists them)",
    ]


def test_missing_fields_do_not_hide_the_others(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        HEAD
        + "rules:\n  - id: r\n    severity: nope\n    condition: {signal: cmdline, matches: '(x'}\n"
    )
    messages = [p.cause for p in validate_rules([path])]
    assert messages[0] == "missing description, weight"
    assert any(m.startswith("severity 'nope'") for m in messages)
    assert any(m.startswith("bad regular expression") for m in messages)


def test_a_list_as_the_file_description_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "description: [not, text]\n")
    assert only_problem(path) == f"{path}:2:14: description must be text"


def test_version_as_text_says_so(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("version: '1'\n")
    problem = validate_rules([path])[0]
    assert (problem.cause, problem.fix) == (
        "version must be the number 1, not the text '1'",
        "write `version: 1` without quotes",
    )
    assert (
        str(problem) == f"{path}:1:10: version must be the number 1, not the text '1' "
        "(fix: write `version: 1` without quotes)"
    )


def test_problems_carry_cause_fix_and_position_as_fields(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD)
    path.chmod(0o666)
    (problem,) = validate_rules([path])
    assert problem.position.line == 1 and problem.file == str(path)
    assert problem.cause.startswith(f"refusing rules file {path}: it is writable by group/others")
    assert problem.fix == f"chmod go-w {path}"


# ---- property-based: arbitrary input never breaks the loader ------------------------------


def _check_output(path: Path) -> None:
    started = time.thread_time()  # CPU time: the bound holds on a busy host
    problems = validate_rules([path])
    assert time.thread_time() - started < 5
    for problem in problems:
        str(problem).encode("utf-8")  # strict: no lone surrogates, nothing unencodable
        assert problem.cause


yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    [
                        "version",
                        "rules",
                        "lists",
                        "id",
                        "condition",
                        "signal",
                        "all",
                        "any",
                        "not",
                        "matches",
                        "in_list",
                        "weight",
                        "allowlist",
                        "yara",
                        "thresholds",
                        "actions",
                        "override",
                    ]
                ),
                st.text(max_size=10),
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2000))
def test_arbitrary_bytes_never_break_the_loader(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    _check_output(path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=yaml_values, with_version=st.booleans())
def test_arbitrary_structures_never_break_the_loader(tmp_path, doc, with_version):
    if with_version and isinstance(doc, dict):
        doc = {"version": 1, **doc}
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    _check_output(path)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rule=st.fixed_dictionaries(
        {"id": st.text(max_size=8), "condition": yaml_values},
        optional={
            "description": yaml_values,
            "severity": yaml_values,
            "weight": yaml_values,
            "tags": yaml_values,
        },
    )
)
def test_arbitrary_rules_on_top_of_the_shipped_ones(tmp_path, rule):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "rules": [rule]}, allow_unicode=True))
    for problem in validate_rules([shipped_rules_file(), path]):
        str(problem).encode("utf-8")
