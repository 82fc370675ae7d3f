"""Guard policies: per-user/group GPU limits become verdicts, and the responder acts on them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.guard_policies import (
    evaluate_guard_policies,
    gpu_indexes,
    parse_guard_policies,
)
from gpuguard.errors import GpuguardError
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.respond import Responder
from tests.support.respond import cleanup, process_state_letter, settings_for_test, state_of

NOON = time.mktime((2026, 11, 20, 12, 0, 0, 0, 0, -1))
NIGHT = time.mktime((2026, 11, 20, 3, 0, 0, 0, 0, -1))


def _state(
    pid: int, uid: int, user: str, paths: tuple[str, ...], memory_mib: int = 0
) -> ProcessState:
    state = ProcessState(key=ProcessKey(pid, 100.0))
    state.set_facts(
        ProcessFacts(
            pid=pid,
            start_time=100.0,
            comm="python3",
            exe="/usr/bin/python3",
            uid=uid,
            username=user,
        )
    )
    for path in paths:
        state.add_gpu_device("nvidia" if "nvidia" in path else "drm-render", path)
    if memory_mib:
        state.add_gpu_sample(NOON, 50.0, memory_mib << 20)
    return state


def test_gpu_indexes_from_device_paths():
    state = _state(
        10, 0, "root", ("/dev/nvidia3", "/dev/nvidiactl", "/dev/dri/renderD129", "/dev/dri/card0")
    )
    assert gpu_indexes(state) == {3, 1}


def test_each_limit_finds_its_breach_and_only_it():
    policies = parse_guard_policies(
        [
            {
                "id": "gpu0-owners",
                "gpus": [0],
                "allowed_users": ["alice"],
                "allowed_groups": ["root"],
            },
            {"id": "two-gpus", "max_gpus_per_user": 2, "action": "suspend"},
            {"id": "memory", "max_gpu_memory_per_user": "30GiB"},
            {
                "id": "office-hours",
                "gpus": [7],
                "allowed_hours": "08-20",
                "verdict": "malicious",
                "action": "kill",
            },
        ],
        source="agent.yaml",
    )
    states = [
        _state(11, 0, "root", ("/dev/nvidia0",)),  # root's group is allowed on GPU 0
        _state(12, 65534, "nobody", ("/dev/nvidia0",)),  # not allowed on GPU 0
        _state(13, 1000, "carol", ("/dev/nvidia1", "/dev/nvidia2")),
        _state(14, 1000, "carol", ("/dev/nvidia3",)),  # carol: 3 GPUs over two processes
        _state(15, 1001, "dave", ("/dev/nvidia4",), memory_mib=20_000),
        _state(16, 1001, "dave", ("/dev/nvidia5",), memory_mib=20_000),  # dave: 40000 MiB > 30 GiB
        _state(17, 1002, "erin", ("/dev/nvidia7",)),
    ]
    noon = {v.pid: v for v in evaluate_guard_policies(policies, states, NOON)}
    assert sorted(noon) == [12, 13, 14, 15, 16]
    assert (
        noon[12].evidence[0].rule_id == "guard.gpu0-owners"
        and "not allowed on GPU [0]" in noon[12].evidence[0].detail
    )
    assert noon[13].action == "suspend" and "uses 3 GPUs (max 2)" in noon[13].evidence[0].detail
    assert "40000 MiB" in noon[15].evidence[0].detail and noon[15].verdict == "suspicious"
    night = {v.pid: v for v in evaluate_guard_policies(policies, states, NIGHT)}
    assert (night[17].verdict, night[17].action) == ("malicious", "kill")
    assert "outside 08-20" in night[17].evidence[0].detail
    assert 17 not in noon


@pytest.mark.parametrize(
    "section, words",
    [
        ([{"id": "x", "max_gpu": 1}], "unknown key 'max_gpu'"),
        ([{"max_gpus_per_user": 1}], "needs a name"),
        ([{"id": "x", "allowed_hours": "8am-5pm"}], "hour range"),
        ([{"id": "x", "max_gpu_memory_per_user": "lots"}], "not a size"),
        ([{"id": "x", "action": "nuke"}], "unknown action"),
        ({"id": "x"}, "expected a list"),
    ],
)
def test_bad_policies_name_the_problem(section, words):
    with pytest.raises(GpuguardError) as caught:
        parse_guard_policies(section, source="agent.yaml")
    assert words in caught.value.cause


@pytest.mark.root
@pytest.mark.self_contained
def test_responder_acts_on_a_policy_verdict():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "up"
    settings = settings_for_test()
    try:
        state = state_of(proc.pid)
        state.add_gpu_device("nvidia", "/dev/nvidia0")
        state.add_gpu_device("nvidia", "/dev/nvidia1")
        (verdict,) = evaluate_guard_policies(
            parse_guard_policies(
                [{"id": "one-gpu", "max_gpus_per_user": 1, "action": "suspend"}], source="t"
            ),
            [state],
            time.time(),
        )
        outcomes = Responder(settings, mode="enforce").respond(verdict, state, time.time())
        assert [(o.action, o.status) for o in outcomes] == [("alert", "done"), ("suspend", "done")]
        assert outcomes[-1].rule_ids == ["guard.one-gpu"]
        time.sleep(0.3)
        assert process_state_letter(proc.pid) == "T"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        cleanup(settings)
