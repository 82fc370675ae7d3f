"""Stage 2, enrich: a process's /proc facts and config files, YARA over its image, exe hash.

Before a batch is correlated (:meth:`EnrichStage.batch`), the stage reads what correlation
will need: the facts (with config files) of every process the batch makes the correlator meet
for the first time and of every new image (an exec), the config files of the facts records
in the batch, the YARA verdict of each new image and the exe hash the allowlist pins.  The
correlator takes them through its facts provider and ``on_new_facts`` hook
(:meth:`EnrichStage.facts_of`, :meth:`EnrichStage.on_new_facts`); what the batch did not
foresee (an item fed outside a batch) is read there and then, as before, so nothing is ever
left out.  What was read and not used is dropped at the end of the batch (counted).  The
stage owns the YARA scanner and its verdict cache (a changed YARA file list gets a new
scanner; the cache is saved at stop).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpuguard.agent.context import AgentContext
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import (
    ConnActivity,
    Connect,
    CpuActivity,
    Exec,
    GpuIoctl,
    GpuOpen,
    HugeAlloc,
    NetPayload,
)
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.proc.config_files import attach_config_files
from gpuguard.sources.proc.pod_names import PodNames, pod_names_for
from gpuguard.sources.proc.process import collect_process_facts

if TYPE_CHECKING:
    from gpuguard.detect.ruleset.load import RuleSet

# events whose process the correlator creates (facts read) on first sight
_MEETS = frozenset((GpuOpen, GpuIoctl, Connect, NetPayload, ConnActivity, HugeAlloc, CpuActivity))
_NOT_READ = object()


class EnrichStage:
    """Facts, YARA and exe hashes for new processes and new images."""

    def __init__(self, ctx: AgentContext, ruleset: RuleSet) -> None:
        self.ctx = ctx
        self.ruleset = ruleset  # the rule set in force (its allowlist pins exe hashes)
        self.yara_scanner = self._yara_scanner(ruleset)  # None without YARA files
        # the pod's names and the image, from the node (kubelet log tree, runtime state)
        config = ctx.config
        self.pod_names: PodNames = pod_names_for(config.kubernetes_log_root, config.containerd_root)
        self._facts: dict[int, ProcessFacts | None] = {}  # pid -> facts read for this batch
        self._yara: dict[int, tuple[ProcessFacts, Any]] = {}  # id(facts) -> (facts, result)
        self._sha: dict[int, tuple[ProcessFacts, str | None]] = {}  # id(facts) -> (facts, hash)
        self.counts = {"facts_read": 0, "facts_unused": 0, "yara_scans": 0, "late_reads": 0}

    @contextmanager
    def batch(self, items: list, correlator: Any) -> Iterator[None]:
        """Read what correlating ``items`` needs (see the module docstring), then correlate."""
        self._prepare_batch(items, correlator)
        try:
            yield
        finally:
            self.counts["facts_unused"] += len(self._facts)
            self._facts.clear()
            self._yara.clear()
            self._sha.clear()

    def _prepare_batch(self, items: list, correlator: Any) -> None:
        state_of = correlator.state_of
        wanted: dict[int, None] = {}
        for item in items:
            kind = type(item)
            if kind in _MEETS:
                if item.pid not in wanted and state_of(item.pid) is None:
                    wanted[item.pid] = None
            elif kind is Exec:
                wanted[item.pid] = None  # first sight, or a new image: its facts are read again
            elif kind is ProcessFacts:
                facts = attach_config_files(item, self.ctx.proc_root)
                if facts.pod_namespace is None:  # a live sweep's record (a replayed one has them)
                    self.pod_names.fill(facts)
                self._prepare(facts, correlator)
            elif kind is GpuSnapshot:
                for usage in item.processes:
                    if usage.pid not in wanted and state_of(usage.pid) is None:
                        wanted[usage.pid] = None
        for pid in wanted:
            try:
                facts = self._read(pid)
            except Exception:  # noqa: BLE001 - read again inside correlation, which reports it
                continue
            self._facts[pid] = facts
            if facts is not None:
                self._prepare(facts, None)

    def _read(self, pid: int) -> ProcessFacts | None:
        self.counts["facts_read"] += 1
        facts = collect_process_facts(pid, self.ctx.proc_root)
        if facts is None:
            return None
        return attach_config_files(self.pod_names.fill(facts), self.ctx.proc_root)

    def _prepare(self, facts: ProcessFacts, correlator: Any) -> None:
        """YARA and exe hash for facts the correlator will adopt (``correlator``: a facts
        record, scanned only when its process is new or not scanned yet)."""
        proc_root = self.ctx.proc_root
        scanner = self.yara_scanner
        try:
            if scanner is not None and not facts.kernel_thread:
                state = (
                    correlator.get(ProcessKey(facts.pid, facts.start_time))
                    if correlator is not None
                    else None
                )
                if state is None or not state.yara_scanned:
                    self._yara[id(facts)] = (facts, scanner.scan_process(facts, proc_root))
                    self.counts["yara_scans"] += 1
            digest = self.ruleset.allowlist.exe_sha256_if_needed(facts, proc_root)
            self._sha[id(facts)] = (facts, digest)
        except Exception:  # noqa: BLE001 - done again inside correlation, which reports it
            return

    def facts_of(self, pid: int) -> ProcessFacts | None:
        """The correlator's facts provider: the facts read for this batch (once), else a read now."""
        facts = self._facts.pop(pid, _NOT_READ)
        if facts is not _NOT_READ:
            return facts  # type: ignore[return-value]
        self.counts["late_reads"] += 1
        return self._read(pid)

    def on_new_facts(self, state: ProcessState, facts: ProcessFacts) -> None:
        """New facts (first sight, or exec): YARA scan once per image; exe hash when the
        allowlist pins one (what the batch prepared, else done now)."""
        proc_root = self.ctx.proc_root
        if self.yara_scanner is not None and not state.yara_scanned and not facts.kernel_thread:
            kept = self._yara.pop(id(facts), None)
            if kept is not None and kept[0] is facts:
                result = kept[1]
            else:
                result = self.yara_scanner.scan_process(facts, proc_root)
                self.counts["yara_scans"] += 1
            state.add_yara_result(result.rules, result.tags, scanned=True)
        kept_sha = self._sha.pop(id(facts), None)
        if kept_sha is not None and kept_sha[0] is facts:
            state.exe_sha256 = kept_sha[1]
        else:
            state.exe_sha256 = self.ruleset.allowlist.exe_sha256_if_needed(facts, proc_root)

    def use_ruleset(self, ruleset: RuleSet) -> None:
        """A reloaded rule set; a changed YARA file list gets a new scanner."""
        if [str(p) for p in ruleset.yara_files] != [str(p) for p in self.ruleset.yara_files]:
            if self.yara_scanner is not None:
                self.yara_scanner.save()
            self.yara_scanner = self._yara_scanner(ruleset)
        self.ruleset = ruleset

    def _yara_scanner(self, ruleset: RuleSet) -> Any:
        """YARA over each new executable, with the verdict cache ``scan`` keeps; None without YARA files."""
        if not ruleset.yara_files:
            return None
        from gpuguard.detect.yara.persistent import PersistentYaraScanner

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
