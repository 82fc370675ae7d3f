"""Every YAML example in docs/, README.md and packaging/ goes through the loader that would read it.

A ```yaml block is sent to a loader chosen by its top-level keys: an agent config
(``mode``, ``response``, ``guard_policies``, ...) to the agent config parser (which checks
``response:`` with the response settings parser), a rules file (``version``) as a layer over
the shipped rules, a rule condition (``signal``, ``all``, ``any``, ``not``) or ``condition:``
as a rule in such a layer, a golden case's ``expected.yaml`` to its reader, a metrics web
config (``tls_server_config``, ``basic_auth_users``) to its loader.  A block the test
cannot place fails.  A block that is deliberately partial says so in an HTML comment on the
line before it, which the test honours:

* ``<!-- yaml: fragment of KEY: -->``: the block is the value of ``KEY:`` (indented under it);
* ``<!-- yaml: one condition per line -->``: each line is one condition.

packaging/: agent.yaml (and the commented-out examples in it) through the agent config
loader, the Kubernetes manifests through the Kubernetes schema (their ConfigMap's agent.yaml
through the agent config loader), the Sigma rules through pySigma, the shipping configs
through ``yaml.safe_load``.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuguard.agent.config import parse_config
from gpuguard.agent.config_schema import SCHEMA as AGENT_SCHEMA
from gpuguard.config.yaml_marks import load_marked
from gpuguard.detect.cases import _load_expected
from gpuguard.detect.ruleset.load import validate_rules
from gpuguard.detect.ruleset.shipped import shipped_rules_dir, shipped_rules_file
from gpuguard.errors import GpuguardError
from gpuguard.outputs.web_config import load_web_config

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "packaging"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
MARKER = re.compile(r"^<!--\s*yaml:\s*(.*?)\s*-->$")

AGENT_KEYS = set(AGENT_SCHEMA.names)  # every top-level key of agent.yaml
CONDITION_KEYS = {"signal", "all", "any", "not"}
WEB_CONFIG_KEYS = {"tls_server_config", "basic_auth_users"}
CASE_KEYS = {"description", "others", "processes"}


@dataclass(frozen=True)
class Block:
    file: Path
    line: int  # of the opening fence, 1-based
    text: str
    marker: str  # the HTML comment's words before the block, or ""

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def yaml_blocks(path: Path) -> list[Block]:
    """The ```yaml (or ```yml) fenced blocks of a Markdown file, with the marker before each."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence in ("```yaml", "```yml"):
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next(
                (lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), ""
            )
            found = MARKER.match(before)
            blocks.append(
                Block(path, start + 1, "\n".join(body) + "\n", found.group(1) if found else "")
            )
        i += 1
    return blocks


def _agent_config(text: str, name: str) -> None:
    doc = load_marked(text, name)
    assert not doc.problems, doc.problems
    parse_config(doc)  # raises GpuguardError naming file:line:col


def _web_config(text: str, name: str, tmp_path: Path) -> None:
    """A metrics web config, loaded beside the certificate and key it names (made by openssl)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    tls = yaml.safe_load(text).get("tls_server_config") or {}
    if tls.get("cert_file") and tls.get("key_file"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
            + ["-nodes", "-keyout", tls["key_file"], "-out", tls["cert_file"], "-days", "1"]
            + ["-subj", "/CN=docs-example"],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            timeout=60,
        )
    path = tmp_path / "web-config.yaml"
    path.write_text(text)
    path.chmod(0o600)
    load_web_config(path)  # raises GpuguardError naming file:line:col


def _rules_file(text: str, name: str, tmp_path: Path, layered: bool = True) -> None:
    """Validate ``text`` as a rules file, alone or layered over the shipped rules (beside yara/)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    layer = tmp_path / "site-rules.yaml"
    layer.write_text(text)
    (tmp_path / "yara").symlink_to(shipped_rules_dir() / "yara")
    problems = validate_rules([shipped_rules_file(), layer] if layered else [layer])
    assert not problems, f"{name}: " + "; ".join(str(p) for p in problems)


def _rules_layer(text: str, name: str, tmp_path: Path) -> None:
    _rules_file(text, name, tmp_path)


def _changes_shipped(data: dict) -> bool:
    """Whether a rules file example is a site layer: it overrides rules or extends lists."""
    entries = [*(data.get("rules") or []), *(data.get("allowlist") or [])]
    lists = (data.get("lists") or {}).values()
    return any("override" in e for e in entries if isinstance(e, dict)) or any(
        isinstance(v, dict) for v in lists
    )


def _as_rule(condition_yaml: str) -> str:
    return (
        "version: 1\nrules:\n  - id: docs-example\n    description: docs example\n"
        "    severity: low\n    weight: 1\n    condition:\n"
        + textwrap.indent(condition_yaml.rstrip("\n"), "      ")
        + "\n"
    )


def check_block(block: Block, tmp_path: Path) -> None:
    text, name = block.text, str(block)
    if block.marker == "one condition per line":
        for n, line in enumerate(x for x in text.splitlines() if x.strip()):
            _rules_layer(_as_rule(line), f"{name} line {n + 1}", tmp_path / f"c{n}")
        return
    if block.marker:
        wrap = re.fullmatch(r"fragment of (\w+):", block.marker)
        assert wrap, f"{name}: unknown marker {block.marker!r}"
        text = f"{wrap.group(1)}:\n" + textwrap.indent(text, "  ")
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{name}: not a mapping; mark it (see this test's docstring)"
    keys = set(data)
    if "version" in keys:
        _rules_file(text, name, tmp_path, layered=_changes_shipped(data))
    elif keys <= CONDITION_KEYS:
        _rules_layer(_as_rule(text), name, tmp_path)
    elif keys == {"condition"}:
        _rules_layer(_as_rule(yaml.safe_dump(data["condition"])), name, tmp_path)
    elif keys <= AGENT_KEYS:
        _agent_config(text, name)
    elif keys <= WEB_CONFIG_KEYS:
        _web_config(text, name, tmp_path)
    elif keys <= CASE_KEYS and "processes" in keys:
        expected = tmp_path / "expected.yaml"
        expected.write_text(text)
        _load_expected(expected)
    else:
        pytest.fail(f"{name}: no loader for top-level keys {sorted(map(str, keys))}; mark it")


DOC_BLOCKS = [b for path in DOCS for b in yaml_blocks(path)]


def test_the_docs_have_yaml_examples():
    assert len(DOC_BLOCKS) >= 8  # the extraction can fail
    files = {b.file.name for b in DOC_BLOCKS}
    assert {"agent.md", "respond.md", "rules.md"} <= files


@pytest.mark.parametrize("block", DOC_BLOCKS, ids=str)
def test_doc_yaml_example_loads(block, tmp_path):
    check_block(block, tmp_path)


def test_a_broken_example_fails(tmp_path):
    """The checks can fail: a wrong key, a wrong action, an unknown signal are all caught."""
    for text in (
        "response:\n  hooks:\n    - {name: x, argv: [/bin/true], when: [malicious]}\n",
        "response:\n  actions: {malicious: [explode]}\n",
        "{signal: no_such_signal, gte: 1}\n",
        "colour: blue\n",
    ):
        with pytest.raises((GpuguardError, AssertionError, pytest.fail.Exception)):
            check_block(Block(ROOT / "docs" / "x.md", 1, text, ""), tmp_path / str(len(text)))


# -- the hook key `on:` ----------------------------------------------------------------------------


def test_hook_on_key_is_read_as_written():
    config = parse_config(
        load_marked(
            "response:\n  hooks:\n    - name: ticket\n      argv: [/usr/local/bin/t]\n"
            "      on: [malicious, suspicious]\n",
            "agent.yaml",
        )
    )
    assert config.response.hooks[0].on == ("malicious", "suspicious")


def test_a_true_key_is_still_reported():
    with pytest.raises(GpuguardError) as err:
        parse_config(load_marked("response:\n  true: 1\n", "agent.yaml"))
    assert "unknown key True" in err.value.cause
    # Only the words on/off/yes/no stay text as keys; as values they are still booleans.
    doc = load_marked("yes: on\nOff: no\nTrue: 1\n", "x.yaml")
    assert doc.data == {"yes": True, "Off": False, True: 1}


# -- packaging/ --------------------------------------------------------------------------------------


def _commented_examples(text: str) -> list[str]:
    """The commented-out ``response:`` / ``guard_policies:`` examples of agent.yaml, uncommented."""
    out, current = [], None
    for line in text.splitlines():
        if re.match(r"^# (response|guard_policies):\s*$", line):
            current = [line[2:]]
            out.append(current)
        elif current is not None and line.startswith("#   "):
            current.append(line[2:])
        else:
            current = None
    return ["\n".join(lines) + "\n" for lines in out]


def test_packaged_agent_yaml_and_its_commented_examples_load():
    text = (PKG / "agent.yaml").read_text()
    _agent_config(text, "packaging/agent.yaml")
    examples = _commented_examples(text)
    assert {e.split(":")[0] for e in examples} == {"response", "guard_policies"}
    for n, example in enumerate(examples):
        _agent_config(example, f"packaging/agent.yaml example {n + 1}")


def test_kubernetes_manifests_and_their_agent_config_load():
    import kubernetes_validate

    # Kustomize base and overlays: kustomization files, strategic-merge patches and Prometheus
    # Operator resources are not whole built-in objects (tests/test_deploy.py renders them).
    manifests = sorted((PKG / "kubernetes").rglob("*.y*ml"))
    assert manifests
    for path in manifests:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None or doc["kind"] == "Kustomization" or "overlays" in path.parts:
                continue
            kubernetes_validate.validate(doc, "1.27", strict=True)
            if doc["kind"] == "ConfigMap" and "agent.yaml" in doc.get("data", {}):
                _agent_config(doc["data"]["agent.yaml"], f"{path.name} ConfigMap agent.yaml")


def test_sigma_rules_load():
    from sigma.collection import SigmaCollection

    paths = sorted((PKG / "sigma").glob("*.y*ml"))
    assert paths
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and doc.get("title"), path
    # As one collection: the correlation rule names the rule it counts.
    collection = SigmaCollection.load_ruleset([PKG / "sigma"])
    assert not collection.errors, collection.errors
    assert len(collection.rules) == len(paths)


def test_every_packaged_yaml_file_is_checked():
    checked = {PKG / "agent.yaml"}
    checked |= set((PKG / "kubernetes").rglob("*.y*ml")) | set((PKG / "sigma").glob("*.y*ml"))
    # alerting rules and their tests (promtool), Grafana provisioning: tests/test_deploy.py
    checked |= set((PKG / "prometheus").glob("*.y*ml")) | set((PKG / "grafana").rglob("*.y*ml"))
    shipping = set((PKG / "shipping").glob("*.y*ml"))
    for path in shipping:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
    found = set(PKG.rglob("*.yaml")) | set(PKG.rglob("*.yml"))
    assert found == checked | shipping, sorted(map(str, found - checked - shipping))
