"""A GPU binding is not imported where its library is absent: the early answer is the one the
real binding gives (each side run in a fresh interpreter, so neither sees the other's import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_EARLY = """
import json, sys
from gpuguard.sources.gpu import {module}
from gpuguard.sources.gpu.sampler import SourceUnavailable
try:
    {module}.load_library()
    line = None
except SourceUnavailable as exc:
    line = exc.one_line()
print(json.dumps([line, {binding!r} in sys.modules]))
"""
_NVML_ITSELF = """
import json, pynvml
try:
    pynvml.nvmlInit()
    line = None
except pynvml.NVMLError as exc:
    line = exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
print(json.dumps(line))
"""
_AMDSMI_ITSELF = """
import contextlib, io, json
try:
    with contextlib.redirect_stdout(io.StringIO()):
        import amdsmi
    absent = False
except (KeyError, OSError):
    absent = True
print(json.dumps(absent))
"""


def _python(code: str):
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_nvml_without_its_library_answers_as_nvml_init_does():
    line, imported = _python(_EARLY.format(module="nvml", binding="pynvml"))
    library_not_found = _python(_NVML_ITSELF)
    if library_not_found:
        assert line == (
            "library not found (fix: install the NVIDIA driver (it ships libnvidia-ml.so.1))"
        )
        assert not imported  # answered before importing pynvml
    else:
        assert line is None and imported


def test_amdsmi_without_its_library_answers_as_its_import_does():
    line, imported = _python(_EARLY.format(module="amd", binding="amdsmi"))
    if _python(_AMDSMI_ITSELF):
        assert line == (
            "libamd_smi.so not found "
            "(fix: install ROCm's amd-smi-lib (it ships libamd_smi.so) or set ROCM_PATH)"
        )
        assert not imported
    else:
        assert line is None and imported


_STACK_EARLY = """
import json, sys
from gpuguard.sources.host.gpu_stack import read_nvml
print(json.dumps([read_nvml()[2], "pynvml" in sys.modules]))
"""
_STACK_ITSELF = """
import json, pynvml
try:
    pynvml.nvmlInit()
    line = None
except pynvml.NVMLError as exc:
    line = f"NVML: {exc}" if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND else None
print(json.dumps(line))
"""


def test_the_gpu_stack_without_nvml_says_what_nvml_init_says_without_importing_it():
    line, imported = _python(_STACK_EARLY)
    itself = _python(_STACK_ITSELF)
    if itself is not None:
        assert line == itself == "NVML: NVML Shared Library Not Found"
        assert not imported
    else:
        assert imported
