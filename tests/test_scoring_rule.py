"""One scoring rule: no module outside detect/scoring computes a score, verdict or severity itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.detect.scoring.rule import score_of, severity_for, verdict_for
from gpuguard.detect.scoring.score import Evidence

PACKAGE = Path(__file__).resolve().parent.parent / "gpuguard"
SCORING = PACKAGE / "detect" / "scoring"
THE_RULE = SCORING / "rule.py"
VERDICTS = {"malicious", "suspicious", "clean"}
SEVERITIES = {"critical", "high", "medium", "low", "informational"}
THRESHOLD_NAMES = {"suspicious", "malicious"}
ORDER = (ast.Gt, ast.GtE, ast.Lt, ast.LtE)


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute ``node`` reads (``thresholds.malicious`` -> malicious, thresholds)."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _strings(node: ast.AST) -> set[str]:
    return {
        sub.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
    }


def _sums_weights(node: ast.AST) -> bool:
    """``sum(e.weight ...)``, ``total += e.weight`` or ``a.weight + b.weight``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "id", None) == "sum":
            if any("weight" in _names(arg) for arg in sub.args):
                return True
        elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Add):
            if isinstance(sub.value, ast.Attribute) and sub.value.attr == "weight":
                return True
        elif isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add):
            if any(
                isinstance(s, ast.Attribute) and s.attr == "weight" for s in (sub.left, sub.right)
            ):
                return True
    return False


def second_rules(path: Path) -> list[str]:
    """The functions of ``path`` that hold a copy of the scoring rule: they sum evidence weights
    (outside detect/scoring), or order a score against thresholds or bands to name a verdict or a
    severity (anywhere but detect/scoring/rule.py)."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent)
    # a table the function reads (``BANDS = ((90, "critical"), ...)``) counts as its own text
    tables = {
        target.id: _strings(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        name = getattr(node, "name", "<lambda>")
        if SCORING not in path.parents and _sums_weights(node):
            found.append(f"{where}:{node.lineno}: {name} sums evidence weights (use score_of)")
        if path == THE_RULE:
            continue
        ordered = [
            sub
            for sub in ast.walk(node)
            if isinstance(sub, ast.Compare) and any(isinstance(op, ORDER) for op in sub.ops)
        ]
        if not ordered:
            continue
        strings = _strings(node).union(*(tables.get(n, ()) for n in _names(node)))
        reads = set().union(*(_names(c) for c in ordered))
        thresholds = bool(reads & THRESHOLD_NAMES or any("threshold" in n for n in reads))
        if thresholds and strings & (VERDICTS - {"clean"}):
            found.append(
                f"{where}:{node.lineno}: {name} names a verdict from thresholds (use verdict_for)"
            )
        if len(strings & SEVERITIES) >= 2:
            found.append(
                f"{where}:{node.lineno}: {name} names a severity from a score (use severity_for)"
            )
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_the_score_verdict_and_severity_are_computed_in_one_place(path):
    assert second_rules(path) == []


def test_the_check_catches_a_planted_copy(tmp_path, monkeypatch):
    """The copies the rule replaced (guard policies, host checks, outputs) are each caught; a
    comparison with another threshold, and a call of the rule, are not."""
    fake = tmp_path / "gpuguard"
    (fake / "detect" / "scoring").mkdir(parents=True)
    (fake / "detect" / "scoring" / "rule.py").write_text(
        "def verdict_for(score, t):\n"
        "    return 'malicious' if score >= t.malicious else 'suspicious' if score >= t.suspicious"
        " else 'clean'\n"
    )
    (fake / "detect" / "scoring" / "cap.py").write_text(
        "def reach(rules):\n    total = 0\n    for r in rules:\n        total += r.weight\n"
    )
    planted = fake / "copies.py"
    planted.write_text(
        "def guard(evidence):\n    return min(100, sum(e.weight for e in evidence))\n"
        "def apply_thresholds(findings, suspicious, malicious):\n"
        "    for f in findings:\n"
        "        f.verdict = 'malicious' if f.score >= malicious else 'suspicious' "
        "if f.score >= suspicious else 'clean'\n"
        "BANDS = ((90, 'critical'), (70, 'high'), (40, 'medium'), (1, 'low'))\n"
        "def severity_for_score(score):\n"
        "    for floor, name in BANDS:\n        if score >= floor:\n            return name\n"
        "    return 'informational'\n"
        "def cef_severity(score):\n"
        "    return 'high' if score >= 70 else 'low'\n"
    )
    fine = fake / "fine.py"
    fine.write_text(
        "from gpuguard.detect.scoring.rule import verdict_for\n"
        "def watch(verdicts, threshold):\n"
        "    return [v for v in verdicts if v.score >= threshold and v.verdict != 'clean']\n"
        "def label(score, t):\n    return verdict_for(score, t)\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    monkeypatch.setattr(__import__(__name__), "SCORING", fake / "detect" / "scoring")
    monkeypatch.setattr(__import__(__name__), "THE_RULE", fake / "detect" / "scoring" / "rule.py")
    assert [f.split(": ", 1)[1].split(" (")[0] for f in second_rules(planted)] == [
        "guard sums evidence weights",
        "apply_thresholds names a verdict from thresholds",
        "severity_for_score names a severity from a score",
        "cef_severity names a severity from a score",
    ]
    assert second_rules(fine) == []
    assert second_rules(fake / "detect" / "scoring" / "rule.py") == []
    assert second_rules(fake / "detect" / "scoring" / "cap.py") == []


def test_the_rule():
    def weighs(*weights):
        return [Evidence(f"r{i}", "s", "d", w, "low") for i, w in enumerate(weights)]

    assert [score_of(weighs(*w)) for w in ((), (40, 30), (80, 50), (10, -30))] == [0, 70, 100, 0]
    t = Thresholds(40, 75)
    assert [verdict_for(s, t) for s in (0, 39, 40, 74, 75, 100)] == [
        "clean",
        "clean",
        "suspicious",
        "suspicious",
        "malicious",
        "malicious",
    ]
    assert [severity_for(s) for s in (0, 1, 39, 40, 69, 70, 89, 90, 100)] == [
        "informational",
        "low",
        "low",
        "medium",
        "medium",
        "high",
        "high",
        "critical",
        "critical",
    ]
