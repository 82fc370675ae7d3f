"""Property-based tests: hostile bytes and structures never give a traceback, a hang or invalid UTF-8.

Covers the recording reader (arbitrary bytes, arbitrary msgpack structures
shaped like records), what replay does with whatever the reader accepts (the
live view, the GPU table, JSON lines), the payload decoders, and every JSON
output.  A time-bounded mutation fuzzer for the payload decoders runs at the end.
"""

from __future__ import annotations

import io
import json
import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpuguard.commands.gpus import label_from_facts
from gpuguard.commands.replay import _json_of
from gpuguard.errors import GpuguardError
from gpuguard.events.gpu_snapshot import GpuSnapshot
from gpuguard.events.model import EVENT_TYPES, Event, Exec, NetPayload
from gpuguard.events.payload import recognise_payload, recognise_stream
from gpuguard.events.process_facts import ProcessFacts
from gpuguard.events.wire import iter_recording
from gpuguard.events.wire_format import PROCESS_KIND, SNAPSHOT_KIND
from gpuguard.outputs.console import LiveView
from gpuguard.outputs.gpu_table import GpuView, render_view
from gpuguard.outputs.jsonl import dumps_line
from tests.support.payloads import (
    assert_well_formed,
    json_line,
    socks5_connect,
    stratum,
    sv2_setup_connection,
    tls_client_hello,
    xmrig_login,
)
from tests.support.recordings import raw_recording
from tests.support.strict_json import assert_strict_json

PROPERTY = settings(
    max_examples=100,  # hypothesis's default: the fast tier runs these on every change
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Text as the kernel and /proc hand it over: any bytes, decoded with surrogateescape.
kernel_text = st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape"))
# ... and, for outputs, any code point at all (lone surrogates no decoder of ours makes included).
hostile_text = st.one_of(kernel_text, st.text(st.characters(codec=None), max_size=32))


def _values(text):
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(allow_nan=True),
        text,
        st.binary(max_size=32),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)
        ),
        max_leaves=12,
    )


values = _values(hostile_text)
stored_values = _values(kernel_text)  # what a msgpack recording can hold
# Field names the real records use, so random records reach deep into the checks.
FIELD_NAMES = sorted(
    {
        n
        for cls in (*EVENT_TYPES.values(), GpuSnapshot, ProcessFacts)
        for n in cls.__dataclass_fields__
    }
    | {
        "vendor",
        "index",
        "sm_util",
        "memory_total",
        "device_index",
        "engines",
        "extra",
        "pid",
        "comm",
    }
)
KINDS = [*EVENT_TYPES, SNAPSHOT_KIND, PROCESS_KIND, "recording_end", "nope"]


def _nested_device(vals):
    return st.fixed_dictionaries(
        {
            "vendor": st.one_of(kernel_text, vals),
            "index": st.one_of(st.integers(-(2**63), 2**63 - 1), vals),
        },
        optional={
            "sm_util": vals,
            "memory_total": vals,
            "gpu_util": vals,
            "name": vals,
            "extra": vals,
            "engines": vals,
            "device_index": vals,
            "pid": vals,
        },
    )


records = st.builds(
    lambda kind, base, extra: {"kind": kind, **base, **extra},
    st.sampled_from(KINDS),
    st.fixed_dictionaries(
        {},
        optional={
            "time": st.one_of(st.floats(0, 2e9), stored_values),
            "pid": st.one_of(st.integers(0, 2**31), stored_values),
            "start_time": st.one_of(st.floats(0, 2e9), stored_values),
            "source": stored_values,
            "devices": st.lists(_nested_device(stored_values), max_size=2),
            "processes": st.lists(_nested_device(stored_values), max_size=2),
            "ancestors": st.lists(stored_values, max_size=2),
            "config_files": stored_values,
            "cmdline": stored_values,
            "detail": stored_values,
        },
    ),
    st.dictionaries(st.sampled_from(FIELD_NAMES), stored_values, max_size=6),
)


def replay_everything(path) -> int:
    """Do with each item what replay, `gpus --replay` and the live view do; count items."""
    view = LiveView(io.StringIO(), show_all=True)
    count = 0
    try:
        for item in iter_recording(path):
            count += 1
            assert_strict_json(dumps_line(_json_of(item)))
            if isinstance(item, Event):
                view.write([item])
            elif isinstance(item, GpuSnapshot):
                console = Console(file=io.StringIO(), width=200, color_system=None)
                console.print(
                    render_view(
                        GpuView(
                            item.time,
                            [item],
                            {p.pid: label_from_facts(None) for p in item.processes},
                        )
                    )
                )
            else:
                label_from_facts(item)
    except GpuguardError as exc:
        exc.one_line().encode("utf-8")
    return count


@PROPERTY
@given(st.lists(records, max_size=5))
def test_any_records_replay_or_are_reported_never_a_traceback(tmp_path, recs):
    path = tmp_path / "r.gg"
    path.write_bytes(raw_recording(recs))
    replay_everything(path)


@PROPERTY
@given(st.binary(max_size=2048), st.integers(0, 400))
def test_any_bytes_after_a_valid_start_never_a_traceback(tmp_path, tail, cut):
    path = tmp_path / "r.gg"
    good = raw_recording([{"kind": "exec", "time": 1.0, "pid": 1, "cmdline": ["a"]}])
    path.write_bytes(good[:cut] + tail)
    replay_everything(path)


@PROPERTY
@given(st.binary(max_size=4096))
def test_payload_decoders_take_any_bytes(data):
    assert_well_formed(recognise_payload(data))
    assert_strict_json(dumps_line(recognise_payload(data)[1]))


@PROPERTY
@given(st.lists(st.binary(max_size=600), max_size=20))
def test_stream_decoder_takes_any_writes(chunks):
    assert_well_formed(recognise_stream(chunks))


@PROPERTY
@given(
    st.sampled_from(sorted(EVENT_TYPES)),
    hostile_text,
    st.lists(hostile_text, max_size=4),
    st.dictionaries(hostile_text, values, max_size=4),
    st.binary(max_size=64),
)
def test_every_event_json_line_is_valid_utf8(kind, text, texts, detail, data):
    event = EVENT_TYPES[kind](time=1.0, pid=1, comm=text)
    if isinstance(event, Exec):
        event.cmdline, event.filename = texts, text
    if isinstance(event, NetPayload):
        event.detail, event.data = detail, data
    line = dumps_line(event.to_json())
    assert "\n" not in line
    assert_strict_json(line)


@PROPERTY
@given(values)
def test_any_structure_is_one_valid_json_line(value):
    line = dumps_line({"value": value})
    assert "\n" not in line
    assert_strict_json(line)


# --- fuzzing ----------------------------------------------------------------------

FUZZ_SECONDS = 3.0
SEEDS = [
    xmrig_login(),
    stratum("mining.subscribe", ["cpuminer/2.5"]),
    json_line({"method": "eth_submitLogin"}),
    tls_client_hello("pool.example.com", ["h2"]),
    socks5_connect("pool.example.com", 3333),
    socks5_connect("10.0.0.1", 443) + tls_client_hello("x.example"),
    sv2_setup_connection(),
    b"CONNECT pool.example.com:3333 HTTP/1.1\r\nHost: pool.example.com:3333\r\n\r\n"
    + xmrig_login(),
    b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: curl\r\n\r\n",
    b"\x04\x01\x0d\x05\x00\x00\x00\x01x\x00pool\x00",
]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[pos % len(buf)] = rng.randrange(256)
        elif op == 1:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 3:
            buf[pos:pos] = rng.choice(SEEDS)[: rng.randint(1, 64)]
        elif buf:  # interesting integers: lengths and counts
            buf[pos % len(buf)] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF))
    return bytes(buf[:8192])


def test_fuzz_payload_decoders_for_a_bounded_time():
    """Mutations of real protocol messages for FUZZ_SECONDS: every result well formed, none slow."""
    rng = random.Random(0x99)  # reproducible in CI; the seed is printed on failure by pytest's repr
    deadline = time.monotonic() + FUZZ_SECONDS
    runs = 0
    while time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(SEEDS))
        started = time.thread_time()  # CPU time: the bound holds on a busy host
        assert_well_formed(recognise_payload(data))
        assert_well_formed(recognise_stream([data[:300], data[300:]]))
        assert time.thread_time() - started < 0.5, data  # linear-time decoders: never near a hang
        runs += 1
    assert runs > 100
    json.dumps(runs)
