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
from typing import Any, NamedTuple, Protocol

from gpuguard.correlate.gpu_behaviour import GpuBehaviour
from gpuguard.correlate.network import NetworkView
from gpuguard.correlate.windows import RateWindow, SampleWindow
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import DeviceSample
from gpuguard.events.model import ConnActivity, CpuActivity
from gpuguard.events.process_facts import ProcessFacts

MAX_PATHS = 32
MAX_CONNECTIONS = 64
MAX_PAYLOADS = 16
MAX_IOCTL_NAMES = 64
MAX_SESSIONS = 16
GPU_WINDOW_S = 300.0
CPU_WINDOW_S = 300.0
IOCTL_WINDOW_S = 60.0
GPU_RESCORE_EVERY_S = 10.0  # GPU windows span minutes: a new sample rescores at most this often

# What an observation added, as bits: the correlator rescores a process only for additions
# that some rule reads (gpuguard.detect.signals.rescore.SIGNALS_READING says which signals read which).
NEW_PORT = 1  # a remote port not connected to before
NEW_ADDRESS = 2  # a remote address not connected to before
MAX_HUGE_REQUESTS = 16  # distinct (length, page size) huge-page requests kept per process
NEW_PAYLOAD = 4  # a protocol or payload detail not seen before
NEW_DEVICE_CLASS = 8  # a GPU device class not used before
NEW_GPU_PATH = 16  # a GPU device path not opened before
NEW_IOCTL_NAME = 32  # a decoded GPU ioctl name not issued before
NEW_IOCTL_CATEGORY = 64
ANY_ADDITION = 127

# What gpuguard.detect derives from a state (parsed command line, signal values, rule
# outcomes) it keeps in its own memo (detect.signals.memo), stamped with the state's
# generations: ``facts_gen`` moves with new facts, an exec or new YARA matches (everything
# derived is stale then), ``network_gen`` with a new endpoint or payload, ``devices_gen``
# with a GPU device class, path or ioctl name not used before.


class ProcessKey(NamedTuple):
    pid: int
    start_time: float  # seconds since the epoch, as /proc reports it (2 decimals)


class ScoredVerdict(Protocol):
    """What correlation keeps of a verdict (the detect layer's ``Verdict`` has these and more).

    Declared here so the state can hold a verdict, and children read their
    parent's, without correlate importing detect.
    """

    key: ProcessKey
    verdict: str
    score: int
    evidence: list  # what the score rests on (empty: nothing matched)


@dataclass(slots=True)
class PayloadSeen:
    """A recognised first-bytes protocol on one connection."""

    time: float
    protocol: str
    detail: dict[str, Any]


@dataclass(slots=True, eq=False, weakref_slot=True)
class ProcessState:
    """Facts and bounded observations for one process (see module docstring)."""

    key: ProcessKey
    facts: ProcessFacts | None = None
    provisional: bool = False  # key guessed from the first event; facts not seen yet
    comm: str = ""
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    ppid: int = 0
    parent_key: ProcessKey | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    exited_at: float | None = None
    exit_code: int | None = None
    # The pid's exit generation at its exec (gpuguard.sources.proc.identity): the response opens a
    # pidfd and acts only if it is unchanged, so it never reaches a process that reused the pid.
    exit_gen: int | None = None
    pidfd: int | None = (
        None  # opened at its exec (first sight), proven by exit_gen; closed when it goes
    )
    # GPU devices
    gpu_device_classes: set[str] = field(default_factory=set)
    gpu_paths: set[str] = field(default_factory=set)
    device_classes_written: set[str] = field(
        default_factory=set
    )  # opened for writing (msr, hugepages-config...)
    # ioctls: totals by decoded name and category; recent rates by category
    ioctl_counts: dict[str, int] = field(default_factory=dict)  # the first MAX_IOCTL_NAMES names
    ioctl_categories: set[str] = field(default_factory=set)
    ioctl_total: int = 0
    ioctl_rates: dict[str, RateWindow] = field(default_factory=dict)  # by category
    ioctl_command_rates: dict[str, RateWindow] = field(
        default_factory=dict
    )  # by name (those in ioctl_counts)
    # network
    connections: dict[tuple[str, int], int] = field(
        default_factory=dict
    )  # (address, port) -> attempts
    connect_total: int = 0
    payloads: list[PayloadSeen] = field(default_factory=list)
    payload_protocols: set[str] = field(default_factory=set)
    network: NetworkView = field(
        default_factory=NetworkView
    )  # what the connections and payloads revealed
    sessions: dict[int, ConnActivity] = field(
        default_factory=dict
    )  # fd -> latest activity record (GPU holders)
    # usage windows
    gpu_util: SampleWindow = field(
        default_factory=lambda: SampleWindow(GPU_WINDOW_S, track_minimum=True)
    )
    gpu_memory: SampleWindow = field(
        default_factory=lambda: SampleWindow(GPU_WINDOW_S, track_minimum=True)
    )
    gpu_memory_total: int | None = None  # summed totals of the devices it uses
    gpu_behaviour: GpuBehaviour = field(
        default_factory=GpuBehaviour
    )  # memory controller, power, PCIe, duty cycle
    gpu_lifetime: GpuAccounting | None = None  # NVML accounting: lifetime averages (scan)
    gpu_device_shared: bool | None = (
        None  # another process used one of its GPUs in the latest snapshot
    )
    cpu: SampleWindow = field(default_factory=lambda: SampleWindow(CPU_WINDOW_S))
    cpu_activity: CpuActivity | None = None  # the latest schedstat/FPU look (runnable threads)
    # huge pages asked for (sensor: mmap MAP_HUGETLB / shmget SHM_HUGETLB)
    huge_alloc_bytes: int = 0  # the largest single request
    huge_page_size: int = 0  # the largest page size asked for
    huge_requests: set[tuple[int, int]] = field(
        default_factory=set
    )  # (length, page size) of its huge-page requests (at most MAX_HUGE_REQUESTS)
    # scanning
    yara_matches: set[str] = field(default_factory=set)
    yara_tags: set[str] = field(default_factory=set)
    yara_scanned: bool = False
    gpu_rescored_at: float | None = None
    exe_sha256: str | None = None
    # bookkeeping
    lost_events: int = 0
    _dirty: bool = True  # read and set through ``dirty``
    verdict: ScoredVerdict | None = None  # the latest verdict (detect's Verdict)
    parent_verdict: ScoredVerdict | None = None  # the parent's latest verdict, set before scoring
    facts_gen: int = 0  # generations of its inputs (see above): detect's memo is stamped with them
    network_gen: int = 0
    devices_gen: int = 0
    dirty_set: set[ProcessState] | None = field(default=None, repr=False)  # see ``dirty``

    @property
    def dirty(self) -> bool:
        """Changed since it was last scored.  A tracked state is in its correlator's
        ``dirty_set`` exactly while dirty, so scoring visits only those."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        tracked = self.dirty_set
        if tracked is not None:
            if value:
                tracked.add(self)
            else:
                tracked.discard(self)

    @property
    def pid(self) -> int:
        return self.key.pid

    @property
    def exited(self) -> bool:
        return self.exited_at is not None

    def nothing_to_keep(self) -> bool:
        """True when forgetting this process loses nothing: scored since its last change, a clean
        verdict with no evidence, and no GPU use, network activity, YARA match or lost events."""
        verdict = self.verdict
        return (
            verdict is not None
            and not self.dirty
            and verdict.verdict == "clean"
            and not verdict.evidence
            and not self.gpu_device_classes
            and not self.gpu_paths
            and not self.ioctl_total
            and self.gpu_rescored_at is None
            and self.gpu_lifetime is None
            and not self.connect_total
            and not self.payload_protocols
            and not self.sessions
            and not self.yara_matches
            and not self.lost_events
            and not self.huge_alloc_bytes
        )

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
        self.facts_gen += 1
        self.dirty = True

    def add_gpu_device(self, device_class: str, path: str = "", written: bool = False) -> int:
        """Note a GPU device class (and path) it used, ``written`` when opened for writing;
        the NEW_* bits of what was new (0: nothing)."""
        new = 0
        if device_class and device_class not in self.gpu_device_classes:
            self.gpu_device_classes.add(device_class)
            new = NEW_DEVICE_CLASS
        if written and device_class and device_class not in self.device_classes_written:
            self.device_classes_written.add(device_class)
            new |= NEW_DEVICE_CLASS
        if path and path not in self.gpu_paths and len(self.gpu_paths) < MAX_PATHS:
            self.gpu_paths.add(path)
            new |= NEW_GPU_PATH
        if new:
            self.devices_gen += 1
        return new

    def add_ioctl(
        self, time: float, name: str, category: str, count: int, track_rate: bool = True
    ) -> int:
        """Count ioctls (and their recent rate, when ``track_rate``); the NEW_* bits of a new name or category."""
        self.ioctl_total += count
        counts = self.ioctl_counts
        new = 0
        if name in counts:
            counts[name] += count  # a known name: its category is known too
        else:
            if len(counts) < MAX_IOCTL_NAMES:
                counts[name] = count
                new = NEW_IOCTL_NAME
            if category not in self.ioctl_categories:
                self.ioctl_categories.add(category)
                new |= NEW_IOCTL_CATEGORY
        if track_rate:
            window = self.ioctl_rates.get(category)
            if window is None:
                window = self.ioctl_rates[category] = RateWindow(IOCTL_WINDOW_S)
            window.add(time, count)
            window = self.ioctl_command_rates.get(name)
            if window is None and name in counts:
                window = self.ioctl_command_rates[name] = RateWindow(IOCTL_WINDOW_S)
            if window is not None:
                window.add(time, count)
        if new:
            self.devices_gen += 1
        return new

    def add_connection(self, address: str, port: int) -> int:
        """Count one connect; NEW_PORT / NEW_ADDRESS when it reached a port or address not seen before."""
        self.connect_total += 1
        endpoint = (address, port)
        if endpoint in self.connections:
            self.connections[endpoint] += 1
            return 0
        if len(self.connections) < MAX_CONNECTIONS:
            self.connections[endpoint] = 1
        # The ports and addresses are kept beyond the table (up to NetworkView's own bounds):
        # 64 decoy connections must not hide the pool connection that follows them.
        network = self.network
        new = (NEW_PORT if port not in network.ports else 0) | (
            NEW_ADDRESS if address not in network.addresses else 0
        )
        if new:
            network.add_endpoint(address, port)
            self.network_gen += 1
        return new

    def add_payload(self, time: float, protocol: str, detail: dict[str, Any]) -> int:
        """Keep a recognised payload; NEW_PAYLOAD when it added something (a new protocol or a kept detail)."""
        new = protocol not in self.payload_protocols
        self.payload_protocols.add(protocol)
        if not any(p.protocol == protocol and p.detail == detail for p in self.payloads):
            # Details are kept beyond the list too (up to NetworkView's bounds), so decoy
            # payloads cannot hide the pool login that follows them.
            new |= self.network.add_payload_detail(detail)
            if len(self.payloads) < MAX_PAYLOADS:
                self.payloads.append(PayloadSeen(time, protocol, dict(detail)))
                new = True
        if new:
            self.network_gen += 1
            return NEW_PAYLOAD
        return 0

    def add_yara_result(
        self,
        rules: tuple[str, ...] | set[str],
        tags: tuple[str, ...] | set[str],
        *,
        scanned: bool = False,
    ) -> None:
        """Merge YARA matches (an executable scan on first sight, or a later memory scan).

        ``scanned`` records that the executable was scanned, so it is not scanned again
        until the next exec.  New matches mark the state for rescoring.
        """
        if scanned:
            self.yara_scanned = True
        if rules:
            self.yara_matches |= set(rules)
            self.yara_tags |= set(tags)
            self.facts_gen += 1
            self.dirty = True

    def add_huge_alloc(self, length: int, page_size: int) -> bool:
        """Note a huge-page request; True when it is the largest request or page size so far."""
        new = False
        if len(self.huge_requests) < MAX_HUGE_REQUESTS and (length, page_size) not in (
            self.huge_requests
        ):
            self.huge_requests.add((length, page_size))
            new = True
        if length > self.huge_alloc_bytes:
            self.huge_alloc_bytes = length
            new = True
        if page_size > self.huge_page_size:
            self.huge_page_size = page_size
            new = True
        return new

    def add_session(self, record: ConnActivity) -> None:
        """Keep the latest activity record of one connection (the MAX_SESSIONS longest-lived)."""
        sessions = self.sessions
        if record.fd not in sessions and len(sessions) >= MAX_SESSIONS:
            youngest = min(sessions, key=lambda fd: sessions[fd].age_s)
            if sessions[youngest].age_s >= record.age_s:
                return
            del sessions[youngest]
        sessions[record.fd] = record

    def add_gpu_sample(
        self,
        time: float,
        sm_util: float | None,
        used_memory: int | None,
        mem_util: float | None = None,
        solo: DeviceSample | None = None,
        watched: bool = False,
    ) -> bool:
        """Add one sample (``solo``: its device's sample, when it is that device's only user);
        True when it is time to rescore (first sample, then every GPU_RESCORE_EVERY_S)."""
        if sm_util is not None:
            self.gpu_util.add(time, sm_util)
        if used_memory is not None:
            self.gpu_memory.add(time, float(used_memory))
        if solo is None:
            self.gpu_behaviour.add(time, sm_util, mem_util, used_memory, watched=watched)
        else:
            pcie = (
                solo.pcie_tx_kbs + solo.pcie_rx_kbs
                if solo.pcie_tx_kbs is not None and solo.pcie_rx_kbs is not None
                else None
            )
            self.gpu_behaviour.add(
                time, sm_util, mem_util, used_memory, solo.mem_util, solo.power_w, pcie, watched
            )
        if self.gpu_rescored_at is None or time - self.gpu_rescored_at >= GPU_RESCORE_EVERY_S:
            self.gpu_rescored_at = time
            return True
        return False
