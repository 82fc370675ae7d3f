"""`validate_rules`: every mistake reported once, as file:line:col: message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.detect.ruleset.load import Problem, validate_rules
from gpuguard.detect.ruleset.shipped import default_rule_paths, shipped_rules_file

HEAD = "version: 1\n"
RULE = """\
rules:
  - id: r1
    description: test rule
    severity: high
    weight: 10
    condition: {COND}
"""


def rules_with(condition: str, lists: str = "") -> str:
    return HEAD + lists + RULE.replace("{COND}", condition)


LISTS = "lists:\n  ports: [3333, '10001-18192']\n  names: [xmrig]\n"

# (name, file text, expected "line:col: message" prefix of the single problem)
CASES = [
    ("unknown top-level key", HEAD + "rulez: []\n", "2:1: unknown top-level key 'rulez'"),
    ("wrong version", "version: 2\n", "1:10: version must be 1 (found 2)"),
    ("missing version", "rules: []\n", "1:1: version must be 1 (found None)"),
    ("empty file", "", "1:1: empty rules file"),
    ("not a map", "- 1\n", "1:1: a rules file must be a map"),
    ("yaml syntax", HEAD + "rules: [\n", "3:1: YAML syntax error"),
    ("duplicate key", HEAD + "lists: {a: [1]}\nlists: {b: [2]}\n", "3:1: duplicate key 'lists'"),
    (
        "unknown signal",
        rules_with("{signal: cmd_line, matches: x}"),
        "7:25: rule r1: unknown signal 'cmd_line'",
    ),
    (
        "unknown list",
        rules_with("{signal: connect_ports, in_list: portz}", LISTS),
        "10:49: rule r1: unknown list 'portz'",
    ),
    (
        "bad regex",
        rules_with("{signal: cmdline, matches: '(ab'}"),
        "7:43: rule r1: bad regular expression '(ab'",
    ),
    (
        "bad regex in list entry",
        rules_with("{signal: cmdline, matches_list: rx}", "lists:\n  rx: [ok, '[z']\n"),
        "3:12: rule r1: list 'rx': bad regular expression '[z'",
    ),
    (
        "operator for wrong type",
        rules_with("{signal: exe_deleted, gt: 1}"),
        "7:38: rule r1: operator 'gt' does not apply to bool signal exe_deleted",
    ),
    (
        "two operators",
        rules_with("{signal: uid, is: 0, gt: 1}"),
        "7:16: rule r1: signal uid: needs exactly one operator",
    ),
    (
        "unknown operator",
        rules_with("{signal: uid, equals: 0}"),
        "7:30: rule r1: unknown operator 'equals'",
    ),
    (
        "combinator with extra key",
        rules_with("{all: [{signal: uid, is: 0}], weight: 2}"),
        "7:46: rule r1: all: must be alone",
    ),
    ("empty any", rules_with("{any: []}"), "7:22: rule r1: any: needs a non-empty list"),
    ("leaf without signal", rules_with("{sig: uid}"), "7:17: rule r1: unknown condition key 'sig'"),
    (
        "rate without its command",
        rules_with("{signal: ioctl_command_rate, gte: 5}"),
        "7:16: rule r1: signal ioctl_command_rate: needs `command: NAME`",
    ),
    (
        "rate of an unknown command",
        rules_with("{signal: ioctl_command_rate, command: UVM_TELEPORT, gte: 5}"),
        "7:54: rule r1: signal ioctl_command_rate: 'UVM_TELEPORT' is not a decoded ioctl name",
    ),
    (
        "command on another signal",
        rules_with("{signal: uid, command: X, is: 0}"),
        "7:30: rule r1: unknown operator 'command'",
    ),
    (
        "text value for number",
        rules_with("{signal: gpu_util_mean, gte: high}"),
        "7:45: rule r1: gte: needs a number",
    ),
    (
        "number list with text",
        rules_with("{signal: connect_ports, in_list: names}", LISTS),
        "4:11: rule r1: list 'names': 'xmrig' is not a number or range",
    ),
    (
        "bad cidr",
        rules_with(
            "{signal: connect_addresses, cidr_in_list: nets}",
            "lists:\n  nets: [10.0.0.0/8, 300.1.1.1]\n",
        ),
        "3:22: rule r1: list 'nets': '300.1.1.1' is not an address or network",
    ),
    (
        "bad domain",
        rules_with("{signal: cmdline_hosts, domain_in_list: d}", "lists:\n  d: ['a b.com']\n"),
        "3:7: rule r1: list 'd': 'a b.com' is not a domain name",
    ),
    (
        "weight range",
        HEAD + RULE.replace("weight: 10", "weight: 500").replace("{COND}", "{signal: uid, is: 0}"),
        "6:13: rule r1: weight 500 must be a whole number from -100 to 100",
    ),
    (
        "severity",
        HEAD + RULE.replace("high", "urgent").replace("{COND}", "{signal: uid, is: 0}"),
        "5:15: rule r1: severity 'urgent' must be one of",
    ),
    (
        "missing fields",
        HEAD + "rules:\n  - id: r1\n    condition: {signal: uid, is: 0}\n",
        "3:5: rule r1: missing description, severity, weight",
    ),
    (
        "unknown rule key",
        HEAD + RULE.replace("{COND}", "{signal: uid, is: 0}") + "    action: kill\n",
        "8:5: rule r1: unknown rule key 'action'",
    ),
    ("bad rule id", HEAD + "rules:\n  - id: Bad Id\n", "3:9: rule id 'Bad Id' must be"),
    (
        "duplicate rule id",
        HEAD
        + RULE.replace("{COND}", "{signal: uid, is: 0}")
        + RULE.replace("{COND}", "{signal: uid, is: 1}").replace("rules:\n", ""),
        "8:9: rule r1: duplicate rule id (first defined at",
    ),
    (
        "extend unknown list",
        HEAD + "lists:\n  nope: {extend: [1]}\n",
        "3:10: list 'nope': cannot extend a list no earlier file defines",
    ),
    (
        "list map op",
        HEAD + "lists:\n  a: {add: [1]}\n",
        "3:6: list 'a': a map must have exactly one of extend, remove, replace",
    ),
    (
        "list entry type",
        HEAD + "lists:\n  a: [[1]]\n",
        "3:7: list 'a': entries must be text or numbers",
    ),
    (
        "override unknown rule",
        HEAD + "rules:\n  - id: ghost\n    override: {enabled: false}\n",
        "3:9: rule ghost: override of a rule no earlier file defines",
    ),
    (
        "thresholds inverted",
        HEAD + "thresholds: {suspicious: 80, malicious: 60}\n",
        "1:1: thresholds: suspicious (80) must be below malicious (60)",
    ),
    (
        "threshold range",
        HEAD + "thresholds: {suspicious: 0}\n",
        "2:26: threshold suspicious must be a whole number from 1 to 100",
    ),
    ("unknown action", HEAD + "actions: {malicious: nuke}\n", "2:22: unknown action 'nuke'"),
    ("unknown verdict", HEAD + "actions: {evil: kill}\n", "2:11: unknown verdict 'evil'"),
    (
        "allowlist key",
        HEAD + "allowlist:\n  - {exe: /bin/x, comm: x}\n",
        "3:19: unknown allowlist key 'comm'",
    ),
    (
        "allowlist needs a field",
        HEAD + "allowlist:\n  - {comment: x}\n",
        "3:5: an allowlist entry must name at least one of",
    ),
    (
        "allowlist sha256",
        HEAD + "allowlist:\n  - {user: root, sha256: abc}\n",
        "3:26: sha256 must be 64 lower-case hex digits and needs exe",
    ),
    (
        "allowlist relative exe",
        HEAD + "allowlist:\n  - {exe: nvidia-smi}\n",
        "3:11: exe must be an absolute path",
    ),
    (
        "yara glob matches nothing",
        HEAD + "yara: [nothing/*.yar]\n",
        "2:8: no YARA file matches 'nothing/*.yar'",
    ),
    (
        "merge keys refused",
        HEAD + "base: &b {x: 1}\nthresholds: {<<: *b}\n",
        "3:14: YAML merge keys",
    ),
]


@pytest.mark.parametrize("name,text,expected", CASES, ids=[c[0] for c in CASES])
def test_problem_is_reported_with_position(tmp_path, name, text, expected):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    problems = validate_rules([path])
    messages = [str(p) for p in problems]
    if name == "merge keys refused":  # the anchor's own key is also unknown
        messages = [m for m in messages if "merge" in m]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:{expected}"), messages[0]


def test_shipped_rules_are_valid():
    assert validate_rules([shipped_rules_file()]) == []
    assert validate_rules(default_rule_paths(Path("/nonexistent"))) == []


def test_problem_fields_and_str():
    p = Problem("f.yaml", 3, 7, "unknown signal 'x'", "r1")
    assert str(p) == "f.yaml:3:7: rule r1: unknown signal 'x'"
    assert str(Problem("f.yaml", 1, 1, "version must be 1")) == "f.yaml:1:1: version must be 1"


def test_several_problems_all_reported(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        HEAD
        + "bogus: 1\n"
        + RULE.replace("{COND}", "{signal: nope, is: 1}")
        + "actions: {clean: zap}\n"
    )
    messages = [str(p) for p in validate_rules([path])]
    assert [m.split(": ", 1)[0].rsplit(":", 2)[-2:] for m in messages] == [
        ["2", "1"],
        ["8", "25"],
        ["9", "18"],
    ]


def test_yara_compile_error_names_file_and_line(tmp_path):
    (tmp_path / "y").mkdir()
    yar = tmp_path / "y" / "bad.yar"
    yar.write_text(
        'rule ok { condition: true }\n\nrule broken {\n  strings: $a = "x"\n  condition: $b\n}\n'
    )
    path = tmp_path / "rules.yaml"
    path.write_text(HEAD + "yara: [y/*.yar]\n")
    assert [str(p) for p in validate_rules([path])] == [f'{yar}:6:1: YARA: undefined string "$b"']


def test_yara_bad_scope(tmp_path):
    yar = tmp_path / "scope.yar"
    yar.write_text('rule s { meta: scope = "disk" condition: true }\n')
    path = tmp_path / "rules.yaml"
    path.write_text(HEAD + "yara: [scope.yar]\n")
    assert [str(p) for p in validate_rules([path])] == [
        f"{yar}:1:1: YARA rule s: meta scope 'disk' must list some of file, cmdline, environ, memory"
    ]


def test_layered_validation_reports_site_position(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(HEAD + "lists:\n  pool_ports: {extend: [not-a-port]}\n")
    messages = [str(p) for p in validate_rules([shipped_rules_file(), site])]
    assert messages and all(m.startswith(f"{site}:3:25: ") for m in messages), messages
    assert "'not-a-port' is not a number or range" in messages[0]


EVERY_ERROR = """\
version: 1
rules:
  - id: r1
    description: ""
    severity: extreme
    weight: 500
    colour: red
    condition:
      all:
        - {signal: cmd_line, matches: x}
        - {signal: cmdline, matches: '(ab'}
        - any:
            - {signal: connect_ports, in_list: portz}
            - {signal: comm, equals: 5, extra: 1}
  - id: "Bad Id"
    severity: extreme
    condition: {signal: nope, is: 1}
  - id: r3
    description: x
    severity: high
    weight: 5
    condition: {sgnal: cmdline, matches: x}
  - id: r4
    description: x
    severity: high
    weight: 5
    condition: {not: {signal: cmdline, matches: '(', matches2: y}}
  - id: r5
    description: x
    severity: high
    weight: 5
    condition: {all: [{signal: nope, is: 1}], any: [{signal: comm, is: 5}], x: 1}
"""
# (line:col, rule label, words) of every problem, in file order (as `rules validate` prints them)
EVERY_PROBLEM = [
    ("4:18", "r1", "description must be non-empty text"),
    ("5:15", "r1", "severity 'extreme' must be one of"),
    ("6:13", "r1", "weight 500 must be a whole number"),
    ("7:5", "r1", "unknown rule key 'colour'"),
    ("10:20", "r1", "unknown signal 'cmd_line'"),
    ("11:38", "r1", "bad regular expression '(ab'"),
    ("13:48", "r1", "unknown list 'portz'"),
    ("14:30", "r1", "unknown operator 'equals'"),
    ("14:41", "r1", "unknown operator 'extra'"),
    ("15:9", None, "rule id 'Bad Id' must be lower-case"),
    ("16:15", "#2", "severity 'extreme' must be one of"),
    ("17:25", "#2", "unknown signal 'nope'"),
    ("22:16", "r3", "a condition with an operator needs `signal: NAME`"),
    ("22:17", "r3", "unknown condition key 'sgnal'"),
    ("27:49", "r4", "bad regular expression '('"),
    ("27:54", "r4", "unknown operator 'matches2'"),
    ("32:32", "r5", "unknown signal 'nope'"),
    ("32:47", "r5", "all: must be alone in its map (found also 'any')"),
    ("32:77", "r5", "all: must be alone in its map (found also 'x')"),
]


def test_rules_validate_reports_every_error_of_every_rule(tmp_path):
    """Not the first problem per rule: every field, every condition leaf, every unknown key."""
    path = tmp_path / "rules.yaml"
    path.write_text(EVERY_ERROR)
    path.chmod(0o600)
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and run.stderr == f"{len(EVERY_PROBLEM)} problems\n", run
    lines = run.stdout.splitlines()
    assert len(lines) == len(EVERY_PROBLEM), lines
    for line, (where, rule, words) in zip(lines, EVERY_PROBLEM, strict=True):
        prefix = f"{path}:{where}: " + (f"rule {rule}: " if rule else "")
        assert line.startswith(prefix) and words in line, (line, prefix, words)


# A site rule that reads only what generic rules read (a pool-like port, a busy thread) and is
# not tagged generic escapes the cap; one tagged generic, or one reading a specific fact, does not.
SITE_RULES = """\
version: 1
rules:
  - id: site-cache-port
    description: our cache port
    severity: low
    weight: 25
    condition: {signal: connect_ports, contains: 11211}
  - id: site-cache-port-generic
    description: our cache port, tagged generic
    severity: low
    tags: [generic]
    weight: 25
    condition: {signal: connect_ports, contains: 11212}
  - id: site-stratum
    description: a specific fact
    severity: high
    weight: 25
    condition: {signal: cmdline, matches: stratum}
  - id: net-pool-port
    override: {tags: [T1496, network], weight: 30}
"""


def _validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuguard", "rules", "validate", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_validate_warns_when_a_site_rule_lets_generic_facts_reach_suspicious(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE_RULES)
    site.chmod(0o600)
    run = _validate(shipped_rules_file(), site)
    assert run.returncode == 0, run
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and run.stderr.startswith("2 warnings: "), run
    new, changed = sorted(warnings, key=lambda w: "net-pool-port" in w)
    assert new.startswith(f"warning: {site}:3:9: rule site-cache-port: not tagged generic")
    assert "(connect_ports)" in new and ">= suspicious 40" in new
    # an override that drops the tag from a shipped generic rule is named too
    assert "rule net-pool-port: as a later file changed it, not tagged generic" in changed
    assert "rule site-cache-port-generic:" not in run.stdout and "site-stratum" not in run.stdout
    # the shipped rules alone warn of nothing
    alone = _validate(shipped_rules_file())
    assert alone.returncode == 0 and "warning" not in alone.stdout + alone.stderr, alone
