"""The config layer: one schema for agent.yaml, response:, guard_policies: and the rules file.

Each of the four reports a bad value at ``file:line:col`` in one line naming the
cause and the fix; defaults come from the owners' dataclasses (declared once); the
reference in docs/agent.md is the schema rendered, and this test fails when they differ.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuguard.agent.config import SCHEMA, AgentConfig, load_config
from gpuguard.config.reference import doc_block, in_doc, reference
from gpuguard.config.schema import Key, Section, check, defaults
from gpuguard.config.yaml_marks import load_marked
from gpuguard.detect.guard_policies import GUARD_POLICY_SCHEMA, GuardPolicy
from gpuguard.detect.ruleset.load import load_ruleset, validate_rules
from gpuguard.detect.ruleset.model import RULES_FILE_SCHEMA, Thresholds
from gpuguard.errors import GpuguardError
from gpuguard.respond.settings import HOOK_SCHEMA, RESPONSE_SCHEMA, ResponseSettings

REPO = Path(__file__).resolve().parent.parent
AGENT_DOC = REPO / "docs" / "agent.md"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, 0o600)
    os.chmod(tmp_path, 0o700)
    return path


def where(path: Path, text: str, needle: str) -> str:
    """``file:line:col`` of the first ``needle`` in ``text`` (1-based, as the problems say)."""
    offset = text.index(needle)
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{path}:{line}:{col}"


def first_problem(path: Path) -> str:
    with pytest.raises(GpuguardError) as caught:
        load_config(path)
    line = caught.value.one_line()
    assert "\n" not in line and "(fix: " in line, line
    return line


def test_the_agent_config_names_file_line_col_cause_and_fix(tmp_path):
    text = "mode: monitor\nsampling: {interval_s: 0.01}\n"
    path = write(tmp_path, "agent.yaml", text)
    line = first_problem(path)
    assert line.startswith(
        f"{where(path, text, '0.01')}: sampling.interval_s 0.01 is outside 0.1-3600 (fix: "
    ), line


def test_the_response_section_names_file_line_col_cause_and_fix(tmp_path):
    text = "response:\n  kill_on_touch: {ttl_s: 60, breaker_victims_per_minute: -2}\n"
    path = write(tmp_path, "agent.yaml", text)
    line = first_problem(path)
    assert line.startswith(
        f"{where(path, text, '-2')}: response.kill_on_touch.breaker_victims_per_minute: "
        "expected a number >= 0, got -2 (fix: "
    ), line


def test_guard_policies_name_file_line_col_cause_and_fix(tmp_path):
    text = "guard_policies:\n  - id: night\n    weight: lots\n"
    path = write(tmp_path, "agent.yaml", text)
    line = first_problem(path)
    assert line.startswith(
        f"{where(path, text, 'lots')}: guard_policies[0].weight: "
        "expected a whole number >= 0, got 'lots' (fix: "
    ), line


def test_the_rules_file_thresholds_name_file_line_col_cause_and_fix(tmp_path):
    text = "version: 1\nthresholds: {suspicious: 30, malicious: 101}\n"
    path = write(tmp_path, "site.yaml", text)
    problems = validate_rules([path])
    assert [str(p) for p in problems] == [
        f"{where(path, text, '101')}: threshold malicious must be a whole number from 1 to 100"
    ]
    with pytest.raises(GpuguardError) as caught:
        load_ruleset([path])
    line = caught.value.one_line()
    assert "\n" not in line and "(fix: " in line and where(path, text, "101") in line, line


def test_unknown_keys_are_placed_at_the_key_in_each_section(tmp_path):
    text = "log:\n  limits: {cmdline: 9}\nresponse:\n  hooks:\n    - {argv: [/bin/true], when: x}\n"
    path = write(tmp_path, "agent.yaml", text)
    from gpuguard.agent.config import config_problems, read_config_file

    _, problems = config_problems(read_config_file(path))
    assert problems[0].startswith(f"{where(path, text, 'cmdline')}: unknown key 'cmdline'")
    assert problems[1].startswith(
        f"{where(path, text, 'when')}: response.hooks[0].when: unknown key 'when'"
    )
    assert len(problems) == 2, problems


def test_a_bad_value_leaves_the_models_default_in_its_place():
    @dataclass
    class Model:
        count: int = 7
        name: str = "x"

    section = Section("s", (Key("count", "whole", low=0, high=9), Key("name", "text")), model=Model)
    found: list[tuple] = []
    values = check(
        {"count": 12, "name": "y", "extra": 1},
        section,
        ("s",),
        lambda path, message, key=False: found.append((path, message, key)),
    )
    assert Model(**values) == Model(count=7, name="y")
    assert found == [
        (("s", "count"), "12 is outside 0-9", False),
        (("s", "extra"), "unknown key 'extra' (expected one of count, name)", True),
    ]


@pytest.mark.parametrize(
    "section, model",
    [
        (SCHEMA, AgentConfig),
        (RESPONSE_SCHEMA, ResponseSettings),
        (GUARD_POLICY_SCHEMA, GuardPolicy),
        (RULES_FILE_SCHEMA.get("thresholds"), Thresholds),
    ],
)
def test_each_default_is_the_models(section, model):
    """The schema declares no default of its own: each one is read from the owner's dataclass."""
    shown = defaults(section)
    fields = {f.name for f in dataclasses.fields(model)}

    def keys(s: Section, prefix: str = ""):
        for k in s.keys:
            if isinstance(k, Section):
                if k.model is None:  # its keys fill fields of the outer model
                    yield from keys(k, f"{prefix}{k.key}.")
            else:
                yield prefix + k.key, k

    for dotted, key in keys(section):
        if key.shows:
            continue
        assert key.name in fields, f"{dotted}: {model.__name__} has no field {key.name}"
        field = next(f for f in dataclasses.fields(model) if f.name == key.name)
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()
        )
        assert shown[dotted] == default, dotted


def test_the_generated_reference_is_a_valid_config_at_its_defaults(tmp_path):
    text = reference(SCHEMA)
    doc = load_marked(text, "reference.yaml")
    assert not doc.problems
    from gpuguard.agent.config import parse_config

    parsed = parse_config(doc)
    from gpuguard.outputs.bounds import OutputLimits

    assert OutputLimits(**parsed.log_limits) == OutputLimits()  # every cap given, at its default
    assert dataclasses.replace(parsed, source="", log_limits={}) == AgentConfig(rules=[])
    # every key of every section is in it (hook and policy entries as comments)
    for spec in (*RESPONSE_SCHEMA.keys, *HOOK_SCHEMA.keys, *GUARD_POLICY_SCHEMA.keys):
        assert f" {spec.key}:" in text or f"- {spec.key}:" in text, spec.key


def test_the_documented_reference_is_the_schemas():
    found = in_doc(AGENT_DOC)
    assert found is not None, f"{AGENT_DOC}: the generated config reference block is missing"
    assert found == doc_block(reference(SCHEMA)), (
        "docs/agent.md's config reference differs from the schema "
        "(fix: .venv/bin/python -m gpuguard config reference --update docs/agent.md)"
    )


def test_config_reference_command_prints_it():
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "config", "reference"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout == reference(SCHEMA), run.stderr
