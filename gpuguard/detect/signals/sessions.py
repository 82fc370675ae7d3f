"""Rule signals of long-lived connections' activity: steady and quiet sessions (docs/sessions.md)."""

from __future__ import annotations

import ipaddress

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal
from gpuguard.detect.signals.parsed import endpoint_hosts, named_endpoints
from gpuguard.events.model import ConnActivity

# Per-connection activity: the kernel's conn_activity records, or scan's tcp_info snapshots; the
# inbound side from the TCP stack's counters.

STEADY_SPREAD = 0.25  # every interval within 25 % of the median: a timer, not a person
MIN_CADENCE_WRITES = 4  # the agent can wait for a fourth write
MIN_WINDOW_CADENCE_WRITES = (
    3  # scan sees a window only: two intervals that agree (docs/sessions.md)
)


def _steady_session(s: ProcessState) -> tuple[ConnActivity, float, float] | None:
    """The longest-lived connection whose small writes come at a steady cadence: (record, median, spread)."""
    best = None
    for record in s.sessions.values():
        times = record.small_write_times
        if len(times) < (
            MIN_WINDOW_CADENCE_WRITES if record.time_resolution_s else MIN_CADENCE_WRITES
        ):
            continue
        gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
        median = gaps[len(gaps) // 2]
        if median <= 0:
            continue
        spread = max(abs(g - median) for g in gaps)
        # times seen once a second (scan) may each be off by up to that step
        if spread > STEADY_SPREAD * median + record.time_resolution_s:
            continue
        if best is None or record.age_s > best[0].age_s:
            best = (record, median, spread)
    return best


@signal(
    "session_cadence_s",
    "number",
    "session",
    "seconds between the small writes (shares, keepalives) of its longest-lived connection with a steady cadence "
    "(pools: 15-60 s; XMRig keepalive 60 s); GPU holders only, absent when no connection is steady",
    reads=("sessions",),
)
def session_cadence_s(s: ProcessState, now: float) -> float | None:
    steady = _steady_session(s)
    return round(steady[1], 3) if steady else None


@signal(
    "session_age_s",
    "number",
    "session",
    "age of that steady connection, seconds (a lower bound when watching began later; scan: its window)",
    reads=("sessions",),
)
def session_age_s(s: ProcessState, now: float) -> float | None:
    steady = _steady_session(s)
    return steady[0].age_s if steady else None


@signal(
    "session_bytes_per_s",
    "number",
    "session",
    "bytes it sent per second over that steady connection's life",
    reads=("sessions",),
)
def session_bytes_per_s(s: ProcessState, now: float) -> float | None:
    steady = _steady_session(s)
    if not steady or steady[0].age_s <= 0:
        return None
    return round(steady[0].bytes_out / steady[0].age_s, 2)


@signal(
    "session_segments_out",
    "number",
    "session",
    "data segments that steady connection sent since its connect (TCP stack counter; absent without tcp_info)",
    reads=("sessions",),
)
def session_segments_out(s: ProcessState, now: float) -> float | None:
    steady = _steady_session(s)
    return steady[0].data_segs_out if steady else None


@signal(
    "session_bytes_in_per_write",
    "number",
    "session",
    "bytes it received per data segment it sent on that steady connection, since its connect (a pool: a reply "
    "and a job or two per share, well under 16 KiB; a download or stream: far more); absent without tcp_info",
    reads=("sessions",),
)
def session_bytes_in_per_write(s: ProcessState, now: float) -> float | None:
    steady = _steady_session(s)
    if not steady or steady[0].bytes_in is None or not steady[0].data_segs_out:
        return None
    return round(steady[0].bytes_in / steady[0].data_segs_out, 1)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 10 * 1024 else f"{n / 1024:.0f} KiB"


@signal(
    "session_summary",
    "text",
    "session",
    "that steady connection in words: 'session to 127.0.0.1:443 (fd 5): 41 writes out / 40 in, 9.8 KiB out / "
    "12 KiB in, small writes every 15.0 ± 0.4 s, open 310 s'",
    reads=("sessions",),
)
def session_summary(s: ProcessState, now: float) -> str | None:
    steady = _steady_session(s)
    if not steady:
        return None
    record, median, spread = steady
    where = (
        f"session to {record.remote} (fd {record.fd})"
        if record.remote
        else f"session on fd {record.fd}"
    )
    writes_out = record.data_segs_out if record.data_segs_out is not None else record.writes_out
    bytes_out = record.stack_bytes_out if record.stack_bytes_out is not None else record.bytes_out
    if record.bytes_in is not None and record.data_segs_in is not None:
        counts = (
            f"{writes_out} writes out / {record.data_segs_in} in, {_kib(bytes_out)} out / "
            f"{_kib(record.bytes_in)} in"
        )
    else:
        counts = f"{writes_out} writes out, {_kib(bytes_out)} out"
    seen = f" (seen once every {record.time_resolution_s:g} s)" if record.time_resolution_s else ""
    age = ("watched " if record.seeded else "open ") + f"{record.age_s:.0f} s"
    return f"{where}: {counts}, small writes every {median:.1f} ± {spread:.1f} s{seen}, {age}"


# -- a pool session's shape without its cadence: CPU miners submit shares at random moments
#    (a Poisson process), and the pool pushes jobs every 10-120 s; what stays is a long-lived
#    connection carrying only small records both ways, a few bytes a second, while threads spin.

QUIET_BYTES_PER_S = 200.0  # each way, over the connection's life
MIN_QUIET_WRITES = 3
QUIET_SEGMENT_IN = 1024  # bytes per data segment in, on average: a job is a few hundred


def _quiet_session(s: ProcessState) -> ConnActivity | None:
    """The longest-lived watched connection that carried only small records, both ways."""
    best = None
    for record in s.sessions.values():
        age = record.age_s
        if age <= 0 or record.writes_out < MIN_QUIET_WRITES:
            continue
        if record.small_writes < 0.8 * record.writes_out:
            continue
        if record.bytes_out / age > QUIET_BYTES_PER_S:
            continue
        if record.bytes_in is not None and record.bytes_in / age > QUIET_BYTES_PER_S:
            continue
        if record.data_segs_in and record.bytes_in / record.data_segs_in > QUIET_SEGMENT_IN:
            continue  # a download or stream, however slow: full segments in
        if best is None or age > best.age_s:
            best = record
    return best


@signal(
    "quiet_session_age_s",
    "number",
    "session",
    "age (s) of its longest-lived watched connection carrying only small records both ways, "
    f"<= {QUIET_BYTES_PER_S:g} B/s each way and <= {QUIET_SEGMENT_IN} B per data segment in on "
    "average, at any rhythm (a CPU miner's pool session); a lower bound when watching began "
    "later (scan's one look: the process's age, an upper bound)",
    reads=("sessions",),
)
def quiet_session_age_s(s: ProcessState, now: float) -> float | None:
    record = _quiet_session(s)
    return record.age_s if record is not None else None


@signal(
    "quiet_session_summary",
    "text",
    "session",
    "that quiet connection in words: 'quiet session to 127.0.0.1:443 (fd 3): 12 small writes out / "
    "20 segments in, 1.4 KiB out / 3.1 KiB in over 310 s (4.6 B/s out)'",
    reads=("sessions",),
)
def quiet_session_summary(s: ProcessState, now: float) -> str | None:
    record = _quiet_session(s)
    if record is None:
        return None
    where = f"to {record.remote} (fd {record.fd})" if record.remote else f"on fd {record.fd}"
    incoming = f" / {record.data_segs_in} segments in" if record.data_segs_in is not None else ""
    bytes_in = f" / {_kib(record.bytes_in)} in" if record.bytes_in is not None else ""
    age = ("watched " if record.seeded else "over ") + f"{record.age_s:.0f} s"
    return (
        f"quiet session {where}: {record.small_writes} small writes out{incoming}, "
        f"{_kib(record.bytes_out)} out{bytes_in} {age} "
        f"({record.bytes_out / record.age_s:.1f} B/s out)"
    )


# -- what else a pool session shows without its payload: the pool pushes jobs unprompted (more
#    segments in than out), the peer is an address nobody named, and its bytes are nothing
#    next to the CPU the process burns.


def _segments_out(record: ConnActivity) -> int:
    return record.data_segs_out if record.data_segs_out is not None else record.writes_out


@signal(
    "quiet_session_pushes",
    "number",
    "session",
    "segments its quiet connection's peer sent beyond one per segment the process sent (a pool "
    "pushing jobs; a heartbeat or request/reply client: about 0); absent without tcp_info",
    reads=("sessions",),
)
def quiet_session_pushes(s: ProcessState, now: float) -> int | None:
    record = _quiet_session(s)
    if record is None or record.data_segs_in is None:
        return None
    return max(0, record.data_segs_in - _segments_out(record))


@signal(
    "quiet_session_push_s",
    "number",
    "session",
    "mean seconds between those unprompted segments over the connection's age (pools push a "
    "job every 10-120 s); absent with fewer than two",
    reads=("sessions",),
)
def quiet_session_push_s(s: ProcessState, now: float) -> float | None:
    record = _quiet_session(s)
    pushes = quiet_session_pushes(s, now)
    if record is None or not pushes or pushes < 2:
        return None
    return round(record.age_s / pushes, 1)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@signal(
    "quiet_session_by_address",
    "bool",
    "session",
    "its quiet connection's peer was reached by address alone: the first bytes it sent named no "
    "host (no TLS SNI, no HTTP Host) and its command line and configs name only IP addresses; "
    "absent without a quiet connection or a captured payload",
    reads=(
        "cmdline",
        "facts.config_files",
        "network.payload_hosts",
        "payload_protocols",
        "sessions",
    ),
)
def quiet_session_by_address(s: ProcessState, now: float) -> bool | None:
    if _quiet_session(s) is None or not s.payload_protocols:
        return None
    if s.network.payload_hosts:
        return False
    return all(_is_address(host) for host in endpoint_hosts(named_endpoints(s)))


@signal(
    "quiet_session_bytes_per_cpu_s",
    "number",
    "session",
    "bytes both ways on its quiet connection per CPU second its spinning threads ran over the "
    "same span (a pool session beside hashing threads: tens; absent without a spinning thread); "
    "no shipped rule reads it: pools keep a share every ~30 s whatever the hashrate, so a miner "
    "throttled to 3 % of a core shows hundreds, as much as a chatty benign job",
    reads=("cpu_activity", "sessions"),
)
def quiet_session_bytes_per_cpu_s(s: ProcessState, now: float) -> float | None:
    record = _quiet_session(s)
    activity = s.cpu_activity
    if record is None or activity is None or not activity.spinning_threads:
        return None
    span = min(activity.spin_span_s, record.age_s)
    share = activity.ran_share if activity.ran_share is not None else 1.0
    cpu_s = activity.spinning_threads * span * share
    if cpu_s <= 0:
        return None
    bytes_out = record.stack_bytes_out if record.stack_bytes_out is not None else record.bytes_out
    return round((bytes_out + (record.bytes_in or 0)) / cpu_s, 2)
