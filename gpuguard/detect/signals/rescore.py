"""What each signal depends on, derived from the inputs it declares: caching and rescoring.

Each signal declares what it reads (``Signal.reads``, :mod:`gpuguard.detect.signals.definition`);
:data:`INPUTS` says, once per ProcessState field, how long a value read from it stays valid
and which change to it rescores a process.  Nothing here names a signal.

* **validity**: FACTS values change only with new facts, which make every kept value stale;
  NETWORK and DEVICES values are stale once the state's ``network_gen`` / ``devices_gen``
  moved (detect's memo, :mod:`gpuguard.detect.signals.memo`); a signal reading anything else
  is recomputed every time.
* **rescoring**: the correlator rescores a process for an addition (correlate.state NEW_*) or
  a repeated count only when some rule reads a signal reading it.  A GPU sample rescores only
  when a rule's test of a GPU-window signal answers differently (every GPU_CHECK_EVERY_S);
  ``age_s`` when a process's age crosses a number a rule compares it with (crossing_points);
  other clock signals rescore everything once per their declared period.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpuguard.correlate.state import (
    ANY_ADDITION,
    NEW_ADDRESS,
    NEW_DEVICE_CLASS,
    NEW_GPU_PATH,
    NEW_IOCTL_CATEGORY,
    NEW_IOCTL_NAME,
    NEW_PAYLOAD,
    NEW_PORT,
)
from gpuguard.detect.signals.memo import STAMPS
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.process_facts import ProcessFacts

FACTS, NETWORK, DEVICES = "facts", "network", "devices"


@dataclass(frozen=True, slots=True)
class Input:
    """What a signal may read, and what reading it implies for caching and rescoring."""

    kept: str | None  # FACTS/NETWORK/DEVICES: how long a value read from it is valid; None: not
    addition: int = 0  # the correlate.state NEW_* bit of an addition to it
    count: bool = False  # a repeated observation changes it (rescore on every one)
    gpu_sample: bool = False  # a GPU sample changes it


_PAYLOAD = Input(NETWORK, NEW_PAYLOAD)
_VOLATILE = Input(None)
INPUTS: dict[str, Input] = {
    # identity and facts: fixed until new facts (exec), which drop every cache; a signal names
    # the fields of the facts it reads ("facts.<field>": the facts are there and the field is)
    **dict.fromkeys(("key", "facts", "comm", "exe", "cmdline"), Input(FACTS)),
    **{f"facts.{f.name}": Input(FACTS) for f in fields(ProcessFacts)},
    # connections and payloads
    "network.ports": Input(NETWORK, NEW_PORT),
    "network.addresses": Input(NETWORK, NEW_ADDRESS),
    **dict.fromkeys(
        (
            "payloads",
            "payload_protocols",
            "network.agents",
            "network.methods",
            "network.logins",
            "network.payload_hosts",
            "network.proxy_hosts",
            "network.proxy_ports",
        ),
        _PAYLOAD,
    ),
    "connect_total": Input(None, count=True),
    # GPU devices and ioctls
    "gpu_device_classes": Input(DEVICES, NEW_DEVICE_CLASS),
    "device_classes_written": Input(DEVICES, NEW_DEVICE_CLASS),
    "gpu_paths": Input(DEVICES, NEW_GPU_PATH),
    "ioctl_counts": Input(DEVICES, NEW_IOCTL_NAME),
    "ioctl_categories": Input(DEVICES, NEW_IOCTL_CATEGORY),
    **dict.fromkeys(("ioctl_total", "ioctl_rates", "ioctl_command_rates"), Input(None, count=True)),
    # GPU samples
    **dict.fromkeys(
        (
            "gpu_util",
            "gpu_memory",
            "gpu_memory_total",
            "gpu_behaviour",
            "gpu_lifetime",
            "gpu_device_shared",
        ),
        Input(None, gpu_sample=True),
    ),
    # everything else moves without an addition: recomputed every time
    **dict.fromkeys(
        (
            "now",
            "exited_at",
            "cpu",
            "cpu_activity",
            "huge_alloc_bytes",
            "huge_page_size",
            "huge_requests",
            "yara_matches",
            "yara_tags",
            "sessions",
            "parent_verdict",
        ),
        _VOLATILE,
    ),
}
for _signal in SIGNALS.values():
    assert _signal.reads <= INPUTS.keys(), f"{_signal.name} reads {_signal.reads - INPUTS.keys()}"


def _reads(name: str) -> list[Input]:
    return [INPUTS[i] for i in SIGNALS[name].reads]


def signal_kind(name: str) -> str | None:
    """What signal ``name`` is derived from: FACTS, NETWORK, DEVICES, or None (recompute every time)."""
    kinds = {i.kept for i in _reads(name)}
    if None in kinds:
        return None
    kinds.discard(FACTS)
    assert len(kinds) <= 1, f"{name}: a value kept in one cache reads one kind of change"
    return kinds.pop() if kinds else FACTS


def rule_cache(signals: tuple[str, ...] | frozenset[str]) -> str | None:
    """The memo entry a rule's outcome may be kept in (None: evaluate every time).

    Named after what the outcome depends on besides the facts, e.g. ``rules:network``;
    it is stale once one of those changes.
    """
    kinds = {signal_kind(name) for name in signals}
    if None in kinds:
        return None
    kinds.discard(FACTS)
    name = "rules:" + ("+".join(sorted(kinds)) if kinds else FACTS)
    assert name in STAMPS, f"{name}: not an entry of detect's memo (signals.memo.STAMPS)"
    return name


# Where each signal's value is kept in the memo (None: nowhere).
SIGNAL_CACHE: dict[str, str | None] = {
    name: None if signal_kind(name) is None else f"signals:{signal_kind(name)}" for name in SIGNALS
}
KEPT_SIGNAL_CACHES = tuple(sorted({c for c in SIGNAL_CACHE.values() if c}))
assert set(KEPT_SIGNAL_CACHES) <= STAMPS.keys()

# The signals that read each kind of addition to a state (correlate.state.NEW_*), and those
# that read repeated counts: the correlator rescores a process for an addition or a count
# only when a rule reads one of them.
SIGNALS_READING: dict[int, frozenset[str]] = {
    bit: frozenset(name for name in SIGNALS if any(i.addition & bit for i in _reads(name)))
    for bit in (
        NEW_PORT,
        NEW_ADDRESS,
        NEW_PAYLOAD,
        NEW_DEVICE_CLASS,
        NEW_GPU_PATH,
        NEW_IOCTL_NAME,
        NEW_IOCTL_CATEGORY,
    )
}
COUNT_SIGNALS = frozenset(name for name in SIGNALS if any(i.count for i in _reads(name)))
# Counts over a recent window (they also fall with the clock): their windows are kept only
# when a rule reads one.
RATE_SIGNALS = frozenset(name for name in COUNT_SIGNALS if "now" in SIGNALS[name].reads)
assert sum(SIGNALS_READING) == ANY_ADDITION

# Signals that change with the clock alone, and how often the detection engine re-evaluates
# every process for them when a rule reads them (their declared period).  ``age_s`` is here
# only for rules that test it with something other than a comparison with a number; for
# comparisons (all shipped rules) the engine rescores a process only when its age crosses a
# number a rule compares it with, checked every AGE_CHECK_EVERY_S.
TIME_SIGNAL_PERIODS_S = {
    name: signal.period_s for name, signal in SIGNALS.items() if signal.period_s is not None
}
AGE_CHECK_EVERY_S = 10.0
_COMPARISONS = frozenset({"gt", "gte", "lt", "lte"})

# Signals whose value a GPU sample can change: the GPU windows and behaviour figures.  A GPU
# sample does not rescore a process by itself; the engine re-evaluates the rules' tests of these
# signals (at most every GPU_CHECK_EVERY_S of sample time per process) and rescores the process
# only when one of those tests changed its answer.  ``tests/test_rescore.py`` checks that a GPU
# sample changes no other signal.
GPU_SAMPLE_SIGNALS = frozenset(name for name in SIGNALS if any(i.gpu_sample for i in _reads(name)))
GPU_CHECK_EVERY_S = 5.0


def crossing_points(leaves, signal: str) -> tuple[tuple[float, bool], ...] | None:
    """Where the tests in ``leaves`` (detect.ruleset.conditions.Leaf) of a signal that only grows, such as
    ``age_s``, can change their answer: ``(value, at)`` sorted, ``at`` True when the answer changes
    as the signal reaches the value (gte, lt) and False when it changes just after (gt, lte);
    () when no test reads ``signal``, None when one is not a comparison with a number."""
    points = set()
    for leaf in leaves:
        if leaf.signal != signal:
            continue
        if leaf.op not in _COMPARISONS:
            return None
        points.add((float(leaf.operand), leaf.op in ("gte", "lt")))
    return tuple(sorted(points))


def additions_read(signals: frozenset[str] | set[str]) -> int:
    """The NEW_* bits of the additions that some of ``signals`` read."""
    bits = 0
    for bit, readers in SIGNALS_READING.items():
        if readers & signals:
            bits |= bit
    return bits
