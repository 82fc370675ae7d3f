"""What each signal depends on: how long its value stays valid, and which changes rescore a process.

Kept apart from the signal table (:mod:`gpuguard.detect.signals.named`) so the table
reads as a list of names and meanings.  A new signal that is derived from the
facts (identity, command line, config, ancestry) needs nothing here; one read
from the network or GPU device tables, a count, a rate or the clock must be
listed below (``tests/test_incremental.py`` checks every signal against these).

* **validity**: FACTS values change only with new facts, which clear every
  cache; NETWORK (endpoints, payloads) and DEVICES (GPU device classes,
  paths, ioctl names) values are dropped by ProcessState (DERIVED_FROM_*) when
  those change.  Anything else (GPU and CPU windows, counts, time, YARA, the
  parent's verdict) is recomputed every time.
* **rescoring**: the correlator rescores a process for an addition
  (correlate.state NEW_* bits) or a repeated count only when some rule reads a
  signal that depends on it.  A GPU sample rescores only when one of the
  rules' tests of a GPU-window signal (GPU_SAMPLE_SIGNALS) answers differently,
  looked at every GPU_CHECK_EVERY_S per process; ``age_s`` rescores a process
  when its age crosses a number a rule compares it with (crossing_points);
  the other clock signals rescore everything once per period.
"""

from __future__ import annotations

from gpuguard.correlate.state import (
    ANY_ADDITION,
    DERIVED_FROM_DEVICES,
    DERIVED_FROM_NETWORK,
    NEW_ADDRESS,
    NEW_DEVICE_CLASS,
    NEW_GPU_PATH,
    NEW_IOCTL_CATEGORY,
    NEW_IOCTL_NAME,
    NEW_PAYLOAD,
    NEW_PORT,
)
from gpuguard.detect.signals.table import SIGNALS

FACTS, NETWORK, DEVICES = "facts", "network", "devices"
_KIND_OF_GROUP = {
    "identity": FACTS,
    "cmdline": FACTS,
    "config": FACTS,
    "ancestry": FACTS,
    "network": NETWORK,
}
_DEVICE_SIGNALS = frozenset(
    {
        "gpu_device_classes",
        "gpu_paths",
        "ioctl_names",
        "ioctl_categories",
        "ioctl_query_only",
        "device_classes_written",
    }
)
_UNCACHED = frozenset({"parent_verdict", "parent_score", "connect_count"})


def signal_kind(name: str) -> str | None:
    """What signal ``name`` is derived from: FACTS, NETWORK, DEVICES, or None (recompute every time)."""
    if name in _UNCACHED:
        return None
    if name in _DEVICE_SIGNALS:
        return DEVICES
    return _KIND_OF_GROUP.get(SIGNALS[name].group)


def rule_cache(signals: tuple[str, ...] | frozenset[str]) -> str | None:
    """The ``state.derived`` entry a rule's outcome may be kept in (None: evaluate every time).

    Named after what the outcome depends on besides the facts, e.g. ``rules:network``;
    ProcessState drops it when one of those changes.
    """
    kinds = {signal_kind(name) for name in signals}
    if None in kinds:
        return None
    kinds.discard(FACTS)
    name = "rules:" + ("+".join(sorted(kinds)) if kinds else FACTS)
    assert all(
        name in (DERIVED_FROM_NETWORK if kind == NETWORK else DERIVED_FROM_DEVICES)
        for kind in kinds
    )
    return name


# Where each signal's value is kept on the state (None: nowhere).
SIGNAL_CACHE: dict[str, str | None] = {
    name: None if signal_kind(name) is None else f"signals:{signal_kind(name)}" for name in SIGNALS
}
KEPT_SIGNAL_CACHES = tuple(sorted({c for c in SIGNAL_CACHE.values() if c}))
assert set(KEPT_SIGNAL_CACHES) <= {"signals:facts", *DERIVED_FROM_NETWORK, *DERIVED_FROM_DEVICES}

# The signals that read each kind of addition to a state (correlate.state.NEW_*), and those
# that read repeated counts: the correlator rescores a process for an addition or a count
# only when a rule reads one of them.
SIGNALS_READING: dict[int, frozenset[str]] = {
    NEW_PORT: frozenset({"connect_ports", "connected_to_revealed_port"}),
    NEW_ADDRESS: frozenset({"connect_addresses"}),
    NEW_PAYLOAD: frozenset(
        {
            "payload_protocols",
            "payload_agents",
            "payload_methods",
            "payload_logins",
            "payload_hosts",
            "proxy_target_hosts",
            "proxy_target_ports",
            "revealed_hosts",
        }
    ),
    NEW_DEVICE_CLASS: frozenset({"gpu_device_classes", "device_classes_written"}),
    NEW_GPU_PATH: frozenset({"gpu_paths"}),
    NEW_IOCTL_NAME: frozenset({"ioctl_names"}),
    NEW_IOCTL_CATEGORY: frozenset({"ioctl_categories", "ioctl_query_only"}),
}
RATE_SIGNALS = frozenset(
    {
        "ioctl_rate_submit",
        "ioctl_rate_memory",
        "ioctl_rate_query",
        "ioctl_rate_setup",
        "ioctl_rate_other",
        "ioctl_command_rate",
    }
)
COUNT_SIGNALS = frozenset({"connect_count", "ioctl_total"}) | RATE_SIGNALS
assert sum(SIGNALS_READING) == ANY_ADDITION and set().union(*SIGNALS_READING.values()) <= set(
    SIGNALS
)
assert RATE_SIGNALS <= set(SIGNALS)

# Signals that change with the clock alone, and how often the detection engine re-evaluates
# every process for them when a rule reads them (a rate falls within 10 s of a process going
# quiet).  ``age_s`` is here only for rules that test it with something other than a comparison
# with a number; for comparisons (all shipped rules) the engine rescores a process only when
# its age crosses a number a rule compares it with, checked every AGE_CHECK_EVERY_S.
TIME_SIGNAL_PERIODS_S = {
    "age_s": 60.0,
    "hour_of_day": 3600.0,
    **{name: 10.0 for name in RATE_SIGNALS},
}
AGE_CHECK_EVERY_S = 10.0
_COMPARISONS = frozenset({"gt", "gte", "lt", "lte"})

# Signals whose value a GPU sample can change: the GPU windows and behaviour figures.  A GPU
# sample does not rescore a process by itself; the engine re-evaluates the rules' tests of these
# signals (at most every GPU_CHECK_EVERY_S of sample time per process) and rescores the process
# only when one of those tests changed its answer.  ``tests/test_rescore_gpu.py`` checks that a GPU
# sample changes no other signal.
GPU_SAMPLE_SIGNALS = frozenset(
    {
        "gpu_util_mean",
        "gpu_util_variance",
        "gpu_util_min",
        "gpu_util_latest",
        "gpu_util_samples",
        "gpu_util_window_s",
        "gpu_memory_bytes",
        "gpu_memory_fraction",
        *(name for name, signal in SIGNALS.items() if signal.group == "gpu-behaviour"),
    }
)
GPU_CHECK_EVERY_S = 5.0
assert GPU_SAMPLE_SIGNALS <= set(SIGNALS)


def crossing_points(leaves, signal: str) -> tuple[tuple[float, bool], ...] | None:
    """Where the tests in ``leaves`` (detect.conditions.Leaf) of a signal that only grows, such as
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
