"""Contract: every pynvml/amdsmi name the adapters use exists in the real installed packages and in the fakes.

The adapters (gpuguard/sources/gpu/nvml*.py, amd.py) are tested against fakes
(tests/fakes); this test keeps the fakes and the adapters honest against the
real bindings.  pynvml imports without a driver; amdsmi raises at import
without ROCm, so its source files are read (ast), never imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ADAPTERS = {
    "pynvml": sorted((REPO / "gpuguard/sources/gpu").glob("nvml*.py")),
    "amdsmi": [REPO / "gpuguard/sources/gpu/amd.py"],
}
# How each adapter refers to its library: a local/parameter name or a `self.` attribute.
ALIASES = {"pynvml": {"nvml", "pynvml", "_nvml"}, "amdsmi": {"smi", "amdsmi", "_smi"}}
# Tables of names the adapters look up with getattr/hasattr (module constants holding library names).
NAME_TABLES = {
    "pynvml": ("INIT_FAILURES", "LOST_CODES", "REINIT_CODES", "PROCESS_LISTS"),
    "amdsmi": (),
}
# Names of older library versions only, looked up with getattr(..., None) and skipped when absent.
LEGACY = {
    "amdsmi": {
        "amdsmi_get_gpu_process_info": "amdsmi before 6.4 listed handles, details by a second call"
    }
}


def _alias(node: ast.AST, aliases: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in aliases) or (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr in aliases
    )


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def names_used(library: str) -> set[str]:
    """'name' or 'Class.member' for every library attribute the adapter's modules touch."""
    tree = ast.Module(
        body=[node for path in ADAPTERS[library] for node in ast.parse(path.read_text()).body],
        type_ignores=[],
    )
    aliases = ALIASES[library]
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _alias(node.value, aliases):
            used.add(node.attr)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and _alias(node.value.value, aliases)
            and node.value.attr[:1].isupper()
        ):
            used.add(f"{node.value.attr}.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and _alias(node.args[0], aliases)
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            used.add(node.args[1].value)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in NAME_TABLES[library] for t in node.targets
        ):
            value, table = node.value, node.targets[0].id
            if table == "PROCESS_LISTS":  # {kind: (function names, newest first)}
                used |= set().union(*(_strings(v) for v in value.values))
            elif isinstance(value, ast.Dict):  # {error code name: (cause, fix)}
                used |= {k.value for k in value.keys if isinstance(k, ast.Constant)}
            else:  # (error code names)
                used |= _strings(value)
    return used


def _source_names(package_dir: Path) -> set[str]:
    """Module-level names and class members defined anywhere in a package's source files."""
    names: set[str] = set()
    for path in package_dir.glob("*.py"):
        tree = ast.parse(path.read_text(errors="replace"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(node.name)
                for item in node.body:
                    targets = (
                        item.targets
                        if isinstance(item, ast.Assign)
                        else [item.target]
                        if isinstance(item, ast.AnnAssign)
                        else []
                    )
                    names |= {f"{node.name}.{t.id}" for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _has(module, name: str) -> bool:
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_the_adapters_use_names_at_all():
    # the extraction works: a few names every version has
    assert {
        "nvmlInit",
        "NVMLError",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "NVML_ERROR_GPU_IS_LOST",
    } <= names_used("pynvml")
    assert {"amdsmi_init", "AmdSmiLibraryException", "AmdSmiClkType.GFX"} <= names_used("amdsmi")


def test_every_pynvml_name_exists_in_the_real_package_and_the_fake():
    real = importlib.import_module("pynvml")  # loads no library until nvmlInit
    from tests.fakes.fake_pynvml import FakeNvml

    used = names_used("pynvml")
    assert sorted(n for n in used if not _has(real, n)) == []
    assert sorted(n for n in used if not _has(FakeNvml().module, n)) == []


def test_every_amdsmi_name_exists_in_the_real_package_and_the_fake():
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("amdsmi is not installed: it is a test dependency (pyproject.toml)")
    real = _source_names(Path(next(iter(spec.submodule_search_locations))))
    from tests.fakes.fake_amdsmi import FakeAmdSmi

    used = names_used("amdsmi")
    assert sorted(n for n in used if n not in real and n not in LEGACY["amdsmi"]) == []
    assert not set(LEGACY["amdsmi"]) & real, (
        "a legacy name is back in the installed amdsmi: drop it from LEGACY"
    )
    assert (
        sorted(n for n in used if not _has(FakeAmdSmi().module, n) and n not in LEGACY["amdsmi"])
        == []
    )
