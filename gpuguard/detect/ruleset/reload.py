"""Hot reload of rules for long-running commands: SIGHUP or a changed file swaps the rule set.

:class:`RuleSetHolder` owns the current :class:`RuleSet`.  ``poll()`` (call it
from the main loop, e.g. once a second) reloads when SIGHUP arrived or when
any rule or YARA file — or the set of ``/etc/gpuguard/*.yaml`` — changed
(inode, size or mtime).  An invalid new set is not used: the last good one
stays, and one line says why.  The signal handler only sets a flag; the
reload itself runs in ``poll()``, never inside the handler.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuguard.detect.ruleset.load import MATURITIES, RuleSet, load_ruleset
from gpuguard.detect.ruleset.shipped import SITE_RULES_DIR, default_rule_paths
from gpuguard.errors import GpuguardError


def _default_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RuleSetHolder:
    """The current rule set plus the machinery to replace it safely."""

    def __init__(
        self,
        paths: Sequence[Path] | None = None,
        *,
        site_dir: Path = SITE_RULES_DIR,
        log: Callable[[str], None] = _default_log,
        on_change: Callable[[RuleSet], None] | None = None,
        maturity: str = MATURITIES[-1],
    ) -> None:
        self.paths = [Path(p) for p in paths] if paths is not None else None
        self.maturity = maturity  # the lowest tier whose rules count (the agent's setting)
        self.site_dir = site_dir
        self.log = log
        self.on_change = on_change
        self.current: RuleSet = load_ruleset(self._paths(), maturity)  # the first load must succeed
        self.generation = 1
        self.last_error: str | None = None
        self._requested = False
        self._fingerprint = self._fingerprint_now()

    def _paths(self) -> list[Path]:
        return list(self.paths) if self.paths is not None else default_rule_paths(self.site_dir)

    def _fingerprint_now(self) -> tuple:
        files = self._paths() + list(self.current.yara_files if hasattr(self, "current") else [])
        out = []
        for path in files:
            try:
                st = os.stat(path)
                out.append(
                    (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)
                )
            except OSError:
                out.append((str(path), None))
        return tuple(out)

    def request_reload(self) -> None:
        """Ask for a reload at the next :meth:`poll` (safe to call from a signal handler)."""
        self._requested = True

    def poll(self) -> RuleSet:
        """Reload if asked to or if a file changed; return the rule set to use now."""
        fingerprint = self._fingerprint_now()
        if self._requested or fingerprint != self._fingerprint:
            reason = "SIGHUP" if self._requested else "rule files changed"
            self._requested = False
            self._fingerprint = fingerprint
            self.reload(reason)
        return self.current

    def reload(self, reason: str = "reload requested") -> bool:
        """Load the rule files again; keep the current set (and say why) if they are invalid."""
        try:
            ruleset = load_ruleset(self._paths(), self.maturity)
        except GpuguardError as exc:
            self.last_error = exc.one_line()
            self.log(
                f"gpuguard: rules not reloaded ({reason}); keeping the previous rules: {self.last_error}"
            )
            return False
        self.current = ruleset
        self.generation += 1
        self.last_error = None
        self._fingerprint = self._fingerprint_now()
        self.log(
            f"gpuguard: rules reloaded ({reason}): {len(ruleset.rules)} rules from "
            f"{', '.join(str(p) for p in ruleset.sources)}"
        )
        if self.on_change is not None:
            self.on_change(ruleset)
        return True
