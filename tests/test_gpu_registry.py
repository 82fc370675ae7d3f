"""The GPU source list: each entry names a module whose sampler reports under that name."""

from __future__ import annotations

import importlib
import inspect

import pytest

from gpuguard.agent.config import AgentConfig, load_config
from gpuguard.errors import GpuguardError
from gpuguard.sources.gpu.registry import GPU_SOURCES, SOURCE_NAMES
from tests.support.agent_config import write


@pytest.mark.parametrize("source", GPU_SOURCES, ids=SOURCE_NAMES)
def test_each_source_module_opens_and_reports_under_its_listed_name(source):
    module = importlib.import_module(f"gpuguard.sources.gpu.{source.module}")
    # gpus and the agent match GpuSnapshot.source (the module's SOURCE) against the list
    assert module.SOURCE == source.name
    assert "proc_root" in inspect.signature(module.open_sampler).parameters
    assert source.label and source.doc


def test_names_are_unique_and_config_offers_exactly_them(tmp_path):
    assert len(set(SOURCE_NAMES)) == len(SOURCE_NAMES)
    assert AgentConfig().gpu_sources == list(SOURCE_NAMES)
    with pytest.raises(GpuguardError) as info:
        load_config(write(tmp_path, "sampling: {sources: [nvml, cuda-magic]}\n"))
    assert all(name in info.value.one_line() for name in SOURCE_NAMES)


def _failing_import(name: str):
    def import_module(_module: str):
        raise ImportError(f"No module named {name!r}", name=name)

    return import_module


def test_a_missing_vendor_library_is_unavailable_with_a_fix_and_our_own_bug_is_not(
    monkeypatch, tmp_path
):
    from gpuguard.sources.gpu import registry
    from gpuguard.sources.gpu.sampler import SourceUnavailable

    source = GPU_SOURCES[0]
    proc_root = str(tmp_path / "proc")  # beside an empty sys/: a host with no GPU
    monkeypatch.setattr(registry.importlib, "import_module", _failing_import("amdsmi"))
    with pytest.raises(SourceUnavailable) as info:
        source.open(proc_root)
    assert "amdsmi" in str(info.value) and info.value.fix and info.value.absent
    # a broken import inside gpuguard's own module is a bug: it is raised, not taken for no GPU
    broken = f"gpuguard.sources.gpu.{source.module}_helpers"
    monkeypatch.setattr(registry.importlib, "import_module", _failing_import(broken))
    with pytest.raises(ImportError) as raised:
        source.open(proc_root)
    assert not isinstance(raised.value, SourceUnavailable) and raised.value.name == broken
