"""An installed copy (a wheel, as a container image would use) carries the probes and rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_package_list_names_every_code_package():
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        str(p.parent.relative_to(REPO)).replace("/", ".")
        for p in (REPO / "gpuguard").rglob("__init__.py")
    }
    assert found <= listed, (
        f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
    )


def test_a_wheel_ships_probes_and_rules_and_works_outside_the_checkout(tmp_path):
    wheel_dir, target, source = tmp_path / "wheel", tmp_path / "site", tmp_path / "source"
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("gpuguard", "probes", "rules"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheel_dir),
            str(source),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = wheel_dir.glob("gpuguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        f"gpuguard/probes/{p.name}" for p in (REPO / "probes").iterdir() if p.suffix in (".c", ".h")
    }
    shipped |= {
        f"gpuguard/rules/{p.relative_to(REPO / 'rules')}"
        for p in (REPO / "rules").rglob("*")
        if p.suffix in (".yaml", ".yar")
    }
    assert shipped and shipped <= names, sorted(shipped - names)

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    check = (
        "import gpuguard, gpuguard.detect.shipped as s, gpuguard.events.abi as a;"
        "from gpuguard.sources.probe_source import probe_text;"
        "from gpuguard.detect.rules import load_ruleset;"
        "print(gpuguard.__file__, s.shipped_rules_file(), a.probe_dir(),"
        " len(load_ruleset([s.shipped_rules_file()]).rules), 'GG_ABI_VERSION' in probe_text() "
        "and 'begin gpuguard.h' in probe_text())"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    ).stdout.split()
    assert [Path(p).is_relative_to(target) for p in out[:3]] == [True, True, True], out
    assert int(out[3]) > 0 and out[4] == "True"
