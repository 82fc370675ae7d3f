"""The probe cache: a start that finds bcc's earlier compile loads the same programs without
compiling, sees the same events, and trusts only root's own files (real kernel, real bcc)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from gpuguard.sources.ebpf import probe_cache
from gpuguard.sources.ebpf.kernel_headers import HeaderSource
from gpuguard.sources.ebpf.probe_cache import ENV, SUFFIX, load_probes
from gpuguard.sources.ebpf.probe_image import ProbeImage, ProgramSpec, TableSpec
from tests.support.workloads import build_workload, run_with_gpu_nodes

# A small probe (a map, a program that names it, a tracepoint): compiles in a fraction of a second.
SMALL = """
#include <uapi/linux/ptrace.h>
BPF_ARRAY(seen, u64, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    int zero = 0;
    u64 *n = seen.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
"""
HEADERS = HeaderSource("host", "/lib/modules/x/build", "the host's headers")


def _bcc():
    import bcc

    return bcc


def _prog_tag(fd: int) -> str:
    """The kernel's tag of a loaded program: a digest of its instructions, map fds left out."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("prog_tag:"):
            return line.split()[1]
    raise AssertionError(f"fd {fd} is no BPF program")


def _getppid_count(bpf) -> int:
    import ctypes as ct

    return bpf[b"seen"][ct.c_int(0)].value


def _load(folder: Path, monkeypatch, text: str = SMALL, cflags=()):
    monkeypatch.setenv(ENV, str(folder))
    return load_probes(_bcc(), text, list(cflags))


def _tried(folder: Path, monkeypatch):
    """How a load with the cache in ``folder`` went (its probes already closed)."""
    loaded = _load(folder, monkeypatch)
    loaded.bpf.cleanup()
    return loaded


@pytest.fixture
def stored(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A cache folder holding SMALL's image, and the image's file."""
    folder = tmp_path / "cache"
    _tried(folder, monkeypatch)
    [entry] = folder.iterdir()
    return folder, entry


# ---- the image on disk (no kernel) -------------------------------------------------------------


def _insn(code: int, regs: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, regs, 0, imm)


def _image(programs, tables=None) -> ProbeImage:
    tables = tables or (TableSpec(b"seen", 2, 4, 8, 1, 0, '"int"', '"unsigned long long"'),)
    return ProbeImage(b"GPL", 0, tuple(tables), tuple(programs), HEADERS, time.time())


@pytest.mark.unit
def test_an_image_reads_back_as_it_was_written():
    load_map = _insn(0x18, 1 << 4 | 1, 7) + _insn(0)  # r1 = map fd 7, as bcc leaves it
    image = _image([ProgramSpec(b"tracepoint__a__b", load_map + _insn(0x95), ((0, 0),))])
    assert ProbeImage.unpack(image.pack()) == image


@pytest.mark.unit
@pytest.mark.parametrize(
    "program, why",
    [
        # a map fd load the image does not account for: its number would reach the kernel as is
        (
            ProgramSpec(b"p", _insn(0x18, 1 << 4 | 1, 7) + _insn(0) + _insn(0x95), ()),
            "but its maps",
        ),
        # a relocation at an instruction that loads no map
        (ProgramSpec(b"p", _insn(0xB7) + _insn(0x95), ((0, 0),)), "but its maps"),
        # a map value, a BTF id or a function: kernel objects not rebuilt from an image
        (
            ProgramSpec(b"p", _insn(0x18, 2 << 4 | 1, 7) + _insn(0) + _insn(0x95), ()),
            "but its maps",
        ),
        # a map the image does not have
        (
            ProgramSpec(b"p", _insn(0x18, 1 << 4 | 1, 7) + _insn(0) + _insn(0x95), ((0, 3),)),
            "lacks",
        ),
        # half an instruction
        (ProgramSpec(b"p", _insn(0x95)[:5], ()), "bytes"),
        # a program bcc would attach as a kprobe
        (ProgramSpec(b"kprobe__x", _insn(0x95), ()), "some other way"),
    ],
)
def test_an_image_that_loads_anything_but_its_own_maps_is_refused(program, why):
    with pytest.raises(ValueError, match=why):
        ProbeImage.unpack(_image([program]).pack())


@pytest.mark.unit
def test_a_map_kind_not_rebuilt_here_is_refused():
    stack = TableSpec(b"stack", 7, 4, 8, 1, 0, '"int"', '"int"')  # BPF_MAP_TYPE_STACK_TRACE
    with pytest.raises(ValueError, match="of kind 7"):
        ProbeImage.unpack(_image([ProgramSpec(b"p", _insn(0x95), ())], [stack]).pack())


@pytest.mark.unit
@pytest.mark.parametrize("raw", [b"", b"\x93\x01\x02\x03", b"\xc1", b"{}"])
def test_bytes_that_are_no_image_are_refused(raw):
    with pytest.raises(ValueError, match="not a probe image"):
        ProbeImage.unpack(raw)


@pytest.mark.unit
def test_the_key_follows_the_text_the_flags_and_the_headers_offered():
    bcc = type("bcc", (), {"__version__": "0.26.0"})
    key = probe_cache.cache_key(bcc, SMALL, ["-DA=1"], HEADERS)
    assert key == probe_cache.cache_key(bcc, SMALL, ["-DA=1"], HEADERS)
    others = {
        probe_cache.cache_key(bcc, SMALL + " ", ["-DA=1"], HEADERS),
        probe_cache.cache_key(bcc, SMALL, ["-DA=2"], HEADERS),
        probe_cache.cache_key(bcc, SMALL, ["-DA=1"], HeaderSource("bundled", "/x", "ours")),
        probe_cache.cache_key(
            type("bcc", (), {"__version__": "0.30.0"}), SMALL, ["-DA=1"], HEADERS
        ),
    }
    assert key not in others and len(others) == 4


@pytest.mark.unit
def test_off_means_no_cache(monkeypatch):
    monkeypatch.setenv(ENV, "off")
    assert probe_cache.cache_dir() is None


# ---- loading (real kernel, real bcc) ---------------------------------------------------------


@pytest.mark.root
@pytest.mark.self_contained
def test_an_image_loads_the_programs_bcc_compiled_and_counts_the_same(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    compiled = _load(folder, monkeypatch)
    assert not compiled.cached and compiled.note is None
    [entry] = folder.iterdir()
    st = entry.stat()
    assert entry.name.endswith(SUFFIX) and (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert folder.stat().st_mode & 0o777 == 0o700

    loaded = _load(folder, monkeypatch)
    assert loaded.cached
    assert "loaded from the probe cache" in loaded.headers.why
    assert loaded.headers.kind == compiled.headers.kind
    try:
        for bpf in (compiled.bpf, loaded.bpf):
            bpf.attach_all()
        fn = b"tracepoint__syscalls__sys_enter_getppid"
        # the kernel's digest of each program's instructions (map fds left out) is the same
        assert _prog_tag(loaded.bpf.funcs[fn].fd) == _prog_tag(compiled.bpf.funcs[fn].fd)
        before = (_getppid_count(compiled.bpf), _getppid_count(loaded.bpf))
        for _ in range(25):
            os.getppid()
        after = (_getppid_count(compiled.bpf), _getppid_count(loaded.bpf))
        assert after[0] - before[0] >= 25 and after[1] - before[1] >= 25
        table = loaded.bpf[b"seen"]
        assert (table.max_entries, table.Leaf.__name__) == (1, "c_ulong")
    finally:
        compiled.bpf.cleanup()
        loaded.bpf.cleanup()
    assert loaded.bpf.module is None and loaded.bpf._map_fds == []


@pytest.mark.root
@pytest.mark.self_contained
def test_a_cold_and_a_warm_sensor_report_the_same_gpu_opens(tmp_path, monkeypatch):
    """The sensor's own probes: ring buffer, tail-called open classifier, per-CPU and hash maps."""
    from gpuguard.sources.ebpf.sensor import Sensor

    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    workload = str(build_workload())
    seen = []
    for _ in ("cold", "warm"):
        with Sensor(drain_interval=0.2, sweep_interval=3600) as sensor:
            proc = run_with_gpu_nodes(
                [workload, "open:/dev/nvidiactl", "open:/dev/nvidia0", "open:/dev/kfd", "ready"]
            )
            assert proc.stdout.readline() == b"ready\n"
            opens: list = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(opens) < 3:
                opens += [e for e in sensor.poll(50) if e.pid == proc.pid and e.kind == "gpu_open"]
            proc.communicate(b"go\n", timeout=10)
            seen.append((sensor.stats.probe_cache, [(e.path, e.device_class, e.fd) for e in opens]))
            loaded_line = sensor.loaded()
    expected = [
        ("/dev/nvidiactl", "nvidia-ctl", 3),
        ("/dev/nvidia0", "nvidia", 4),
        ("/dev/kfd", "kfd", 5),
    ]
    assert seen == [("compiled", expected), ("loaded", expected)]
    assert "from the probe cache" in loaded_line


@pytest.mark.root
@pytest.mark.self_contained
def test_a_damaged_image_is_compiled_again_and_rewritten(stored, monkeypatch):
    folder, entry = stored
    entry.write_bytes(entry.read_bytes()[:100])
    again = _tried(folder, monkeypatch)
    assert not again.cached and "unusable" in again.note and "rewritten" in again.note
    third = _tried(folder, monkeypatch)
    assert third.cached and third.note is None


@pytest.mark.root
@pytest.mark.self_contained
def test_an_image_someone_else_could_have_written_is_not_loaded(stored, monkeypatch):
    folder, entry = stored
    os.chown(entry, 65534, 65534)  # a file root does not own
    owned = _tried(folder, monkeypatch)
    assert not owned.cached and "not root" in owned.note
    assert entry.stat().st_uid == 0  # the compile replaced it with root's own
    os.chmod(folder, 0o777)  # a directory anyone can write
    before = entry.stat().st_mtime_ns
    open_dir = _tried(folder, monkeypatch)
    assert not open_dir.cached and "writable by group/others" in open_dir.note
    assert entry.stat().st_mtime_ns == before  # and nothing was written there


@pytest.mark.root
@pytest.mark.self_contained
def test_a_store_keeps_the_newest_images_only(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    for n in range(probe_cache.KEEP + 5):
        old = folder / f"{n:064x}{SUFFIX}"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
    (folder / "notes.txt").write_text("not ours")
    _tried(folder, monkeypatch)
    images = sorted(p.name for p in folder.iterdir() if p.name.endswith(SUFFIX))
    assert len(images) == probe_cache.KEEP
    assert f"{probe_cache.KEEP + 4:064x}{SUFFIX}" in images  # the newest old one stays
    assert f"{0:064x}{SUFFIX}" not in images  # the oldest went
    assert (folder / "notes.txt").exists()


@pytest.mark.root
@pytest.mark.self_contained
def test_an_image_the_verifier_refuses_is_compiled_again_at_once(stored, monkeypatch):
    """A stale image the kernel will not take costs this start a compile, not its sensor."""
    folder, entry = stored
    image = ProbeImage.unpack(entry.read_bytes())
    exit_only = ProgramSpec(image.programs[0].name, _insn(0x95), ())  # exit with r0 unset
    entry.write_bytes(
        ProbeImage(
            image.license, image.kern_version, image.tables, (exit_only,), image.headers, 0.0
        ).pack()
    )
    refused = _load(folder, monkeypatch)
    try:
        assert not refused.cached and "did not load" in refused.note
        refused.bpf.attach_all()
        before = _getppid_count(refused.bpf)
        os.getppid()
        assert _getppid_count(refused.bpf) > before  # the compiled program runs
    finally:
        refused.bpf.cleanup()
    assert _tried(folder, monkeypatch).cached  # rewritten


@pytest.mark.root
@pytest.mark.self_contained
def test_a_text_with_what_an_image_cannot_rebuild_is_compiled_at_every_start(tmp_path, monkeypatch):
    """A stack-trace map (a kind not in MAP_TYPES): compiled each time, nothing kept."""
    text = SMALL.replace(
        "BPF_ARRAY(seen, u64, 1);", "BPF_ARRAY(seen, u64, 1);\nBPF_STACK_TRACE(st, 16);"
    )
    folder = tmp_path / "cache"
    for _ in range(2):
        loaded = _load(folder, monkeypatch, text=text)
        loaded.bpf.cleanup()
        assert not loaded.cached and loaded.note is None
    assert not folder.exists() or list(folder.iterdir()) == []
