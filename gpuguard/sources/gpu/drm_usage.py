"""DRM client usage stats (drm-usage-stats.rst): parsing one fdinfo, and utilisation maths.

The kernel prints, for each open DRM file: ``drm-driver``, ``drm-client-id``,
``drm-pdev``, busy time per engine (``drm-engine-<e>: <n> ns``, with
``drm-engine-capacity-<e>`` engines of that class), or busy cycles
(``drm-cycles-<e>`` with ``drm-total-cycles-<e>`` as on xe, or with
``drm-maxfreq-<e>``), and memory per region (``drm-total-``, ``drm-shared-``,
``drm-resident-``, ``drm-purgeable-``, ``drm-active-<region>``, and amdgpu's
older ``drm-memory-<region>``) in bytes, KiB or MiB.  Utilisation is the change
between two samples.  Finding the fds is discovery (``drm_fdinfo``,
``gpuguard.sources.proc.gpu_fds``); nothing here touches /proc.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.sources.proc.gpu_fds import parse_fdinfo_fields

_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_FREQ_UNITS = {"": 1, "Hz": 1, "KHz": 1000, "kHz": 1000, "MHz": 1_000_000}
_MEMORY_KINDS = ("total", "shared", "resident", "purgeable", "active", "memory")
# Which memory figure stands for "what this client holds" in a region, best first.
_HELD = ("resident", "memory", "total")


@dataclass(slots=True)
class DrmClient:
    """One ``struct drm_file`` as one fdinfo file describes it."""

    driver: str
    client_id: str | None = None
    pdev: str | None = None
    name: str | None = None
    engine_ns: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, int] = field(default_factory=dict)
    total_cycles: dict[str, int] = field(default_factory=dict)
    maxfreq_hz: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> region -> bytes

    def held_memory(self) -> dict[str, int]:
        """Bytes per region: resident where given, else amdgpu's drm-memory, else total."""
        regions: dict[str, int] = {}
        for kind in reversed(_HELD):
            regions.update(self.memory.get(kind, {}))
        return regions

    @property
    def has_data(self) -> bool:
        return bool(self.engine_ns or self.cycles or self.memory)


def _number(value: str, units: dict[str, int]) -> int | None:
    if value.isdigit():  # the common case: plain bytes or a counter
        return int(value)
    parts = value.split()
    if not parts or not parts[0].isdigit():
        return None
    unit = parts[1] if len(parts) > 1 else ""
    scale = units.get(unit)
    return int(parts[0]) * scale if scale is not None else None


def parse_fdinfo(text: str) -> DrmClient | None:
    """The DRM usage stats in one fdinfo file, or None if it has none (no ``drm-driver``)."""
    return client_from_fields(parse_fdinfo_fields(text).drm)


def client_from_fields(drm: dict[str, str]) -> DrmClient | None:
    """A :class:`DrmClient` from the ``drm-*`` keys of one fdinfo file (pos/flags and driver-private keys aside)."""
    driver = drm.get("drm-driver")
    if driver is None:
        return None
    client = DrmClient(driver=driver)
    for key, value in drm.items():
        kind, _, rest = key[4:].partition("-")
        if kind != "driver":
            _apply(client, kind, rest, value)
    return client


def _apply(client: DrmClient, kind: str, rest: str, value: str) -> None:
    """One ``drm-<kind>-<rest>: value`` line (``drm-client-id`` is kind "client", rest "id")."""
    if kind == "engine":
        if rest.startswith("capacity-"):
            n = _number(value, _SIZE_UNITS)
            if n:  # zero capacity is not allowed; absent means one
                client.capacity[rest[9:]] = n
        else:
            n = _number(value[:-2] if value.endswith("ns") else value, _SIZE_UNITS)
            if n is not None:
                client.engine_ns[rest] = n
    elif kind == "cycles":
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.cycles[rest] = n
    elif kind == "total" and rest.startswith("cycles-"):  # drm-total-cycles-<engine>, not a region
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.total_cycles[rest[7:]] = n
    elif kind in _MEMORY_KINDS and rest:
        n = _number(value, _SIZE_UNITS)
        if n is not None:
            client.memory.setdefault(kind, {})[rest] = n
    elif kind == "client":
        if rest == "id":
            client.client_id = value
        elif rest == "name":
            client.name = value
    elif kind == "pdev" and not rest:
        client.pdev = value
    elif kind == "maxfreq":
        n = _number(value, _FREQ_UNITS)
        if n:
            client.maxfreq_hz[rest] = n


@dataclass(slots=True)
class UsageBaseline:
    """A client's counters at the previous sample (the larger value wins, per the spec)."""

    mono: float
    engine_ns: dict[str, int]
    cycles: dict[str, int]
    total_cycles: dict[str, int]


def _advance(old: dict[str, int], new: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Deltas, and the new baseline: a counter seen going backwards keeps its larger old value."""
    deltas, baseline = {}, {}
    for name, value in new.items():
        before = old.get(name)
        if before is None:
            baseline[name] = value
        elif value >= before:
            deltas[name], baseline[name] = value - before, value
        else:
            deltas[name], baseline[name] = 0, before
    return deltas, baseline


def engine_utilization(
    client: DrmClient, previous: UsageBaseline | None, mono: float
) -> tuple[dict[str, float], UsageBaseline]:
    """Percent busy per engine since ``previous``, and the baseline for next time."""
    old = previous or UsageBaseline(mono, {}, {}, {})
    ns_delta, ns_base = _advance(old.engine_ns, client.engine_ns)
    cyc_delta, cyc_base = _advance(old.cycles, client.cycles)
    tot_delta, tot_base = _advance(old.total_cycles, client.total_cycles)
    baseline = UsageBaseline(mono, ns_base, cyc_base, tot_base)
    util: dict[str, float] = {}
    if previous is None:
        return util, baseline
    elapsed = mono - previous.mono
    for engine in set(ns_delta) | set(cyc_delta):
        capacity = client.capacity.get(engine, 1)
        if engine in ns_delta and elapsed > 0:
            pct = ns_delta[engine] / (elapsed * 1e9 * capacity) * 100
        elif engine in cyc_delta and tot_delta.get(engine):
            pct = cyc_delta[engine] / (tot_delta[engine] * capacity) * 100
        elif engine in cyc_delta and engine in client.maxfreq_hz and elapsed > 0:
            pct = cyc_delta[engine] / (client.maxfreq_hz[engine] * elapsed * capacity) * 100
        else:
            continue
        util[engine] = round(min(max(pct, 0.0), 100.0), 2)
    return util, baseline


def node_index(path: str) -> int:
    """DRM minor numbering: card<N> and renderD<128+N> belong to device N."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("renderD"):
        return int(name[7:]) - 128
    return int(name[4:])
