"""The correlator: routes every event, snapshot and facts record to one process's state.

It works the same from the live sensor, a recording and a /proc walk (``gpuguard scan``).
Live, a ``facts_provider`` fills in who a process is on first sight (the caller passes the
/proc readers: the correlator itself reads nothing).  State is bounded
(``max_processes``) and expires; every change marks the process ``dirty`` as the detection
engine's :class:`RescorePolicy` says.  It knows nothing of rules, verdicts or YARA (new facts
go to the ``on_new_facts`` hook).  How long a process is kept, and why: docs/rules.md,
"How long a process is kept".
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuguard.correlate.gpu_behaviour import MONITOR_NAMES
from gpuguard.correlate.state import ANY_ADDITION, ProcessKey, ProcessState
from gpuguard.events.gpu_accounting import GpuAccounting
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.ioctl_names import ioctl_category, ioctl_name
from gpuguard.events.model import (
    ConnActivity,
    Connect,
    CpuActivity,
    Event,
    Exec,
    Exit,
    GpuIoctl,
    GpuOpen,
    HugeAlloc,
    Lost,
    NetPayload,
)
from gpuguard.events.process_facts import ProcessFacts

FactsProvider = Callable[[int], "ProcessFacts | None"]
ConfigReader = Callable[[ProcessFacts], object]  # fills ``facts.config_files`` in place
NewFactsHook = Callable[[ProcessState, ProcessFacts], None]
_SAME_PROCESS_SLACK_S = 1.0  # start times are rounded; an event's time is after the start
_EXIT_SWEEP_EVERY_S = 1.0  # look for clean exited processes to forget this often (event time)


@dataclass(frozen=True, slots=True)
class RescorePolicy:
    """Which changes mark a process for rescoring (the detect layer derives it from its rules).

    The default, with no rules known, treats every change as one that matters.
    """

    additions: int = ANY_ADDITION  # correlate.state NEW_* bits some rule reads
    counts: bool = True  # a repeated connect or ioctl count matters (some rule reads a count)
    rates: bool = True  # keep ioctl rate windows (some rule reads a rate)
    # False: a GPU sample marks its process for rescoring (at most every GPU_RESCORE_EVERY_S).
    # True: it only adds the process to ``Correlator.gpu_moved``; the detection engine
    # re-evaluates what its rules test of the GPU windows and rescores when an answer changed.
    gpu_checked: bool = False


@dataclass(slots=True)
class Scoring:
    """One scoring pass's result, as the detection engine returns it: nothing in it has been
    written into the states yet; :meth:`Correlator.apply_scoring` keeps it (the correlator owns
    its states)."""

    verdicts: list = field(default_factory=list)  # new verdicts, oldest process first
    scored: dict = field(default_factory=dict)  # state -> (newest verdict, parent verdict read)
    marked: set = field(default_factory=set)  # every state the pass looked at as dirty
    still_dirty: set = field(default_factory=set)  # of those, what waits for the next pass
    gpu_looked: set = field(default_factory=set)  # states whose GPU windows were looked at


class Correlator:
    """Per-process state from a stream of items; see the module docstring."""

    def __init__(
        self,
        policy: RescorePolicy | None = None,
        *,
        max_processes: int = 8192,
        idle_expiry_s: float = 900.0,
        exit_grace_s: float = 30.0,
        clean_exit_grace_s: float = 2.0,
        facts_provider: FactsProvider | None = None,
        config_reader: ConfigReader | None = None,
        on_new_facts: NewFactsHook | None = None,
        proc_root: str = "/proc",
        identify: Callable[[int, int | None], int | None] | None = None,
    ) -> None:
        self.max_processes = max_processes
        self.idle_expiry_s = idle_expiry_s
        self.exit_grace_s = exit_grace_s
        self.clean_exit_grace_s = clean_exit_grace_s
        # the /proc readers (gpuguard.sources.proc): who a pid is, and its config files; None
        # reads nothing (a recording or a scan hands the facts in, config files included)
        self.facts_provider = facts_provider
        self.config_reader = config_reader
        self.on_new_facts = (
            on_new_facts  # enrichment (YARA, exe hash) on first sight and after exec
        )
        self.proc_root = proc_root  # where the readers read (the engine's YARA and hashes too)
        # identity at first sight: a pidfd for a process seen at its exec (the wiring supplies it)
        self.identify = identify
        self._states: dict[ProcessKey, ProcessState] = {}
        self._by_pid: dict[int, ProcessState] = {}  # the live process with each pid
        self._device_totals: dict[tuple[str, int], int] = {}
        self._monitors: set[int] = set()  # live pids of GPU/process monitors (nvidia-smi, top...)
        self._ioctl_cache: dict[tuple[str, int, str], tuple[str, str]] = {}
        self._recent_exits: deque[ProcessState] = (
            deque()
        )  # in exit order, until the short grace is over
        self.gpu_moved: set[ProcessState] = (
            set()
        )  # GPU windows changed since the engine last looked (gpu_checked)
        self.dirty: set[ProcessState] = set()  # tracked states marked dirty (ProcessState.dirty)
        self._exit_sweep_due = 0.0
        self.clock = 0.0  # newest item time seen: when facts (which carry no time) were observed
        self.counters: dict[str, int] = {
            "events": 0,
            "facts": 0,
            "snapshots": 0,
            "processes_created": 0,
            "evicted": 0,
            "expired": 0,
            "lost_events": 0,
            "ignored": 0,
        }
        self.set_policy(policy or RescorePolicy())
        self._handlers: dict[type, Callable] = {
            GpuOpen: self._on_gpu_open,
            GpuIoctl: self._on_gpu_ioctl,
            Connect: self._on_connect,
            NetPayload: self._on_payload,
            Exec: self._on_exec,
            Exit: self._on_exit,
            Lost: self._on_lost,
            GpuSnapshot: self._on_snapshot,
            ProcessFacts: self._on_facts,
            GpuAccounting: self._on_accounting,
            ConnActivity: self._on_conn_activity,
            HugeAlloc: self._on_huge_alloc,
            CpuActivity: self._on_cpu_activity,
        }

    # -- public API ---------------------------------------------------------

    def feed(self, item: Event | GpuSnapshot | ProcessFacts) -> None:
        """Apply one item to the state of the process it belongs to."""
        handler = self._handlers.get(type(item))
        if handler is None:
            self.counters["ignored"] += 1
            return
        handler(item)
        time = getattr(item, "time", None)
        if time is not None and time > self.clock:
            self.clock = time

    def states(self) -> Iterable[ProcessState]:
        """Every tracked process, oldest first (a stable order for the same input)."""
        return sorted(self._states.values(), key=lambda s: (s.key.start_time, s.key.pid))

    def unordered_states(self) -> Iterable[ProcessState]:
        """Every tracked process, in no particular order (a live view: cheap, do not add while iterating)."""
        return self._states.values()

    def state_of(self, pid: int) -> ProcessState | None:
        """The current (newest) process with this pid, if tracked."""
        return self._by_pid.get(pid)

    def get(self, key: ProcessKey) -> ProcessState | None:
        return self._states.get(key)

    def __len__(self) -> int:
        return len(self._states)

    def cpu_candidates(self) -> list[ProcessKey]:
        """Live processes a CPU-miner rule may need a CPU window for: huge-page users (sensor or
        /proc) and processes that opened host-tuning files for writing (the agent samples these)."""
        return [
            s.key
            for s in self._states.values()
            if not s.exited
            and (
                s.huge_alloc_bytes
                or s.device_classes_written
                or (s.facts is not None and s.facts.hugetlb_bytes)
            )
        ]

    def add_cpu_sample(self, key: ProcessKey, time: float, percent: float) -> None:
        """A CPU % measured for a tracked process (``cpu_candidates``); marks it for rescoring."""
        state = self._states.get(key)
        if state is not None:
            state.cpu.add(time, percent)
            state.dirty = True

    def set_policy(self, policy: RescorePolicy) -> None:
        """Use a new rescore policy (new rules): every living process is marked for rescoring.

        An ended process judged since its end is not: a reload re-judges the living, never the
        dead (one that ended unjudged is still marked from its exit)."""
        self.policy = policy
        self._rescore_on, self._track_rates, self._counts_matter = (
            policy.additions,
            policy.rates,
            policy.counts,
        )
        self._gpu_checked = policy.gpu_checked
        self.gpu_moved.clear()
        for state in self._states.values():
            if not state.exited:
                state.dirty = True

    def expire(self, now: float) -> None:
        """Forget processes that exited more than ``exit_grace_s`` ago (``clean_exit_grace_s``
        for one that left nothing to keep: see the module docstring) or were idle too long."""
        parents = self._parent_keys()
        for key in [k for k, s in self._states.items() if self._expired(s, now, parents)]:
            self._drop(key)
            self.counters["expired"] += 1

    def parent_of(self, state: ProcessState) -> ProcessState | None:
        """The tracked parent of ``state`` (linked by pid and start order; see :meth:`link_parent`)."""
        self.link_parent(state)
        return self._states.get(state.parent_key) if state.parent_key else None

    # -- process lookup -----------------------------------------------------

    def _parent_keys(self) -> set[ProcessKey]:
        return {s.parent_key for s in self._states.values() if s.parent_key is not None}

    def _forget_clean_exits(self, now: float) -> None:
        """Forget the processes that exited over ``clean_exit_grace_s`` ago and left nothing to keep;
        the others wait for :meth:`expire` and the full grace."""
        exits, grace = self._recent_exits, self.clean_exit_grace_s
        if not exits or now - (exits[0].exited_at or now) <= grace:
            return
        parents = self._parent_keys()
        while exits and now - (exits[0].exited_at or now) > grace:
            state = exits.popleft()
            if (
                self._states.get(state.key) is state
                and state.key not in parents
                and state.nothing_to_keep()
            ):
                self._drop(state.key)
                self.counters["expired"] += 1

    def apply_scoring(self, scoring: Scoring) -> None:
        """Keep what a scoring pass found: each state's verdict (and the parent verdict it read),
        its dirty mark, the GPU answers the engine looked at."""
        for state, (verdict, parent_verdict) in scoring.scored.items():
            state.verdict = verdict
            state.parent_verdict = parent_verdict
        still_dirty = scoring.still_dirty
        for state in scoring.marked:
            state.dirty = state in still_dirty
        if scoring.gpu_looked:
            self.gpu_moved.difference_update(scoring.gpu_looked)

    def _expired(self, state: ProcessState, now: float, parents: set[ProcessKey]) -> bool:
        exited_at = state.exited_at
        if exited_at is not None:
            if now - exited_at > self.exit_grace_s:
                return True
            if (
                now - exited_at > self.clean_exit_grace_s
                and state.key not in parents
                and state.nothing_to_keep()
            ):
                return True
        return now - state.last_seen > self.idle_expiry_s

    def _drop(self, key: ProcessKey) -> None:
        state = self._states.pop(key, None)
        if state is not None:
            self.gpu_moved.discard(state)
            self.dirty.discard(state)
            state.dirty_set = None
            _close_pidfd(state)
        if state is not None and self._by_pid.get(key.pid) is state:
            del self._by_pid[key.pid]
            self._monitors.discard(key.pid)

    def _note_monitor(self, state: ProcessState) -> None:
        """Keep the set of live monitors: a miner that pauses while one runs is hiding."""
        if state.comm in MONITOR_NAMES and state.exited_at is None:
            self._monitors.add(state.pid)
        else:
            self._monitors.discard(state.pid)

    def _new_state(self, key: ProcessKey, time: float, provisional: bool) -> ProcessState:
        old_state = self._by_pid.get(key.pid)
        if old_state is not None and old_state.key != key and old_state.exited_at is None:
            # The pid was reused without us seeing the exit: the old process is gone.
            old_state.exited_at = time
        state = ProcessState(key=key, provisional=provisional, first_seen=time, last_seen=time)
        state.dirty_set = self.dirty
        self.dirty.add(state)  # new: dirty
        self._states[key] = state
        self._by_pid[key.pid] = state
        self.counters["processes_created"] += 1
        if len(self._states) > self.max_processes:
            self._evict(keep=key)
        return state

    def _evict(self, keep: ProcessKey) -> None:
        excess = len(self._states) - self.max_processes
        batch = max(excess, self.max_processes // 10, 1)
        # Exited processes go first, then the least recently active; never the one just added.
        ranked = sorted(
            (s for s in self._states.values() if s.key != keep),
            key=lambda s: (s.exited_at is None, s.last_seen, s.key),
        )
        for victim in ranked[:batch]:
            self._drop(victim.key)
            self.counters["evicted"] += 1

    def _state_for(self, pid: int, time: float, comm: str = "") -> ProcessState:
        """The process ``pid`` now; created (live: with facts) on first sight."""
        state = self._by_pid.get(pid)
        if state is not None:
            return state
        facts = self.facts_provider(pid) if self.facts_provider else None
        if facts is not None and facts.start_time > 0:
            state = self._new_state(ProcessKey(pid, facts.start_time), time, provisional=False)
            self._adopt_facts(state, facts)
        else:
            state = self._new_state(ProcessKey(pid, time), time, provisional=True)
            state.comm = comm
        return state

    def link_parent(self, state: ProcessState) -> None:
        """Set ``state.parent_key`` to its parent's, if the parent is tracked and started first."""
        if state.parent_key is not None and state.parent_key in self._states:
            return
        state.parent_key = None
        if state.ppid:
            parent = self._by_pid.get(state.ppid)
            if (
                parent is not None
                and parent.key.start_time <= state.key.start_time + _SAME_PROCESS_SLACK_S
            ):
                state.parent_key = parent.key

    def _adopt_facts(self, state: ProcessState, facts: ProcessFacts) -> None:
        if self.config_reader is not None:
            self.config_reader(facts)
        state.set_facts(facts)
        self._note_monitor(state)
        if self.on_new_facts is not None:
            self.on_new_facts(state, facts)

    # -- handlers -----------------------------------------------------------

    def _on_facts(self, facts: ProcessFacts) -> None:
        self.counters["facts"] += 1
        key = ProcessKey(facts.pid, facts.start_time)
        state = self._states.get(key)
        if state is None:
            current_state = self._by_pid.get(facts.pid)
            if (
                current_state is not None
                and current_state.provisional
                and facts.start_time <= current_state.first_seen + _SAME_PROCESS_SLACK_S
            ):
                # Events arrived before the facts: the same process; re-key it.
                del self._states[current_state.key]
                current_state.key = key
                self._states[key] = current_state
                state = current_state
            else:
                state = self._new_state(key, max(self.clock, facts.start_time), provisional=False)
        self._adopt_facts(state, facts)

    def _on_gpu_open(self, event: GpuOpen) -> None:
        self.counters["events"] += 1
        state = self._state_for(event.pid, event.time, event.comm)
        written = event.flags & os.O_ACCMODE != os.O_RDONLY
        state.touch(
            event.time,
            bool(state.add_gpu_device(event.device_class, event.path, written) & self._rescore_on),
        )

    def _on_gpu_ioctl(self, event: GpuIoctl) -> None:
        # The hottest handler (most events are ioctl counts): lookups inlined.
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid) or self._state_for(event.pid, event.time, event.comm)
        device_class = event.device_class
        cache_key = (device_class, event.command, event.command_name)
        decoded = self._ioctl_cache.get(cache_key)
        if decoded is None:
            name = event.command_name or ioctl_name(device_class, event.command)
            decoded = self._ioctl_cache[cache_key] = (name, ioctl_category(name))
        new = state.add_ioctl(event.time, decoded[0], decoded[1], event.count, self._track_rates)
        if device_class and device_class not in state.gpu_device_classes:
            new |= state.add_gpu_device(device_class)
        if event.time > state.last_seen:
            state.last_seen = event.time
        if new & self._rescore_on or self._counts_matter:
            state.dirty = True

    def _on_connect(self, event: Connect) -> None:
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid) or self._state_for(event.pid, event.time, event.comm)
        new = state.add_connection(event.address, event.port)
        state.touch(event.time, bool(new & self._rescore_on) or self._counts_matter)

    def _on_payload(self, event: NetPayload) -> None:
        self.counters["events"] += 1
        state = self._state_for(event.pid, event.time, event.comm)
        state.touch(
            event.time,
            bool(state.add_payload(event.time, event.protocol, event.detail) & self._rescore_on),
        )

    def _on_exec(self, event: Exec) -> None:
        self.counters["events"] += 1
        old = self._by_pid.get(event.pid)
        if (
            old is not None
            and None not in (old.exit_gen, event.exit_gen)
            and old.exit_gen != event.exit_gen
        ):
            old.exited_at = event.time  # its exit was not seen: this exec is another process
            del self._by_pid[event.pid]
            self._monitors.discard(event.pid)
            _close_pidfd(old)
        first_sight = event.pid not in self._by_pid
        state = self._state_for(event.pid, event.time, event.comm)
        if first_sight and state.facts is not None:
            # First seen at its exec: _state_for has just read the new image's facts (one /proc
            # read, one enrichment); the event fills in only what /proc could not tell.
            state.comm = state.comm or event.comm
            state.exe = state.exe or event.filename
            if not state.cmdline and event.cmdline:
                state.cmdline = list(event.cmdline)
            state.ppid = state.ppid or event.ppid
            self._identify(state, event.exit_gen)
            state.touch(event.time)
            return
        state.comm = event.comm or state.comm
        state.exe = event.filename or state.exe
        if event.exit_gen is not None:
            self._identify(state, event.exit_gen)
        if event.cmdline:
            state.cmdline = list(event.cmdline)
        if event.ppid:
            state.ppid = event.ppid
            state.parent_key = None
        state.facts_gen += 1  # a new image: everything derived from the old one is stale
        self._note_monitor(state)
        if self.facts_provider is not None and state.facts is not None:
            facts = self.facts_provider(event.pid)  # the new image: new exe, cmdline, identity
            if facts is not None and facts.start_time == state.key.start_time:
                state.yara_scanned = False
                self._adopt_facts(state, facts)
        state.touch(event.time)

    def _identify(self, state: ProcessState, exit_gen: int | None) -> None:
        state.exit_gen = exit_gen
        if self.identify is not None and state.pidfd is None:
            state.pidfd = self.identify(state.pid, exit_gen)

    def _on_exit(self, event: Exit) -> None:
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid)
        if state is None:
            return
        _close_pidfd(state)  # gone: nothing can be done to it any more
        state.exited_at = event.time
        state.exit_code = event.exit_code
        state.touch(event.time)
        del self._by_pid[event.pid]  # a later event with this pid is a new process
        self._monitors.discard(event.pid)
        self._recent_exits.append(state)
        if event.time >= self._exit_sweep_due:
            self._exit_sweep_due = event.time + _EXIT_SWEEP_EVERY_S
            self._forget_clean_exits(event.time)

    def _on_lost(self, event: Lost) -> None:
        self.counters["events"] += 1
        self.counters["lost_events"] += event.count
        state = self._by_pid.get(event.pid)
        if state is not None:
            state.lost_events += event.count

    def _on_conn_activity(self, event: ConnActivity) -> None:
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid) or self._state_for(event.pid, event.time, event.comm)
        state.add_session(event)
        state.touch(event.time, True)  # reported every 10 s at most, per changed connection

    def _on_huge_alloc(self, event: HugeAlloc) -> None:
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid) or self._state_for(event.pid, event.time, event.comm)
        state.touch(event.time, state.add_huge_alloc(event.length, event.page_size))

    def _on_cpu_activity(self, event: CpuActivity) -> None:
        self.counters["events"] += 1
        state = self._by_pid.get(event.pid) or self._state_for(event.pid, event.time, event.comm)
        state.cpu_activity = event
        state.touch(event.time, True)  # one per sampled process per housekeeping period

    def _on_accounting(self, record: GpuAccounting) -> None:
        """A driver's lifetime record of a pid: kept on the live process it belongs to, if any."""
        state = self._by_pid.get(record.pid)
        if state is None or not record.running:
            return  # exited users are the scan's host findings, not a process verdict
        if (
            record.start_time is not None
            and record.start_time < state.key.start_time - _SAME_PROCESS_SLACK_S
        ):
            return  # an earlier process that had this pid
        state.gpu_lifetime = record
        state.touch(self.clock, True)

    def _on_snapshot(self, snapshot: GpuSnapshot) -> None:
        self.counters["snapshots"] += 1
        devices = {}
        for device in snapshot.devices:
            devices[(device.vendor, device.index)] = device
            if device.memory_total:
                self._device_totals[(device.vendor, device.index)] = device.memory_total
        per_pid: dict[int, list] = {}
        users: dict[tuple[str, int], set[int]] = {}  # device -> pids using it
        for usage in snapshot.processes:
            per_pid.setdefault(usage.pid, []).append(usage)
            device_key = (usage.vendor, usage.device_index)
            users.setdefault(device_key, set()).add(usage.pid)
        totals = self._device_totals
        time = snapshot.time
        watched = bool(self._monitors)
        checked, moved = self._gpu_checked, self.gpu_moved
        for pid, usages in per_pid.items():
            state = self._by_pid.get(pid) or self._state_for(pid, time)
            solo = None
            if len(usages) == 1:  # the usual case: one GPU per process
                usage = usages[0]
                util, memory, mem_util = usage.sm_util, usage.used_memory, usage.mem_util
                device_key = (usage.vendor, usage.device_index)
                total = totals.get(device_key)
                shared = len(users[device_key]) > 1
                if not shared:  # the device's figures are this process's own
                    solo = devices.get(device_key)
            else:
                utils = [u.sm_util for u in usages if u.sm_util is not None]
                memories = [u.used_memory for u in usages if u.used_memory is not None]
                mem_utils = [u.mem_util for u in usages if u.mem_util is not None]
                util = max(utils) if utils else None
                memory = sum(memories) if memories else None
                mem_util = max(mem_utils) if mem_utils else None
                device_keys = {(u.vendor, u.device_index) for u in usages}
                device_totals = [totals.get(d) for d in device_keys]
                total = sum(device_totals) if all(device_totals) else None  # type: ignore[arg-type]
                shared = any(len(users[d]) > 1 for d in device_keys)
            changed = state.add_gpu_sample(time, util, memory, mem_util, solo, watched)
            if total and total != state.gpu_memory_total:
                state.gpu_memory_total = total
                changed = True
            if shared != state.gpu_device_shared:
                state.gpu_device_shared = shared
            if checked:
                moved.add(state)
                changed = False  # the engine's GPU check decides (see RescorePolicy.gpu_checked)
            state.touch(time, changed)


def _close_pidfd(state: ProcessState) -> None:
    if state.pidfd is not None:
        try:
            os.close(state.pidfd)
        except OSError:
            pass
        state.pidfd = None
