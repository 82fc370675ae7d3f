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
