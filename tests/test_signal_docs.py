"""docs/rules.md's signal table is the registry's, and every signal a shipped rule names is in both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpuguard.config.reference import doc_block, in_doc
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.signals.docs import MARKERS, signal_table
from gpuguard.detect.signals.table import SIGNAL_FUNCTIONS, SIGNALS

REPO = Path(__file__).resolve().parent.parent
RULES_DOC = REPO / "docs" / "rules.md"


def documented_rows(path: Path = RULES_DOC) -> list[tuple[str, str, str, str]]:
    """(group, name, type, description) of each row of the generated table in ``path``."""
    block = in_doc(path, MARKERS)
    assert block is not None, f"{path}: the generated signal table is missing"
    rows = []
    for line in block.splitlines()[3:-1]:  # the marker, the header and its rule; the end marker
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        group, name, type_ = cells[:3]
        rows.append((group, name.strip("`"), type_, " | ".join(cells[3:]).replace("\\|", "|")))
    return rows


def signals_named(node) -> set[str]:
    """Every ``signal:`` a parsed rules document names, however deep its conditions nest."""
    if isinstance(node, dict):
        own = {node["signal"]} if isinstance(node.get("signal"), str) else set()
        return own.union(*(signals_named(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(signals_named(v) for v in node))
    return set()


def test_the_documented_signal_table_is_the_registrys():
    found = in_doc(RULES_DOC, MARKERS)
    assert found is not None, f"{RULES_DOC}: the generated signal table is missing"
    assert found == doc_block(signal_table(), MARKERS, fence=""), (
        "docs/rules.md's signal table differs from the registry "
        "(fix: .venv/bin/python -m gpuguard rules signals --update docs/rules.md)"
    )


def test_the_table_has_a_row_per_signal_with_its_type_and_description_in_registry_order():
    rows = documented_rows()
    assert [name for _, name, _, _ in rows] == list(SIGNALS)
    for group, name, type_, description in rows:
        signal = SIGNALS[name]
        assert (group, type_, description) == (signal.group, signal.type, signal.description)


def test_every_signal_a_shipped_rule_names_is_registered_and_documented():
    named = signals_named(yaml.safe_load(shipped_rules_file().read_text()))
    ruleset = load_ruleset([shipped_rules_file()])
    compiled = {name for rule in ruleset.rules + ruleset.disabled for name in rule.signals}
    assert named == compiled  # the walk above finds what the compiler found, and no less
    assert named - set(SIGNALS) == set(), "named by a shipped rule, not registered"
    documented = {name for _, name, _, _ in documented_rows()}
    assert named - documented == set(), "named by a shipped rule, not in docs/rules.md"


def test_each_signal_is_a_public_function_named_as_its_signal():
    for fn in SIGNAL_FUNCTIONS:
        assert fn.__name__ == fn.signal.name, f"{fn.__module__}.{fn.__name__}"
        assert getattr(sys.modules[fn.__module__], fn.signal.name) is fn


def rules_signals(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", "signals", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_rules_signals_update_rewrites_only_the_table(tmp_path):
    doc = tmp_path / "rules.md"
    stale = doc_block(
        "| group | signal | type | meaning |\n| x | `gone` | text | old |\n", MARKERS, ""
    )
    doc.write_text(f"# Rules\n\nbefore\n\n{stale}\n\nafter\n")
    first = rules_signals("--update", str(doc))
    again = rules_signals("--update", str(doc))
    assert first.returncode == 0 and first.stdout.startswith("updated"), first.stderr
    assert again.returncode == 0 and again.stdout.startswith("up to date"), again.stderr
    text = doc.read_text()
    assert text.startswith("# Rules\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "`gone`" not in text
    assert [name for _, name, _, _ in documented_rows(doc)] == list(SIGNALS)


def test_rules_signals_update_refuses_a_doc_it_cannot_update_in_one_line(tmp_path):
    plain = tmp_path / "plain.md"
    plain.write_text("# no generated block here\n")
    cases = {
        plain: "has no block between the markers",
        tmp_path / "missing.md": "not found",
        tmp_path: "is a directory",
    }
    for path, cause in cases.items():
        done = rules_signals("--update", str(path))
        assert done.returncode == 2, (path, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and cause in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert plain.read_text() == "# no generated block here\n"
