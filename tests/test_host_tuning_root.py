"""The sensor sees a stringless CPU miner tune the host: MSR device and huge-page opens, on the real kernel.

The workload opens /dev/cpu/0/msr (a node in a private /dev, like the GPU
nodes) and the real /proc/sys/vm/nr_hugepages and
/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages read-write (it writes
nothing), connects to a loopback listener on 443, and is named like nothing in
particular.  The sensor's events go through the correlator and the shipped
rules.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from gpuguard.correlate.correlator import Correlator
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.events.abi import device_class_name
from gpuguard.events.devices import classify_device_path
from tests.support.workloads import GPU_NODES, build_workload, run_with_gpu_nodes

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]

HUGEPAGES_2M = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"


@pytest.mark.parametrize(
    "path,name",
    [
        ("/dev/cpu/0/msr", "msr"),
        ("/dev/cpu/12345/msr", "msr"),
        ("/dev/cpu/0/cpuid", "none"),
        ("/sys/module/msr/parameters/allow_writes", "msr-config"),
        ("/proc/sys/vm/nr_hugepages", "hugepages-config"),
        (HUGEPAGES_2M, "hugepages-config"),
        ("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "none"),
        ("/proc/sys/vm/nr_hugepages_mempolicy", "none"),
    ],
)
def test_user_space_classifies_the_tuning_files(path, name):
    assert device_class_name(classify_device_path(path)) == name


def test_the_sensor_reports_tuning_opens_and_the_rules_name_them():
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor
    from gpuguard.sources.proc.process import collect_process_facts

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    sensor = Sensor(ProbeSettings(), drain_interval=0.2, sweep_interval=3600)
    sensor.start()
    try:
        # an ordinary path and name: nothing but what it does gives it away
        workload = Path(f"/opt/gg-tuning-{os.getpid()}/worker")
        workload.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_workload(), workload)
        proc = run_with_gpu_nodes(
            [
                str(workload),
                "open:/dev/cpu/0/msr",
                "open:/proc/sys/vm/nr_hugepages",
                f"open:{HUGEPAGES_2M}",
                f"connect:127.0.0.1:{port}",
                "ready",
            ],
            nodes=GPU_NODES + ("/dev/cpu/0/msr",),
        )
        assert proc.stdout.readline() == b"ready\n"
        facts = collect_process_facts(proc.pid)
        events = []
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and sum(e.kind == "gpu_open" and e.pid == proc.pid for e in events) < 3
        ):
            events.extend(sensor.poll(50))
        proc.communicate(b"go\n", timeout=10)
    finally:
        sensor.close()
        listener.close()
        shutil.rmtree(f"/opt/gg-tuning-{os.getpid()}", ignore_errors=True)
    mine = [e for e in events if e.pid == proc.pid]
    opens = [(e.path, e.device_class) for e in mine if e.kind == "gpu_open"]
    assert opens == [
        ("/dev/cpu/0/msr", "msr"),
        ("/proc/sys/vm/nr_hugepages", "hugepages-config"),
        (HUGEPAGES_2M, "hugepages-config"),
    ]
    assert all(e.flags & os.O_ACCMODE == os.O_RDWR for e in mine if e.kind == "gpu_open")

    ruleset = load_ruleset([shipped_rules_file()])
    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, ruleset)
    correlator.feed(facts)
    for event in mine:
        correlator.feed(event)
    # ten minutes later the same session is still up: a long-lived miner
    verdict = next(v for v in engine.verdicts(facts.start_time + 700) if v.pid == proc.pid)
    assert {"cpu-msr-write", "cpu-hugepages-reserve", "cpu-miner-host-tuning"} <= {
        e.rule_id for e in verdict.evidence
    }
    assert (verdict.score, verdict.verdict) == (60, "suspicious"), verdict.explain()
    # right after start, without a CPU window, the tuning alone is not a verdict
    fresh = next(v for v in engine.verdicts(facts.start_time + 5) if v.pid == proc.pid)
    assert fresh.verdict == "clean", fresh.explain()
