"""A GPU source with no GPU of its kind on the host is information (`source-absent`), not
`degraded`: every NVIDIA node lacks amdsmi, and the agent-blind Sigma rule must stay quiet there.
`degraded` keeps its meaning: the host has the vendor's GPU and its source still fails."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.counters import AgentCounters
from gpuguard.agent.intake import BoundedQueue
from gpuguard.agent.pipeline import Agent
from gpuguard.agent.stages.s1_produce.producers import SamplerThread
from gpuguard.sources.gpu.registry import BY_NAME, open_source
from gpuguard.sources.gpu.sampler import SourceUnavailable
from tests.support.agent_run import REPO, agent_running, log_records, until
from tests.support.sigma_match import sigma_matches

BLIND = yaml.safe_load((REPO / "packaging/sigma/gpuguard_agent_blind.yml").read_text())
# PCI functions as sysfs shows them (vendor, class): what each source's GPUs look like, and
# what the same vendors put on a bus that is no GPU.
H100 = ("0x10de", "0x030200")
NVSWITCH = ("0x10de", "0x068000")  # NVIDIA's NVLink switch: a bridge, not a GPU
MI300X = ("0x1002", "0x120000")  # AMD Instinct: a processing accelerator
EPYC_ROOT = ("0x1022", "0x060000")  # an AMD CPU's host bridge


def fake_root(tmp_path: Path, functions: list[tuple[str, str]], drm_card: bool = False) -> Path:
    """``root/sys`` with these PCI functions (and a DRM card), ``root/proc`` the real /proc."""
    root = tmp_path / "root"
    for i, (vendor, klass) in enumerate(functions):
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:{i + 1:02x}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(klass + "\n")
    (root / "sys" / "class" / "drm").mkdir(parents=True, exist_ok=True)
    if drm_card:
        (root / "sys" / "class" / "drm" / "card0").mkdir()
    (root / "proc").symlink_to("/proc")
    return root


@pytest.mark.parametrize(
    ("functions", "drm", "present"),
    [
        ([H100, NVSWITCH, EPYC_ROOT], False, {"nvml"}),
        ([NVSWITCH, EPYC_ROOT], False, set()),
        ([MI300X, EPYC_ROOT], True, {"amdsmi", "drm-fdinfo"}),
        ([], False, set()),
    ],
)
def test_each_source_knows_whether_the_host_has_its_gpus(tmp_path, functions, drm, present):
    root = fake_root(tmp_path, functions, drm)
    found = {name for name, source in BY_NAME.items() if source.has_gpus(str(root / "sys"))}
    assert found == present


def test_a_missing_library_is_absent_without_the_vendors_gpu_and_a_fault_with_it(tmp_path):
    # ROCm's libamd_smi.so is not installed here (nor on the GPU test machine)
    without = fake_root(tmp_path / "a", [H100])
    with pytest.raises(SourceUnavailable) as absent:
        BY_NAME["amdsmi"].open(str(without / "proc"))
    assert absent.value.absent and "libamd_smi.so" in absent.value.cause
    with_mi300 = fake_root(tmp_path / "b", [MI300X])
    with pytest.raises(SourceUnavailable) as missing:
        BY_NAME["amdsmi"].open(str(with_mi300 / "proc"))
    assert not missing.value.absent and missing.value.cause == absent.value.cause


def test_the_agent_logs_absent_sources_as_information_and_a_blind_one_as_degraded(tmp_path):
    """An in-process agent on a host (its sysfs) with an AMD Instinct and no NVIDIA GPU: amdsmi
    cannot load (no ROCm here) and is `degraded`, which the agent-blind rule reports; NVML and
    DRM fdinfo have no GPU to read and are `source-absent`, which it does not."""
    root = fake_root(tmp_path, [MI300X, EPYC_ROOT])
    log = tmp_path / "agent.log"
    config = AgentConfig(
        sensor="proc", log_path=str(log), status_path=tmp_path / "status.json", sweep_interval_s=1
    )
    agent = Agent(
        config, install_signals=False, stderr=lambda line: None, proc_root=str(root / "proc")
    )
    with agent_running(agent):

        def said() -> dict[str, dict]:
            return {
                r["gpuguard"]["detail"].get("source"): r
                for r in log_records(log)
                if r.get("gpuguard", {}).get("kind") == "lifecycle"
                and r["event"]["action"] in ("source-absent", "degraded")
                and "source" in r["gpuguard"].get("detail", {})
            }

        lines = until(lambda: (lambda d: d if len(d) == 3 else None)(said()), timeout=30)
    assert {s: r["event"]["action"] for s, r in lines.items()} == {
        "nvml": "source-absent",
        "drm-fdinfo": "source-absent",
        "amdsmi": "degraded",
    }
    assert lines["amdsmi"]["gpuguard"]["detail"]["gpus_present"] is True
    assert lines["nvml"]["log"]["level"] == "info" and lines["amdsmi"]["log"]["level"] == "warning"
    assert "NVML not available" in lines["nvml"]["message"]
    assert sigma_matches(BLIND, lines["amdsmi"])
    assert not sigma_matches(BLIND, lines["nvml"]) and not sigma_matches(BLIND, lines["drm-fdinfo"])


def _sampler_thread(source: str, root: Path, lines: list) -> tuple[SamplerThread, list[float]]:
    opened: list[float] = []

    def opener():
        opened.append(time.monotonic())
        return open_source(source, str(root / "proc"))

    thread = SamplerThread(
        source,
        opener,
        BoundedQueue(100),
        AgentCounters(),
        threading.Event(),
        emit=lines.append,
        reopen_s=0.05,
    )
    return thread, opened


@pytest.mark.parametrize(
    ("source", "appears"),
    [("amdsmi", "pci"), ("drm-fdinfo", "drm")],
)
def test_an_absent_source_is_opened_again_only_when_a_device_appears(tmp_path, source, appears):
    """An absent source costs a directory read a minute, not a library load and a sysfs walk
    (a few ms in one burst, for each source a node lacks); a device that is hot-plugged, or a
    DRM driver that loads, still gets it opened."""
    root = fake_root(tmp_path, [H100, EPYC_ROOT])
    lines: list = []
    thread, opened = _sampler_thread(source, root, lines)
    thread.start()
    try:
        time.sleep(0.6)  # twelve reopen periods
        assert len(opened) == 1, opened
        assert thread.hardware_same is not None
        assert [line.action for line in lines] == ["source-absent"]
        if appears == "pci":
            device = root / "sys" / "bus" / "pci" / "devices" / "0000:41:00.0"
            device.mkdir()
            (device / "vendor").write_text(MI300X[0] + "\n")
            (device / "class").write_text(MI300X[1] + "\n")
        else:
            (root / "sys" / "class" / "drm" / "card0").mkdir()
        until(lambda: len(opened) >= 2, timeout=5)
    finally:
        thread.stop.set()
        thread.join(5)
    assert not thread.is_alive()
    if appears == "pci":  # the GPU is there and ROCm is not: now a fault, retried as one
        assert thread.hardware_same is None
        assert lines[-1].action == "degraded", lines


def test_a_source_failing_beside_its_gpus_is_still_retried_every_period(tmp_path):
    root = fake_root(tmp_path, [MI300X])  # ROCm is not installed here: degraded, not absent
    lines: list = []
    thread, opened = _sampler_thread("amdsmi", root, lines)
    thread.start()
    try:
        until(lambda: len(opened) >= 4, timeout=5)
    finally:
        thread.stop.set()
        thread.join(5)
    assert thread.hardware_same is None
    assert [line.action for line in lines] == ["degraded"]  # said once, retried quietly
