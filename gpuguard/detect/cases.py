"""Golden cases for rule authors: replay a recording, compare verdicts with ``expected.yaml``.

A case is a directory with ``capture.ggrec`` (a :mod:`gpuguard.events.wire` recording) and
``expected.yaml`` (its format: docs/rules.md, "Golden cases").  The replay runs decode →
correlate → score like ``gpuguard replay`` (no /proc, no live YARA) and scores once at the
last item's time.  A case that cannot be read fails on its own; the others still run.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuguard.config.filecheck import read_regular_file
from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import VERDICTS, RuleSet
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.detect.scoring.score import Verdict
from gpuguard.errors import GpuguardError
from gpuguard.escape import escape_text
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import Event
from gpuguard.events.process_facts import ProcessFacts

CAPTURE = "capture.ggrec"
EXPECTED = "expected.yaml"
MAX_EXPECTED_BYTES = 1 << 20
_EXPECT_KEYS = {
    "match",
    "verdict",
    "min_score",
    "max_score",
    "allowlisted",
    "rules",
    "forbidden_rules",
}


def replay(capture: Path, ruleset: RuleSet) -> tuple[list[Verdict], Correlator]:
    """Every process's verdict after replaying ``capture`` (scored at its last timestamp)."""
    from gpuguard.events.wire import iter_recording

    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, ruleset)
    now = 0.0
    for item in iter_recording(capture):
        correlator.feed(item)
        if isinstance(item, (Event, GpuSnapshot)):
            now = max(now, item.time)
        elif isinstance(item, ProcessFacts):
            now = max(now, item.start_time)
    return engine.verdicts(now), correlator


def _matches(spec: dict[str, Any], verdict: Verdict) -> bool:
    if "pid" in spec and verdict.pid != spec["pid"]:
        return False
    if "comm" in spec and verdict.comm != spec["comm"]:
        return False
    if "exe" in spec and not fnmatch.fnmatchcase(verdict.exe, spec["exe"]):
        return False
    return True


@dataclass(slots=True)
class CaseResult:
    name: str
    passed: bool
    failures: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    diffs: list[str] = field(default_factory=list)

    def report_lines(self, verbose: bool = False) -> list[str]:
        lines = list(self.failures) + list(self.diffs)
        if verbose or not self.passed:
            lines += [v.explain() for v in self.verdicts]
        return lines


def _load_expected(path: Path) -> dict[str, Any]:
    raw = read_regular_file(path, MAX_EXPECTED_BYTES, "expected.yaml")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise GpuguardError(f"{path} is not UTF-8 text", "fix the case's expected.yaml") from None
    except yaml.YAMLError as exc:
        raise GpuguardError(f"cannot read {path}: {exc}", "fix the case's expected.yaml") from None
    if not isinstance(data, dict) or not isinstance(data.get("processes"), list):
        raise GpuguardError(
            f"{path}: expected a map with a `processes:` list", "see docs/rules.md, golden cases"
        )
    for i, spec in enumerate(data["processes"]):
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("match"), dict)
            or set(spec) - _EXPECT_KEYS
        ):
            raise GpuguardError(
                f"{path}: processes[{i}] must be a map with match: and only {', '.join(sorted(_EXPECT_KEYS))}",
                "see docs/rules.md, golden cases",
            )
        if spec.get("verdict") not in (None, *VERDICTS):
            raise GpuguardError(
                f"{path}: processes[{i}]: verdict must be one of {', '.join(VERDICTS)}",
                "fix expected.yaml",
            )
        wrong = _wrong_types(spec)
        if wrong:
            raise GpuguardError(f"{path}: processes[{i}]: {wrong}", "fix expected.yaml")
    return data


def _wrong_types(spec: dict[str, Any]) -> str | None:
    """What in one expected process has the wrong type (None: all fine)."""
    match = spec["match"]
    if set(match) - {"pid", "comm", "exe"} or not match:
        return "match: takes pid, comm and/or exe"
    if "pid" in match and (not isinstance(match["pid"], int) or isinstance(match["pid"], bool)):
        return "match: pid must be a number"
    if any(k in match and not isinstance(match[k], str) for k in ("comm", "exe")):
        return "match: comm and exe must be text"
    for key in ("min_score", "max_score"):
        if key in spec and (not isinstance(spec[key], int) or isinstance(spec[key], bool)):
            return f"{key} must be a whole number"
    if "allowlisted" in spec and not isinstance(spec["allowlisted"], bool):
        return "allowlisted must be true or false"
    for key in ("rules", "forbidden_rules"):
        if key in spec and (
            not isinstance(spec[key], list) or not all(isinstance(r, str) for r in spec[key])
        ):
            return f"{key} must be a list of rule ids"
    return None


def _evidence_diff(verdict: Verdict, wanted: list[str], forbidden: list[str]) -> list[str]:
    got = {e.rule_id: e for e in verdict.evidence}
    lines = [f"  evidence of pid {verdict.pid} {escape_text(verdict.comm)}:"]
    for rule_id in sorted(set(wanted) | set(got)):
        if rule_id in got:
            e = got[rule_id]
            mark = "!" if rule_id in forbidden else ("=" if rule_id in wanted else "+")
            lines.append(f"    {mark} {rule_id} ({e.weight:+d}) {escape_text(e.detail)}")
        else:
            lines.append(f"    - {rule_id} (expected, not matched)")
    return lines


def run_case(case_dir: Path, ruleset: RuleSet) -> CaseResult:
    """Replay one case and check it against its expected.yaml (a case that cannot be read fails)."""
    try:
        expected = _load_expected(case_dir / EXPECTED)
        verdicts, _ = replay(case_dir / CAPTURE, ruleset)
    except GpuguardError as exc:
        return CaseResult(case_dir.name, False, failures=[f"cannot run the case: {exc.one_line()}"])
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the results of the others
        return CaseResult(
            case_dir.name,
            False,
            failures=[f"cannot run the case: {type(exc).__name__}: {escape_text(str(exc))[:200]}"],
        )
    result = CaseResult(case_dir.name, True, verdicts=verdicts)
    claimed: set[int] = set()
    for spec in expected["processes"]:
        found = [v for v in verdicts if _matches(spec["match"], v)]
        label = escape_text(", ".join(f"{k}={v}" for k, v in sorted(spec["match"].items())))
        if not found:
            result.failures.append(f"no process matches {label}")
            continue
        for verdict in found:
            claimed.add(id(verdict))
            problems = []
            if "verdict" in spec and verdict.verdict != spec["verdict"]:
                problems.append(f"verdict {verdict.verdict}, expected {spec['verdict']}")
            if "min_score" in spec and verdict.score < spec["min_score"]:
                problems.append(f"score {verdict.score} < min_score {spec['min_score']}")
            if "max_score" in spec and verdict.score > spec["max_score"]:
                problems.append(f"score {verdict.score} > max_score {spec['max_score']}")
            if "allowlisted" in spec and verdict.allowlisted != spec["allowlisted"]:
                problems.append(
                    f"allowlisted {verdict.allowlisted}, expected {spec['allowlisted']}"
                )
            rule_ids = {e.rule_id for e in verdict.evidence}
            missing = [r for r in spec.get("rules", []) if r not in rule_ids]
            present = [r for r in spec.get("forbidden_rules", []) if r in rule_ids]
            if missing:
                problems.append(f"missing rules {', '.join(missing)}")
            if present:
                problems.append(f"forbidden rules matched {', '.join(present)}")
            if problems:
                result.failures.append(f"{label} (pid {verdict.pid}): " + "; ".join(problems))
                result.diffs += _evidence_diff(
                    verdict, spec.get("rules", []), spec.get("forbidden_rules", [])
                )
    if expected.get("others") == "clean":
        for verdict in verdicts:
            if id(verdict) not in claimed and verdict.verdict != "clean":
                result.failures.append(
                    f"unlisted pid {verdict.pid} {escape_text(verdict.comm)} is {verdict.verdict} (others: clean)"
                )
                result.diffs += _evidence_diff(verdict, [], [])
    result.passed = not result.failures
    return result


def run_cases(path: Path, ruleset: RuleSet) -> list[CaseResult]:
    """Run one case directory, or every case directory under ``path`` (sorted by name)."""
    path = Path(path)
    # Any expected.yaml makes a case (a FIFO or directory there fails as that case, saying what it is).
    if (path / EXPECTED).exists():
        return [run_case(path, ruleset)]
    cases = sorted(p for p in path.iterdir() if (p / EXPECTED).exists()) if path.is_dir() else []
    if not cases:
        raise GpuguardError(
            f"no golden cases in {path}",
            "point --cases at a directory of NAME/capture.ggrec + NAME/expected.yaml",
        )
    return [run_case(case, ruleset) for case in cases]
