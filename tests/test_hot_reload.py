"""RuleSetHolder: reload on file change and on SIGHUP; an invalid file keeps the last good rules."""

from __future__ import annotations

import os
import signal

import pytest

from gpuguard.detect.ruleset.reload import RuleSetHolder
from gpuguard.errors import GpuguardError

GOOD = """\
version: 1
rules:
  - id: r1
    description: first rule
    severity: low
    weight: {WEIGHT}
    condition: {signal: uid, is: 0}
"""


def write(path, text, mtime=None):
    path.write_text(text)
    path.chmod(0o644)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "rules.yaml"
    write(path, GOOD.replace("{WEIGHT}", "10"), mtime=1_000_000)
    lines: list[str] = []
    changes = []
    holder = RuleSetHolder([path], log=lines.append, on_change=changes.append)
    return path, holder, lines, changes


def test_first_load_must_succeed(tmp_path):
    path = tmp_path / "rules.yaml"
    write(path, "version: 3\n")
    with pytest.raises(GpuguardError, match="version must be 1"):
        RuleSetHolder([path])


def test_unchanged_files_do_not_reload(setup):
    path, holder, lines, changes = setup
    first = holder.current
    assert holder.poll() is first
    assert holder.generation == 1 and lines == [] and changes == []


def test_file_change_reloads(setup):
    path, holder, lines, changes = setup
    write(path, GOOD.replace("{WEIGHT}", "20"), mtime=1_000_100)
    ruleset = holder.poll()
    assert ruleset.rule("r1").weight == 20 and holder.generation == 2
    assert changes == [ruleset]
    assert lines == [f"gpuguard: rules reloaded (rule files changed): 1 rules from {path}"]


def test_invalid_change_keeps_the_last_good_rules(setup):
    path, holder, lines, changes = setup
    good = holder.current
    write(path, GOOD.replace("{WEIGHT}", "999"), mtime=1_000_200)
    assert holder.poll() is good
    assert holder.generation == 1 and changes == []
    assert len(lines) == 1
    assert lines[0].startswith(
        "gpuguard: rules not reloaded (rule files changed); keeping the previous rules: "
        f"invalid rules: {path}:6:13: rule r1: weight 999 must be a whole number"
    )
    assert "\n" not in lines[0]
    assert holder.poll() is good and len(lines) == 1  # said once, not on every poll
    write(path, GOOD.replace("{WEIGHT}", "30"), mtime=1_000_300)
    assert holder.poll().rule("r1").weight == 30 and holder.last_error is None


def test_world_writable_change_is_refused(setup):
    path, holder, lines, _ = setup
    good = holder.current
    os.chmod(path, 0o666)
    assert holder.poll() is good
    assert lines == [
        f"gpuguard: rules not reloaded (rule files changed); keeping the previous rules: "
        f"refusing rules file {path}: it is writable by group/others (mode 0666) (fix: chmod go-w {path})"
    ]


def test_deleted_file_keeps_rules(setup):
    path, holder, lines, _ = setup
    good = holder.current
    path.unlink()
    assert holder.poll() is good
    assert "rules file not found" in lines[0]


def test_sighup_reloads_even_without_a_visible_change(setup):
    path, holder, lines, changes = setup
    previous = signal.getsignal(signal.SIGHUP)
    try:
        # a handler that only asks, as the agent's own SIGHUP handler does
        signal.signal(signal.SIGHUP, lambda signum, frame: holder.request_reload())
        # Same mtime and size: only the signal can tell us to re-read.
        write(path, GOOD.replace("{WEIGHT}", "11"), mtime=1_000_000)
        os.kill(os.getpid(), signal.SIGHUP)
        ruleset = holder.poll()
        assert ruleset.rule("r1").weight == 11 and holder.generation == 2
        assert lines == [f"gpuguard: rules reloaded (SIGHUP): 1 rules from {path}"]
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_sighup_with_invalid_rules_keeps_the_old(setup):
    path, holder, lines, _ = setup
    good = holder.current
    write(path, "version: 1\nrules: 5\n", mtime=1_000_000)
    holder.request_reload()
    assert holder.poll() is good
    assert lines[0].startswith(
        "gpuguard: rules not reloaded (SIGHUP); keeping the previous rules: invalid rules: "
    )


def test_site_directory_changes_are_noticed(tmp_path):
    site = tmp_path / "etc"
    site.mkdir()
    lines: list[str] = []
    holder = RuleSetHolder(None, site_dir=site, log=lines.append)
    base = len(holder.current.rules)
    write(site / "local.yaml", GOOD.replace("{WEIGHT}", "5"))
    assert len(holder.poll().rules) == base + 1
    assert lines[0].startswith("gpuguard: rules reloaded (rule files changed)")


def test_the_shipped_rules_are_found_once_not_at_every_look_for_changed_files(
    tmp_path, monkeypatch
):
    from pathlib import Path

    site = tmp_path / "etc"
    site.mkdir()
    holder = RuleSetHolder(None, site_dir=site, log=lambda line: None)

    def no_resolve(self, strict=False):
        raise AssertionError(f"the shipped rules' place was looked up again: {self}")

    monkeypatch.setattr(Path, "resolve", no_resolve)  # each resolve is a walk of lstat calls
    holder.poll()  # the agent's look every 2 s
    write(site / "local.yaml", GOOD.replace("{WEIGHT}", "5"))
    assert len(holder.poll().rules) == len(holder.current.rules)
    assert holder.generation == 2  # a new site file is still picked up
