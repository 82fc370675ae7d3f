"""The msgpack recording format (events.wire): round trips, damage, refusals."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import msgpack
import pytest

import gpuguard
from gpuguard.errors import GpuguardError
from gpuguard.events import abi
from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage
from gpuguard.events.model import (
    EVENT_TYPES,
    ConnActivity,
    Connect,
    CpuActivity,
    Exec,
    Exit,
    GpuIoctl,
    GpuOpen,
    HugeAlloc,
    Lost,
    NetPayload,
)
from gpuguard.events.process_facts import Ancestor, ProcessFacts
from gpuguard.events.wire import RecordingDamaged, iter_recording, read_header
from gpuguard.events.wire_format import item_from_record
from gpuguard.events.wire_write import RecordingWriter
from tests.support.recordings import T0, raw_recording


def sample_events() -> list:
    """One event of every kind with every field away from its default."""
    common = dict(
        pid=4242, tid=4243, uid=1000, gid=1001, cgroup_id=0x1234_5678_9ABC, comm="kworker/\udcff0"
    )
    events = [
        GpuOpen(
            time=T0,
            path="/dev/nvidia-uvm",
            device_class="nvidia-uvm",
            fd=9,
            flags=0o2002,
            relative=True,
            **common,
        ),
        GpuIoctl(
            time=T0 + 1,
            device_class="nvidia",
            command=(1 << 32) | 0x2B,
            command_name="NV_ESC_RM_ALLOC(xfer)",
            count=123456,
            **common,
        ),
        Connect(
            time=T0 + 2,
            family="ipv6",
            address="2001:db8::7",
            port=3333,
            fd=12,
            result=-115,
            **common,
        ),
        NetPayload(
            time=T0 + 3,
            fd=12,
            seq=1,
            protocol="socks5",
            detail={
                "stage": "connect",
                "target_port": 443,
                "methods": ["none"],
                "inner_protocol": "tls",
            },
            data=bytes(range(256)) * 2,
            truncated=True,
            **common,
        ),
        Exec(
            time=T0 + 4,
            filename="/tmp/.X11-unix/\udce9xmrig",
            ppid=1,
            cmdline=["xmrig", "-o", "pool:3333", ""],
            **common,
        ),
        Exit(time=T0 + 5, exit_code=137, **common),
        Lost(time=T0 + 6, what="net_payload", count=7, **common),
        ConnActivity(
            time=T0 + 7,
            fd=12,
            age_s=310.5,
            bytes_out=2100,
            writes_out=14,
            small_writes=11,
            small_write_times=[T0 - 60.0, T0 - 30.0, T0],
            idle_s=7.0,
            seeded=True,
            **common,
        ),
        HugeAlloc(
            time=T0 + 8,
            source="mmap",
            length=2181038080,
            page_size=1 << 30,
            flags=0x22 | 0x40000 | (30 << 26),
            **common,
        ),
        CpuActivity(
            time=T0 + 9,
            threads=5,
            spinning_threads=4,
            spin_span_s=598.0,
            runnable_max=0.99,
            ran_share=0.03,
            fpu_samples=2400,
            fpu_round_nondefault=1800,
            fpu_round_changes=1350,
            fpu_span_s=597.0,
            **common,
        ),
    ]
    assert {e.kind for e in events} == set(EVENT_TYPES), "add a sample for the new event kind"
    return events


def sample_snapshot() -> GpuSnapshot:
    return GpuSnapshot(
        time=T0 + 7,
        source="nvml",
        devices=[
            DeviceSample(
                vendor="nvidia",
                index=0,
                name="NVIDIA H100",
                uuid="GPU-1234",
                gpu_util=97.5,
                memory_used=70 << 30,
                memory_total=80 << 30,
                power_w=650.25,
                mig_mode=False,
                extra={"ecc": True, "clocks": [1980, 2619]},
            )
        ],
        processes=[
            ProcessGpuUsage(
                pid=4242,
                vendor="nvidia",
                device_index=0,
                sm_util=96.0,
                used_memory=64 << 30,
                engines={"gfx": 99.0},
                memory_regions={"vram": 1 << 34},
                kind="compute",
            )
        ],
        errors=["pcie throughput: not supported"],
    )


def sample_process() -> ProcessFacts:
    return ProcessFacts(
        pid=4242,
        start_time=T0 - 60,
        ppid=1,
        comm="[kworker/0:2]",
        exe="/memfd:x (deleted)",
        exe_deleted=True,
        exe_memfd=True,
        cmdline=["[kworker/0:2]", "\udcfe"],
        cwd="/tmp",
        uid=0,
        username="root",
        cgroup="/kubepods/pod1/abc",
        container_runtime="containerd",
        container_id="ab" * 32,
        pod_uid="pod1",
        ld_preload="/usr/lib/libprocesshider.so",
        environ_readable=True,
        exe_identity=(2049, 131, 8_400_000, 17),
        ancestors=[Ancestor(1, "systemd", "/usr/lib/systemd/systemd")],
        cpu_percent=398.5,
        rss_bytes=2 << 30,
        num_threads=9,
    )


def all_items() -> list:
    return [*sample_events(), sample_snapshot(), sample_process()]


def write(path: Path, items: list, meta: dict | None = None) -> None:
    with RecordingWriter(path, meta=meta) as writer:
        for item in items:
            writer.write(item)


def read_until_damage(path: Path) -> tuple[list, RecordingDamaged | None]:
    items = []
    try:
        for item in iter_recording(path):
            items.append(item)
    except RecordingDamaged as exc:
        return items, exc
    return items, None


def boundaries(data: bytes) -> list[int]:
    """End offset of every msgpack object in ``data`` (header first)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, unicode_errors="surrogateescape")
    unpacker.feed(data)
    ends = []
    for _ in unpacker:
        ends.append(unpacker.tell())
    return ends


# --- round trips ------------------------------------------------------------------


def test_every_item_kind_round_trips(tmp_path):
    path = tmp_path / "rec.gg"
    items = all_items()
    write(path, items)
    back = list(iter_recording(path))
    assert back == items
    assert [type(i) for i in back] == [type(i) for i in items]
    assert back[3].data == bytes(range(256)) * 2 and isinstance(back[3].data, bytes)
    assert back[0].comm == "kworker/\udcff0"  # undecodable bytes survive
    assert back[-1].exe_identity == (2049, 131, 8_400_000, 17)


def test_header_carries_format_abi_host_version_and_meta(tmp_path):
    path = tmp_path / "rec.gg"
    write(path, [], meta={"command": "record", "duration_s": 30})
    header = read_header(path)
    assert header["format"] == "gpuguard-recording"
    assert header["version"] == 1
    assert header["abi"] == abi.ABI_VERSION
    assert header["gpuguard"] == gpuguard.__version__
    assert header["meta"] == {"command": "record", "duration_s": 30}
    assert isinstance(header["host"], str) and header["host"]
    assert abs(header["created"] - __import__("time").time()) < 60
    assert list(iter_recording(path)) == []


def test_writer_counts_items_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "rec.gg"
    with RecordingWriter(path) as writer:
        for event in sample_events():
            writer.write(event)
        assert writer.items_written == len(sample_events())
    with pytest.raises(GpuguardError, match="already exists"):
        RecordingWriter(path)
    with RecordingWriter(path, overwrite=True) as writer:
        writer.write(sample_process())
    assert list(iter_recording(path)) == [sample_process()]


def test_writer_rejects_other_objects_and_writes_after_close(tmp_path):
    writer = RecordingWriter(tmp_path / "rec.gg")
    with pytest.raises(TypeError, match="dict"):
        writer.write({"kind": "exec"})  # type: ignore[arg-type]
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(sample_process())


def test_many_items_cross_read_blocks(tmp_path):
    path = tmp_path / "big.gg"
    events = [
        NetPayload(time=T0 + i, pid=i % 1000, fd=i, data=bytes([i % 256]) * 300)
        for i in range(10_000)
    ]
    write(path, events)
    assert path.stat().st_size > 2 << 20  # more than two read blocks
    back = list(iter_recording(path))
    assert len(back) == len(events) and back[-1] == events[-1] and back[4321] == events[4321]


# --- damage -------------------------------------------------------------------------


def test_crash_before_close_leaves_a_readable_prefix(tmp_path):
    path = tmp_path / "rec.gg"
    writer = RecordingWriter(path)
    for event in sample_events():
        writer.write(event)
    writer.flush()
    crashed = tmp_path / "crashed.gg"
    crashed.write_bytes(path.read_bytes())  # what is on disk when the process dies here
    writer.close()
    items, damage = read_until_damage(crashed)
    assert items == sample_events()
    assert damage is not None and damage.items_read == len(items)
    assert "without its end marker" in str(damage)


def test_truncation_at_every_byte_yields_the_prefix_then_damage(tmp_path):
    path = tmp_path / "rec.gg"
    items = all_items()
    write(path, items)
    data = path.read_bytes()
    ends = boundaries(data)  # header, items..., end marker
    item_ends = ends[1:-1]
    cut_path = tmp_path / "cut.gg"
    for cut in range(len(data)):
        cut_path.write_bytes(data[:cut])
        got, damage = read_until_damage(cut_path)
        expected = sum(1 for end in item_ends if end <= cut)
        assert got == items[:expected], cut
        assert damage is not None, cut
        assert damage.items_read == expected
        assert str(cut_path) in str(damage)
        if cut >= ends[0] and cut not in ends:
            assert f"truncated after item {expected} at byte " in str(damage)
            assert damage.offset <= cut


def test_truncation_message_names_file_item_and_offset(tmp_path):
    path = tmp_path / "rec.gg"
    items = sample_events()
    write(path, items)
    data = path.read_bytes()
    ends = boundaries(data)
    cut = ends[3] + 5  # five bytes into item 4
    path.write_bytes(data[:cut])
    got, damage = read_until_damage(path)
    assert len(got) == 3
    assert str(damage) == (
        f"{path}: truncated after item 3 at byte {ends[3]} (the recording stopped mid-write; "
        f"the 3 items before it were read)"
    )
    assert damage.offset == ends[3]


def test_invalid_msgpack_in_the_middle_is_damage_after_the_prefix(tmp_path):
    path = tmp_path / "rec.gg"
    items = all_items()
    write(path, items)
    data = bytearray(path.read_bytes())
    ends = boundaries(bytes(data))
    data[ends[4]] = 0xC1  # a byte msgpack never uses, at the start of item 5
    path.write_bytes(bytes(data))
    got, damage = read_until_damage(path)
    assert got == items[:4]
    assert damage.items_read == 4 and damage.offset == ends[4]
    assert f"item 5 at byte {ends[4]} is not valid msgpack" in str(damage)


def test_a_value_flip_keeping_the_structure_is_caught_by_the_checksum(tmp_path):
    path = tmp_path / "rec.gg"
    items = sample_events()
    write(path, items)
    data = bytearray(path.read_bytes())
    at = data.index(b"NV_ESC_RM_ALLOC")
    data[at] = ord("X")
    path.write_bytes(bytes(data))
    got, damage = read_until_damage(path)
    assert len(got) == len(items)
    assert got[1].command_name == "XV_ESC_RM_ALLOC(xfer)"
    assert "checksum mismatch" in str(damage)


def test_random_corruption_anywhere_never_raises_anything_else(tmp_path):
    path = tmp_path / "rec.gg"
    items = all_items()
    write(path, items)
    clean = path.read_bytes()
    header_end = boundaries(clean)[0]
    rng = random.Random(99)
    bad = tmp_path / "bad.gg"
    for offset in range(header_end, len(clean)):
        data = bytearray(clean)
        data[offset] = (data[offset] + rng.randrange(1, 256)) % 256
        for _ in range(rng.randrange(0, 3)):
            extra = rng.randrange(header_end, len(data))
            data[extra] = rng.getrandbits(8)
        bad.write_bytes(bytes(data))
        got, damage = read_until_damage(bad)
        assert damage is not None, offset
        assert damage.items_read == len(got) <= len(items)


def test_corrupt_header_bytes_give_only_gpuguard_errors(tmp_path):
    path = tmp_path / "rec.gg"
    write(path, sample_events()[:2])
    clean = path.read_bytes()
    bad = tmp_path / "bad.gg"
    outcomes = set()
    for offset in range(boundaries(clean)[0]):
        for value in {0x00, 0xC1, clean[offset] ^ 0x01} - {clean[offset]}:  # a real change only
            data = bytearray(clean)
            data[offset] = value
            bad.write_bytes(bytes(data))
            try:
                list(iter_recording(bad))
            except RecordingDamaged:
                outcomes.add("damaged")
            except GpuguardError:
                outcomes.add("refused")
            else:
                outcomes.add("read")
    # Some flips only change a header value: the checksum then reports damage.
    assert outcomes <= {"damaged", "refused"} and "refused" in outcomes


def test_unknown_kind_is_damage_with_a_clear_message(tmp_path):
    path = tmp_path / "rec.gg"
    records = [
        sample_events()[0].to_record(),
        {"kind": "gpu_teleport", "time": T0},
        sample_events()[1].to_record(),
    ]
    path.write_bytes(raw_recording(records))
    got, damage = read_until_damage(path)
    # the bad item is skipped and named with its index; the items after it still replay (issue 10)
    assert got == sample_events()[:2]
    assert "item 2 at byte" in str(damage) and "unknown record kind 'gpu_teleport'" in str(damage)
    assert damage.items_read == 2


@pytest.mark.parametrize(
    "bad, path_named",
    [
        (
            {
                "kind": "gpu_snapshot",
                "time": T0,
                "source": "nvml",
                "devices": [{"vendor": "nvidia", "index": 0, "memory_total": "lots"}],
            },
            "devices[0].memory_total",
        ),
        (
            {
                "kind": "gpu_snapshot",
                "time": T0,
                "source": "nvml",
                "processes": [{"pid": 1, "vendor": "nvidia", "device_index": 0, "sm_util": "x"}],
            },
            "processes[0].sm_util",
        ),
        ({"kind": "gpu_snapshot", "time": T0, "source": "nvml", "errors": [5]}, "errors[0]"),
        (
            {"kind": "process", "pid": 1, "start_time": T0, "config_files": {"a": 5}},
            "config_files['a']",
        ),
        ({"kind": "process", "pid": 1, "start_time": T0, "cmdline": "not a list"}, "cmdline"),
        ({"kind": "process", "pid": 1, "start_time": T0, "exe_identity": [1, 2]}, "exe_identity"),
        (
            {
                "kind": "process",
                "pid": 1,
                "start_time": T0,
                "ancestors": [{"pid": 1, "comm": 2, "exe": "x"}],
            },
            "ancestors[0].comm",
        ),
    ],
)
def test_wrong_types_deep_inside_are_reported_with_the_index_and_the_rest_replays(
    tmp_path, bad, path_named
):
    path = tmp_path / "rec.gg"
    records = [sample_events()[0].to_record(), bad, sample_events()[1].to_record()]
    path.write_bytes(raw_recording(records))
    got, damage = read_until_damage(path)
    assert got == sample_events()[:2]
    assert (
        "item 2 at byte" in str(damage)
        and path_named in str(damage)
        and "1 bad item" in str(damage)
    )


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"kind": "gpu_ioctl", "time": T0, "pid": "4242"}, "'pid' holds str"),
        ({"kind": "gpu_ioctl", "time": T0}, "bad fields"),
        ({"kind": "gpu_ioctl", "time": True, "pid": 1}, "'time' holds bool"),
        ({"kind": "gpu_open", "time": T0, "pid": 1, "relative": 1}, "'relative' holds int"),
        ({"kind": "connect", "time": T0, "pid": 1, "port": 3333.0}, "'port' holds float"),
        ({"kind": "exec", "time": T0, "pid": 1, "cmdline": ["a", 7]}, "'cmdline' holds a non-str"),
        ({"kind": "net_payload", "time": T0, "pid": 1, "data": "not bytes"}, "'data' holds str"),
        (
            {"kind": "gpu_snapshot", "time": T0, "source": "nvml", "devices": [{"nope": 1}]},
            "bad fields",
        ),
        ({"kind": "gpu_snapshot", "source": "nvml"}, "numeric 'time'"),
        ({"kind": "process", "pid": 1, "start_time": T0, "ancestors": [7]}, "bad fields"),
        ({"kind": "process", "pid": 1.5, "start_time": T0}, "integer 'pid'"),
        ({"kind": ["exec"], "time": T0}, "unknown record kind"),
        ([1, 2, 3], "a list where a record map belongs"),
    ],
)
def test_records_with_bad_fields_are_damage(tmp_path, record, reason):
    path = tmp_path / "rec.gg"
    path.write_bytes(raw_recording([record]))
    got, damage = read_until_damage(path)
    assert got == []
    assert reason in str(damage) and "item 1 at byte" in str(damage)
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace("[", r"\[")):
        item_from_record(record)


def test_an_integer_time_is_a_valid_time():
    event = item_from_record({"kind": "gpu_ioctl", "time": 1_700_000_000, "pid": 7, "count": 3})
    assert event.time == 1_700_000_000 and event.count == 3


def test_fields_from_a_newer_recorder_are_ignored(tmp_path):
    path = tmp_path / "rec.gg"
    record = {**sample_events()[5].to_record(), "signal_name": "SIGKILL"}
    path.write_bytes(raw_recording([record]))
    assert list(iter_recording(path)) == [sample_events()[5]]


def test_data_after_the_end_marker_is_damage(tmp_path):
    path = tmp_path / "rec.gg"
    write(path, sample_events()[:2])
    extra = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape").pack(
        sample_events()[2].to_record()
    )
    path.write_bytes(path.read_bytes() + extra)
    got, damage = read_until_damage(path)
    assert got == sample_events()[:2]
    assert "after the end marker" in str(damage)


def test_end_marker_with_the_wrong_count_is_damage(tmp_path):
    path = tmp_path / "rec.gg"
    data = raw_recording([sample_events()[0].to_record()], end=False)
    path.write_bytes(
        data + msgpack.packb({"kind": "recording_end", "items": 5, "crc32": zlib.crc32(data)})
    )
    got, damage = read_until_damage(path)
    assert len(got) == 1 and "counts 5 items but 1 were read" in str(damage)


def test_oversized_length_field_is_damage_not_a_memory_blowup(tmp_path):
    path = tmp_path / "rec.gg"
    data = raw_recording([sample_events()[0].to_record()], end=False)
    # A str8/str32 header claiming 4 GiB, then some bytes.
    path.write_bytes(data + b"\xdb\xff\xff\xff\xff" + b"x" * 1000)
    got, damage = read_until_damage(path)
    assert len(got) == 1 and damage.items_read == 1


# --- refusals --------------------------------------------------------------------------


def test_empty_file_is_damage_at_byte_zero(tmp_path):
    path = tmp_path / "empty.gg"
    path.write_bytes(b"")
    with pytest.raises(RecordingDamaged, match="empty") as info:
        list(iter_recording(path))
    assert info.value.offset == 0 and info.value.items_read == 0
    with pytest.raises(RecordingDamaged):
        read_header(path)


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"format": "gpuguard-recording"}).encode(),
        msgpack.packb({"format": "pcap", "version": 1}),
        msgpack.packb([1, 2, 3]),
        b"\x89PNG\r\n\x1a\n",
        b"\xc1\x00garbage",
    ],
)
def test_a_file_that_is_not_a_recording_says_so_with_a_fix(tmp_path, content):
    path = tmp_path / "other.bin"
    path.write_bytes(content)
    with pytest.raises(GpuguardError) as info:
        read_header(path)
    assert not isinstance(info.value, RecordingDamaged)
    assert "not a gpuguard recording" in info.value.cause
    assert "gpuguard record" in info.value.fix
    with pytest.raises(GpuguardError, match="not a gpuguard recording"):
        list(iter_recording(path))


def test_unknown_format_version_names_the_writer(tmp_path):
    path = tmp_path / "future.gg"
    header = {"format": "gpuguard-recording", "version": 2, "gpuguard": "9.9.0"}
    path.write_bytes(raw_recording([], header=header))
    with pytest.raises(GpuguardError) as info:
        read_header(path)
    assert "version 2" in info.value.cause and "reads version 1" in info.value.cause
    assert "9.9.0" in info.value.fix


def test_missing_file_fails_at_the_call(tmp_path):
    with pytest.raises(GpuguardError, match="no such recording"):
        iter_recording(tmp_path / "nope.gg")
