"""A process's likely miner config files, read inside its own filesystem view (live only).

A miner started as ``./x`` with ``config.json`` beside it shows nothing on its
command line.  :func:`read_config_files` reads the small files it names with
``-c``/``--config`` and the usual names in its working directory, each
resolved inside the process's own root or working directory
(:mod:`gpuguard.sources.proc.files`: never a host file, whatever symlinks or
``..`` it uses).  :func:`collect_facts_with_configs` is the one way to get a
process's facts with those files attached (the correlator's live provider and
``gpuguard record`` both use it); recordings carry the field, so replay sees
the same text.  Bounded: at most ``MAX_FILES`` regular files of at most
``MAX_BYTES`` each; FIFOs and devices are never read.  Parsing the text is
``gpuguard.correlate.config_files``.

Details: docs/internals.md, "config_files".
"""

from __future__ import annotations

from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.proc.files import cwd_identity, names_absent_in_cwd, read_process_file
from gpuguard.sources.proc.late_evidence import add_late_config_evidence
from gpuguard.sources.proc.process import collect_process_facts

MAX_FILES = 4
MAX_BYTES = 65536
CONFIG_OPTIONS = ("-c", "--config", "-config", "--config-file")
_OPTION_STARTS = ("-c", "--c")  # what every one of CONFIG_OPTIONS starts with
assert all(option.startswith(_OPTION_STARTS) for option in CONFIG_OPTIONS)
CWD_CANDIDATES = ("config.json", "config.ini", "config.txt", "pools.txt")


def config_paths_from_argv(argv: list[str]) -> list[str]:
    """Paths named by -c/--config (``-c x``, ``--config=x``), in order."""
    paths: list[str] = []
    for i, arg in enumerate(argv[:256]):
        if not arg.startswith(_OPTION_STARTS):
            continue
        if arg in CONFIG_OPTIONS and i + 1 < len(argv):
            paths.append(argv[i + 1])
        else:
            for option in CONFIG_OPTIONS:
                if arg.startswith(option + "="):
                    paths.append(arg[len(option) + 1 :])
    return paths


class CwdWithoutConfigs:
    """Working directories seen to hold none of ``CWD_CANDIDATES``, by (dev, inode, mtime).

    An entry created, removed or renamed in a directory changes its mtime, so a directory
    whose identity and mtime are unchanged still has none of them.  One run's memory
    (``gpuguard scan``), bounded by ``MAX_DIRS``."""

    MAX_DIRS = 4096

    def __init__(self) -> None:
        self._dirs: set[tuple[int, int, int]] = set()
        self.hits = 0

    def known_empty(self, pid: int, proc_root: str) -> bool:
        """True when the working directory of ``pid`` is one seen without any candidate."""
        if not self._dirs:
            return False
        key = cwd_identity(pid, proc_root)
        if key is not None and key in self._dirs:
            self.hits += 1
            return True
        return False

    def look(self, pid: int, proc_root: str) -> bool:
        """Look the candidates up in the working directory of ``pid``; True when none exists
        (then remembered)."""
        key = names_absent_in_cwd(pid, CWD_CANDIDATES, proc_root)
        if key is None:
            return False
        if len(self._dirs) < self.MAX_DIRS:
            self._dirs.add(key)
        return True


def read_config_files(
    pid: int,
    argv: list[str],
    proc_root: str = "/proc",
    empty_cwds: CwdWithoutConfigs | None = None,
    named: list[str] | None = None,
) -> dict[str, str]:
    """``{path as the process names it: text}`` for its likely config files.

    Each path resolves inside the process's own filesystem view and can never
    lead outside it: a hostile process cannot make us read a host file.
    ``empty_cwds``: working directories known to hold none of the usual names (scan only).
    ``named``: :func:`config_paths_from_argv` of ``argv`` when the caller has it.
    """
    names = list(named) if named is not None else config_paths_from_argv(argv)
    if empty_cwds is None or not (
        empty_cwds.known_empty(pid, proc_root) or empty_cwds.look(pid, proc_root)
    ):
        names += CWD_CANDIDATES
    out: dict[str, str] = {}
    for name in names:
        if len(out) >= MAX_FILES or not name or name in out:
            continue
        text = read_process_file(pid, name, MAX_BYTES, proc_root)
        if text is not None:
            out[name] = text
    return out


def attach_config_files(
    facts: ProcessFacts,
    proc_root: str = "/proc",
    empty_cwds: CwdWithoutConfigs | None = None,
) -> ProcessFacts:
    """Fill ``facts.config_files`` (unless already filled, or a kernel thread); returns ``facts``.

    ``empty_cwds``: see :class:`CwdWithoutConfigs` (scan only)."""
    if not facts.config_files and not facts.kernel_thread:
        named = config_paths_from_argv(facts.cmdline)
        facts.config_files = read_config_files(
            facts.pid, facts.cmdline, proc_root, empty_cwds, named
        )
        # first seen late: configs it holds open, or deleted after start (late_evidence)
        add_late_config_evidence(facts, named, proc_root)
    return facts


def collect_facts_with_configs(pid: int, proc_root: str = "/proc") -> ProcessFacts | None:
    """:func:`collect_process_facts` plus the config files (None when the process is gone)."""
    facts = collect_process_facts(pid, proc_root)
    return attach_config_files(facts, proc_root) if facts is not None else None
