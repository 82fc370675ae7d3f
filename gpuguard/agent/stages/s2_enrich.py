"""Stage 2, enrich: a process's /proc facts and config files, YARA over its image, exe hash.

The stage owns the facts provider the correlator calls on first sight and after an exec, and
the ``on_new_facts`` hook (YARA once per image; the exe hash when the allowlist pins one); it
owns the YARA scanner and its verdict cache (a changed YARA file list gets a new scanner; the
cache is saved at stop).
"""

from __future__ import annotations

from typing import Any

from gpuguard.agent.context import AgentContext
from gpuguard.correlate.state import ProcessState
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.process import collect_process_facts


class EnrichStage:
    """Facts, YARA and exe hashes for new processes and new images."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.ruleset: Any = None
        self.yara_scanner: Any = None
        self.counts = {"facts_read": 0, "yara_scans": 0}

    def facts_of(self, pid: int) -> ProcessFacts | None:
        """The correlator's facts provider: one /proc read of ``pid``."""
        self.counts["facts_read"] += 1
        return collect_process_facts(pid, self.ctx.proc_root)

    def on_new_facts(self, state: ProcessState, facts: ProcessFacts) -> None:
        """New facts (first sight, or exec): YARA scan once per image; exe hash when the
        allowlist pins one."""
        proc_root = self.ctx.proc_root
        if self.yara_scanner is not None and not state.yara_scanned and not facts.kernel_thread:
            result = self.yara_scanner.scan_process(facts, proc_root)
            state.add_yara_result(result.rules, result.tags, scanned=True)
            self.counts["yara_scans"] += 1
        if self.ruleset is not None:
            state.exe_sha256 = self.ruleset.allowlist.exe_sha256_if_needed(facts, proc_root)

    def use_ruleset(self, ruleset: Any) -> None:
        """The rule set in force; a changed YARA file list gets a new scanner."""
        if self.ruleset is None or [str(p) for p in ruleset.yara_files] != [
            str(p) for p in self.ruleset.yara_files
        ]:
            if self.yara_scanner is not None:
                self.yara_scanner.save()
            self.yara_scanner = self._yara_scanner(ruleset)
        self.ruleset = ruleset

    def _yara_scanner(self, ruleset: Any) -> Any:
        """YARA over each new executable, with the verdict cache ``scan`` keeps; None without YARA files."""
        if not ruleset.yara_files:
            return None
        from gpuguard.detect.yara_persistent import PersistentYaraScanner

        try:
            scanner = PersistentYaraScanner.for_files(ruleset.yara_files)
        except OSError as exc:
            self.ctx.lifecycle(
                "degraded", f"YARA scanning off: cannot read {exc.filename}: {exc.strerror}"
            )
            return None
        if scanner.note:
            self.ctx.lifecycle("degraded", f"YARA: {scanner.note}")
        return scanner

    def save(self) -> None:
        """Keep the YARA verdict cache for the next start."""
        if self.yara_scanner is not None:
            try:
                self.yara_scanner.save()
            except OSError as exc:
                self.ctx.stderr(f"gpuguard: cannot save the YARA verdict cache: {exc.strerror}")
