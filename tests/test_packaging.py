"""An installed copy (a wheel, as a container image would use) carries the probes and rules."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    # The kernel header set the probes compile against on nodes without headers.
    shipped |= {
        f"gpuguard/probes/headers/{p.name}" for p in (REPO / "probes" / "headers").iterdir()
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
        "import gpuguard, gpuguard.detect.ruleset.shipped as s, gpuguard.events.abi as a;"
        "from gpuguard.sources.ebpf.probe_source import probe_text;"
        "from gpuguard.detect.ruleset.load import load_ruleset;"
        "print(gpuguard.__file__, s.shipped_rules_file(), a.probe_dir(),"
        " len(load_ruleset([s.shipped_rules_file()]).rules), 'GG_ABI_VERSION' in probe_text() "
        "and 'begin gpuguard.h' in probe_text());"
        "from gpuguard.sources.ebpf.kernel_headers import bundled_archive;"
        "print(bundled_archive()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    ).stdout.split()
    assert [Path(p).is_relative_to(target) for p in out[:3] + out[5:]] == [True] * 4, out
    assert int(out[3]) > 0 and out[4] == "True"


# ---- the lock (requirements.lock) --------------------------------------------------

LOCK = REPO / "requirements.lock"
TOP_LEVEL = "gpuguard (pyproject.toml)"


def _name(name: str) -> str:
    return canonicalize_name(name)


def _lock_entries(text: str) -> dict[str, tuple[Requirement, list[str], list[str]]]:
    """name -> (the pin with its marker, its hashes, what it is there for), as uv writes the lock."""
    entries: dict[str, tuple[Requirement, list[str], list[str]]] = {}
    current: str | None = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            via = line.lstrip("#").strip()
            if current is not None and via.startswith("via"):
                via = via[3:].strip()
            if current is not None and via:
                entries[current][2].append(via)
            continue
        logical += " " + line.rstrip("\\")
        if line.endswith("\\") or not logical.strip():
            continue
        spec, *hashes = logical.split(" --hash=")
        logical = ""
        req = Requirement(spec.strip())
        current = _name(req.name)
        assert current not in entries, f"{req.name} is in the lock twice"
        entries[current] = (req, [h.strip() for h in hashes], [])
    return entries


def _pin(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req}: the lock pins with =="
    return spec.version


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed += extra
    return [Requirement(r) for r in listed]


def test_the_lock_pins_every_requirement_of_pyproject_at_a_version_it_allows():
    locked = _lock_entries(LOCK.read_text())
    problems = []
    for req in _pyproject_requirements():
        entry = locked.get(_name(req.name))
        if entry is None:
            problems.append(f"{req} is not in requirements.lock")
        elif not req.specifier.contains(_pin(entry[0]), prereleases=True):
            problems.append(f"requirements.lock pins {entry[0]}, pyproject.toml asks for {req}")
    assert not problems, problems + ["fix: bash packaging/setup-host.sh lock"]
    unhashed = [str(req) for req, hashes, _ in locked.values() if not hashes]
    assert not unhashed, f"pins without hashes (pip --require-hashes refuses them): {unhashed}"


def test_the_lock_has_nothing_pyproject_does_not_ask_for():
    locked = _lock_entries(LOCK.read_text())
    asked = {_name(r.name) for r in _pyproject_requirements()}
    stale = [n for n, (_, _, via) in locked.items() if TOP_LEVEL in via and n not in asked]
    assert not stale, (
        f"{stale}: in the lock for pyproject.toml, which no longer asks for them "
        "(fix: bash packaging/setup-host.sh lock)"
    )
    # everything else is there for something that is itself in the lock
    orphans = [
        n
        for n, (_, _, via) in locked.items()
        if not via or not all(v == TOP_LEVEL or _name(v) in locked for v in via)
    ]
    assert not orphans, f"{orphans}: in the lock for nothing the lock holds"


def test_the_parser_sees_a_disagreement():
    pin = (
        "pyyaml==6.0.4 \\\n    --hash=sha256:00\n"
        "    # via\n    #   gpuguard (pyproject.toml)\n    #   kubernetes-validate\n"
    )
    req, hashes, via = _lock_entries(pin)["pyyaml"]
    assert (
        _pin(req) == "6.0.4"
        and hashes == ["sha256:00"]
        and via == [TOP_LEVEL, "kubernetes-validate"]
    )
    assert not Requirement("pyyaml>=7").specifier.contains(_pin(req))
    old = _lock_entries("pyyaml==5.4 --hash=sha256:00\n    # via gpuguard (pyproject.toml)\n")
    assert _pin(old["pyyaml"][0]) == "5.4" and old["pyyaml"][2] == [TOP_LEVEL]


def test_the_venv_holds_exactly_the_locked_versions():
    locked = _lock_entries(LOCK.read_text())
    wanted = {
        n: _pin(req)
        for n, (req, _, _) in locked.items()
        if req.marker is None or req.marker.evaluate()
    }
    installed = {}
    for name in wanted:
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed[name] = None
    drift = sorted(
        f"{n} {installed[n]} (locked {v})" for n, v in wanted.items() if installed[n] != v
    )
    if os.environ.get("GPUGUARD_LATEST") == "1":
        pytest.skip(
            f"the newest allowed versions on purpose (--latest); drift from the lock: {drift}"
        )
    assert not drift, drift + ["fix: bash packaging/setup-host.sh setup"]
    stamp = Path(sys.prefix) / ".gpuguard-installed"
    if stamp.exists():  # a venv packaging/setup-host.sh made: its stamp follows the lock
        digest = hashlib.sha256(
            (REPO / "pyproject.toml").read_bytes() + LOCK.read_bytes()
        ).hexdigest()[:16]
        assert stamp.read_text().split() == ["locked", digest], (
            f"{sys.prefix} was not built from this lock (fix: bash packaging/setup-host.sh setup)"
        )
