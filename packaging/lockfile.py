"""Reads requirements.lock (uv's hashed pins) and writes the runtime part of it (stdlib only)."""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# uv's "# via" line for what pyproject.toml asks for directly (a dependency or an extra alike).
TOP_LEVEL = "gpuguard (pyproject.toml)"


@dataclass
class Entry:
    """One pin of the lock: its requirement line, hashes, what it is there for, and its text."""

    spec: str
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)
    text: str = ""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_name(spec: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec).group(1))


def entries(text: str) -> dict[str, Entry]:
    """name -> its Entry, as uv writes the lock (a pin, its --hash lines, then # via lines)."""
    found: dict[str, Entry] = {}
    current: Entry | None = None
    logical, block = "", ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            via = line.lstrip("#").strip()
            if current is not None:
                current.text += raw + "\n"
                if via.startswith("via"):
                    via = via[3:].strip()
                if via:
                    current.via.append(via)
            continue
        logical += " " + line.rstrip("\\")
        block += raw + "\n"
        if line.endswith("\\") or not logical.strip():
            continue
        spec, *hashes = logical.split(" --hash=")
        current = Entry(spec.strip(), [h.strip() for h in hashes], [], block)
        logical, block = "", ""
        name = spec_name(current.spec)
        if name in found:
            raise ValueError(f"{name} is in the lock twice")
        found[name] = current
    return found


def runtime_names(locked: dict[str, Entry], direct: list[str]) -> set[str]:
    """The pins the runtime dependencies need: those named, and what they need in turn.

    uv's "# via" says who needs a pin, so a pin is runtime when any of its "via" is."""
    names = {spec_name(d) for d in direct}
    missing = names - set(locked)
    if missing:
        raise ValueError(
            f"{sorted(missing)} not in the lock (fix: bash packaging/setup-host.sh lock)"
        )
    while True:
        more = {
            n for n, e in locked.items() if n not in names and names & set(map(canonical, e.via))
        }
        if not more:
            return names
        names |= more


def runtime_lock(lock: Path, pyproject: Path) -> str:
    """The lock's text cut to the runtime pins (hashes kept, so pip --require-hashes takes it)."""
    locked = entries(lock.read_text())
    direct = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    keep = runtime_names(locked, direct)
    head = f"# The runtime part of {lock.name} (packaging/lockfile.py): no test or dev extras.\n"
    return head + "".join(e.text for n, e in locked.items() if n in keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job", choices=["runtime"], help="runtime: print the runtime pins")
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements.lock")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(runtime_lock(args.lock, args.pyproject))
    except (OSError, ValueError) as exc:
        print(f"lockfile: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
