"""What counts as a change of the agent's state file (gpuguard/agent/stages/s7_emit/status_writer.py): an idle
agent rewrites it only as a heartbeat, not for counters that move with the clock."""

from __future__ import annotations

from gpuguard.agent.stages.s7_emit.status_writer import _status_content


def test_counters_that_move_with_every_gpu_sample_are_no_change():
    idle = {
        "updated": "2026-11-27T09:00:00Z",
        "processes_tracked": 3,
        "counters": {"samples": {"nvml": 5}, "items_correlated": 10, "scoring_runs": 7},
    }
    later = {
        **idle,
        "updated": "2026-11-27T09:00:04Z",
        "counters": {"samples": {"nvml": 6}, "items_correlated": 11, "scoring_runs": 8},
    }
    assert _status_content(later) == _status_content(idle)
    assert _status_content({**later, "processes_tracked": 4}) != _status_content(idle)


def test_the_spin_watchs_looks_are_no_change_but_the_probe_attaching_is():
    idle = {"counters": {"fpu_probe": {"attached": False, "attaches": 2, "looks": 40}}}
    later = {"counters": {"fpu_probe": {"attached": False, "attaches": 2, "looks": 41}}}
    attached = {"counters": {"fpu_probe": {"attached": True, "attaches": 3, "looks": 41}}}
    assert _status_content(later) == _status_content(idle)
    assert _status_content(attached) != _status_content(idle)
