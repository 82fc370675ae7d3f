"""What is known about one process: its facts and everything observed about it.

A process is keyed by ``ProcessKey(pid, start_time)`` so a recycled pid never
merges two processes.  :class:`ProcessState` holds bounded observations
(GPU devices, ioctl counts and rates, connections, recognised payloads, GPU
and CPU usage windows, YARA matches); the rule signals in
``gpuguard.detect.signals`` read them.  ``dirty`` is set by every change so
scoring runs only for processes that changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuguard.correlate.windows import RateWindow, SampleWindow
from gpuguard.sources.process import ProcessFacts

if TYPE_CHECKING:
    from gpuguard.detect.score import Verdict

MAX_PATHS = 32
MAX_CONNECTIONS = 64
MAX_PAYLOADS = 16
MAX_IOCTL_NAMES = 64
GPU_WINDOW_S = 300.0
CPU_WINDOW_S = 300.0
IOCTL_WINDOW_S = 60.0
GPU_RESCORE_EVERY_S = 10.0   # GPU windows span minutes: a new sample rescores at most this often


class ProcessKey(NamedTuple):
    pid: int
    start_time: float   # seconds since the epoch, as /proc reports it (2 decimals)


@dataclass(slots=True)
class PayloadSeen:
    """A recognised first-bytes protocol on one connection."""

    time: float
    protocol: str
    detail: dict[str, Any]


@dataclass(slots=True)
class GpuUsageSample:
    time: float
    sm_util: float | None
    used_memory: int | None


@dataclass(slots=True, eq=False)
class ProcessState:
    """Facts and bounded observations for one process (see module docstring)."""

    key: ProcessKey
    facts: ProcessFacts | None = None
    provisional: bool = False         # key guessed from the first event; facts not seen yet
    comm: str = ""
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    ppid: int = 0
    parent_key: ProcessKey | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    exited_at: float | None = None
    exit_code: int | None = None
    # GPU devices
    gpu_device_classes: set[str] = field(default_factory=set)
    gpu_paths: set[str] = field(default_factory=set)
    # ioctls: totals by decoded name and category; recent rates by category
    ioctl_counts: dict[str, int] = field(default_factory=dict)
    ioctl_category_counts: dict[str, int] = field(default_factory=dict)
    ioctl_rates: dict[str, RateWindow] = field(default_factory=dict)
    # network
    connections: dict[tuple[str, int], int] = field(default_factory=dict)   # (address, port) -> attempts
    connect_total: int = 0
    payloads: list[PayloadSeen] = field(default_factory=list)
    payload_protocols: set[str] = field(default_factory=set)
    # usage windows
    gpu_util: SampleWindow = field(default_factory=lambda: SampleWindow(GPU_WINDOW_S))
    gpu_memory: SampleWindow = field(default_factory=lambda: SampleWindow(GPU_WINDOW_S))
    gpu_memory_total: int | None = None    # summed totals of the devices it uses
    gpu_samples: list[GpuUsageSample] = field(default_factory=list)  # last few, for evidence
    cpu: SampleWindow = field(default_factory=lambda: SampleWindow(CPU_WINDOW_S))
    # scanning
    yara_matches: set[str] = field(default_factory=set)
    yara_tags: set[str] = field(default_factory=set)
    yara_scanned: bool = False
    gpu_rescored_at: float | None = None
    exe_sha256: str | None = None
    # bookkeeping
    lost_events: int = 0
    dirty: bool = True
    verdict: "Verdict | None" = None
    parent_verdict: "Verdict | None" = None   # the parent's latest verdict, set before scoring
    derived: dict[str, Any] = field(default_factory=dict)   # signal caches, cleared on identity change

    @property
    def pid(self) -> int:
        return self.key.pid

    @property
    def exited(self) -> bool:
        return self.exited_at is not None

    def touch(self, time: float, changed: bool = True) -> None:
        """Note activity at ``time``; ``changed`` marks the state for rescoring."""
        if time > self.last_seen:
            self.last_seen = time
        if changed:
            self.dirty = True

    def set_facts(self, facts: ProcessFacts) -> None:
        """Adopt /proc facts (first sight, or a fresh collection after exec)."""
        self.facts = facts
        self.provisional = False
        if facts.comm:
            self.comm = facts.comm
        if facts.exe:
            self.exe = facts.exe
        if facts.cmdline:
            self.cmdline = list(facts.cmdline)
        if facts.ppid:
            self.ppid = facts.ppid
        if facts.cpu_percent is not None:
            self.cpu.add(max(self.last_seen, self.first_seen), facts.cpu_percent)
        self.derived.clear()
        self.dirty = True

    def add_ioctl(self, time: float, name: str, category: str, count: int, track_rate: bool = True) -> bool:
        """Count ioctls (and their recent rate, when ``track_rate``); True when a name or category is new."""
        counts = self.ioctl_counts
        new = False
        if name in counts:
            counts[name] += count
        elif len(counts) < MAX_IOCTL_NAMES:
            counts[name] = count
            new = True
        categories = self.ioctl_category_counts
        if category in categories:
            categories[category] += count
        else:
            categories[category] = count
            new = True
        if track_rate:
            window = self.ioctl_rates.get(category)
            if window is None:
                window = self.ioctl_rates[category] = RateWindow(IOCTL_WINDOW_S)
            window.add(time, count)
        return new

    def add_connection(self, address: str, port: int) -> bool:
        """Count one connect; True when the endpoint is new (and fits the bounded table)."""
        self.connect_total += 1
        endpoint = (address, port)
        if endpoint in self.connections:
            self.connections[endpoint] += 1
            return False
        if len(self.connections) >= MAX_CONNECTIONS:
            return False
        self.connections[endpoint] = 1
        self.derived.pop("net", None)
        self.derived.pop("signals:net", None)
        return True

    def add_payload(self, time: float, protocol: str, detail: dict[str, Any]) -> bool:
        """Keep a recognised payload; True when it added something (a new protocol or a kept detail)."""
        new = protocol not in self.payload_protocols
        self.payload_protocols.add(protocol)
        if len(self.payloads) < MAX_PAYLOADS and not any(
            p.protocol == protocol and p.detail == detail for p in self.payloads
        ):
            self.payloads.append(PayloadSeen(time, protocol, dict(detail)))
            new = True
        if new:
            self.derived.pop("net", None)
            self.derived.pop("signals:net", None)
        return new

    def add_gpu_sample(self, time: float, sm_util: float | None, used_memory: int | None) -> bool:
        """Add one sample; True when it is time to rescore (first sample, then every GPU_RESCORE_EVERY_S)."""
        if sm_util is not None:
            self.gpu_util.add(time, sm_util)
        if used_memory is not None:
            self.gpu_memory.add(time, float(used_memory))
        self.gpu_samples.append(GpuUsageSample(time, sm_util, used_memory))
        if len(self.gpu_samples) > 8:
            del self.gpu_samples[0]
        if self.gpu_rescored_at is None or time - self.gpu_rescored_at >= GPU_RESCORE_EVERY_S:
            self.gpu_rescored_at = time
            return True
        return False


def __getattr__(name: str) -> Any:
    # ``from gpuguard.correlate.state import Correlator`` keeps working although the
    # correlator lives in its own module (it imports this one).
    if name == "Correlator":
        from gpuguard.correlate.correlator import Correlator

        return Correlator
    raise AttributeError(name)
