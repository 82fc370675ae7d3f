"""The namespace scope holds in the kernel: kill-on-touch with ``only_act_namespaces`` kills a
blocked program in a pod of a listed namespace and lets the same program live in a pod of
another namespace, both pods under a cgroup made for the test, named as the kubelet names
them, with containerd's bundles and the kubelet's log tree laid out in a directory."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.respond import Responder
from gpuguard.sources.proc.container_images import ContainerImages
from gpuguard.sources.proc.pod_names import PodNames
from tests.support.cgroup_start import in_cgroup
from tests.support.kubernetes_pod import Pod
from tests.support.respond import cleanup, settings_for_test, state_of, verdict_for
from tests.support.touch_scope import run_in, scope_cgroup, start_in
from tests.support.workloads import build_workload

pytestmark = [pytest.mark.root, pytest.mark.self_contained]


def test_only_act_namespaces_holds_in_the_kernel(tmp_path):
    miner = tmp_path / "xminer"
    shutil.copy(build_workload(), miner)
    logs, tasks = tmp_path / "log", tmp_path / "containerd"
    with scope_cgroup() as (name, cgroup):
        team_b = Pod(cgroup, logs, tasks, "team-b", "job-7", "registry.example/batch:3")
        team_a = Pod(cgroup, logs, tasks, "team-a", "nb-alice", "registry.example/jupyter:2")
        settings = settings_for_test(actions={"malicious": ("kill-on-touch",)}, cgroups=(name,))
        settings = replace(settings, only_act_namespaces=("team-b",))
        names = PodNames(str(logs), images=ContainerImages(str(tasks)))
        # team-a's pod runs something else (a file the offender shares would be left alone)
        neighbour = subprocess.Popen(in_cgroup(["sleep", "600"], team_a.cgroup))
        offender = start_in([str(miner), "ready", "sleep:60000"], team_b.cgroup)
        responder = None
        try:
            deadline = time.monotonic() + 5
            while "sleep" not in Path(f"/proc/{neighbour.pid}/comm").read_text():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert offender.stdout.readline() == b"ready\n"
            responder = Responder(settings, mode="enforce", pod_names=names)
            # the user-space guard names the namespaces too
            assert "only_act_namespaces" in responder.guard.refusal(
                neighbour.pid, state_of(neighbour.pid).facts
            )
            state = state_of(offender.pid)
            placed = [
                o
                for o in responder.respond(verdict_for(state), state, time.time())
                if o.action == "kill-on-touch"
            ]
            assert [o.status for o in placed] == ["done"], placed
            offender.kill()
            offender.wait()
            # the same blocked program: lives in team-a's pod, dies in team-b's at its GPU open
            gpu = ["open:/dev/nvidia0"]
            assert run_in([str(miner), *gpu], team_a.cgroup)[:2] == (0, "done")
            assert run_in([str(miner), *gpu], team_b.cgroup)[:2] == (-signal.SIGKILL, "")
            assert neighbour.poll() is None
        finally:
            for proc in (neighbour, offender):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            if responder is not None:
                responder.close()
            cleanup(settings)
