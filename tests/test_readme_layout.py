"""The README's layout table has a row for every top-level package and module of gpuguard."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Not the layout's business: the package's own docstring, and ``python -m gpuguard``.
NO_ROW = {"__init__.py", "__main__.py"}


def layout_rows(readme: str) -> set[str]:
    """The paths named in the first column of the table under ``## Layout``."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            rows |= set(re.findall(r"`([^`]+)`", line.split(" | ", 1)[0]))
    return rows


def missing_rows(readme: str, package: Path) -> list[str]:
    """Each top-level package (``gpuguard/respond/``) and module (``gpuguard/cli.py``) with no row."""
    rows = layout_rows(readme)
    wanted = [f"gpuguard/{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()] + [
        f"gpuguard/{p.name}" for p in package.glob("*.py") if p.name not in NO_ROW
    ]
    return sorted(w for w in wanted if w not in rows)


def test_every_package_and_module_has_a_row():
    assert missing_rows((ROOT / "README.md").read_text(), ROOT / "gpuguard") == []


def test_every_row_names_what_exists():
    for path in layout_rows((ROOT / "README.md").read_text()):
        assert (ROOT / path.rstrip("/")).exists(), f"README layout row {path}: no such path"


def test_the_check_catches_a_package_without_a_row(tmp_path):
    for sub in ("respond", "config", "events"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text('"""x"""\n')
    (tmp_path / "data").mkdir()  # not a package
    for name in ("__init__.py", "__main__.py", "cli.py", "errors.py"):
        (tmp_path / name).write_text("")
    readme = (
        "# x\n\n## Layout\n\n| path | owns |\n|---|---|\n"
        "| `gpuguard/events/` | the event model (`model.py`) |\n"
        "| `gpuguard/errors.py`, `gpuguard/cli.py` | errors; the command line |\n"
        "\n## Next\n\n| `gpuguard/respond/` | a table elsewhere does not count |\n"
    )
    assert missing_rows(readme, tmp_path) == ["gpuguard/config/", "gpuguard/respond/"]
