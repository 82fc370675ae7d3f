"""The one host-check list: every host rule has one check, each listed for scan, the agent or both."""

from __future__ import annotations

from gpuguard.detect.host.check_list import AGENT, HOST_CHECKS, SCAN, HostInputs, run_host_checks
from gpuguard.detect.host.rules import HOST_RULES

# What the agent gathers for its host checks (gpuguard/agent/stages/s5_report/host_findings.py).
AGENT_INPUTS = {"snapshots", "pid_states", "accounting", "tuning_root"}


def test_every_host_rule_is_fired_by_exactly_one_listed_check():
    fired = [rule for check in HOST_CHECKS for rule in check.rules]
    assert sorted(fired) == sorted(HOST_RULES)


def test_each_check_says_where_it_runs_and_why():
    for check in HOST_CHECKS:
        assert check.runs_in and check.runs_in <= {SCAN, AGENT}, check.name
        assert check.why and check.reads, check.name
        assert set(check.reads) <= set(HostInputs.__dataclass_fields__), check.name
        if AGENT in check.runs_in:
            assert set(check.reads) <= AGENT_INPUTS, f"{check.name}: the agent cannot feed it"
    assert {c.name for c in HOST_CHECKS if AGENT in c.runs_in} == {
        "gpu-memory",
        "gpu-past-users",
        "host-tuning",
    }


def test_a_check_runs_only_where_listed_and_when_its_inputs_were_gathered():
    inputs = HostInputs(ld_so_preload="/tmp/hide.so\n")
    assert [f.rule_id for f in run_host_checks(SCAN, inputs)] == ["host-ld-so-preload"]
    assert run_host_checks(AGENT, inputs) == []  # scan only
    assert run_host_checks(SCAN, HostInputs()) == []  # nothing gathered: nothing runs
