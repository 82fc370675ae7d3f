"""What finds a RandomX miner that hides everything: runnable threads (schedstat), the kernel's
BTF offsets, the FPU rounding-mode probe, and scan's lifetime view (real processes, real kernel)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.engine import DetectionEngine
from gpuguard.sources.ebpf.btf import Btf, BtfError
from gpuguard.sources.ebpf.fpu_probe import BLIND_PREFIX, FpuProbe
from gpuguard.sources.proc.config_files import attach_config_files
from gpuguard.sources.proc.process import collect_process_facts
from tests.support.hugepages import reserved_huge_pages
from tests.support.load import own_cpu_group, start_in_load_group
from tests.support.randomx import INSTALL_DIR, LoopbackPool, cpu_hog, start_standin, stop

# -- BTF --------------------------------------------------------------------------


def _blob(types: list[bytes], strings: bytes) -> bytes:
    body = b"".join(types)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings))
    return header + body + strings


def test_btf_reader_follows_anonymous_members_and_refuses_bad_blobs():
    # strings: "" "int" "outer" "a" "b" "inner"
    strings = b"\0int\0outer\0a\0b\0inner\0"
    off = {name: strings.index(name.encode() + b"\0") for name in ("int", "outer", "a", "b")}
    int_type = struct.pack("<III", off["int"], 1 << 24, 4) + struct.pack("<I", 32)  # id 1
    # id 2: anonymous union { int b; } (one member at bit 0)
    union = struct.pack("<III", 0, (5 << 24) | 1, 4) + struct.pack("<III", off["b"], 1, 0)
    # id 3: struct outer { int a; union { int b; }; } with the union at byte 8
    outer = struct.pack("<III", off["outer"], (4 << 24) | 2, 12)
    outer += struct.pack("<III", off["a"], 1, 0) + struct.pack("<III", 0, 2, 64)
    btf = Btf(_blob([int_type, union, outer], strings))
    assert btf.path_offset("outer", "a") == 0
    assert btf.path_offset("outer", "b") == 8  # through the anonymous union, as C does
    assert btf.size_of("outer") == 12
    with pytest.raises(BtfError, match="no member c"):
        btf.path_offset("outer", "c")
    with pytest.raises(BtfError, match="no struct missing"):
        btf.path_offset("missing", "a")
    with pytest.raises(BtfError, match="not BTF"):
        Btf(b"\0" * 64)
    with pytest.raises(BtfError, match="ends inside a type"):
        Btf(_blob([int_type[:-2]], strings))
    with pytest.raises(BtfError, match="cannot read"):
        Btf.load("/nonexistent/vmlinux")


def test_kernel_btf_gives_the_architectural_mxcsr_offset():
    """MXCSR sits at byte 24 of the 512-byte FXSAVE area on every x86 CPU: the reader must
    find exactly that in this kernel's BTF, and the chain the probe uses must end there."""
    btf = Btf.load()
    assert btf.path_offset("fxregs_state", "mxcsr") == 24
    assert btf.size_of("fxregs_state") == 512
    regs = btf.path_offset("fpstate", "regs")
    assert btf.path_offset("fpstate", "regs", "xsave", "i387", "mxcsr") == regs + 24
    assert btf.path_offset("fpu", "fpstate") >= 0


# -- runnable threads ---------------------------------------------------------------


# -- the FPU probe --------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.host_mutator
def test_fpu_probe_counts_rounding_switches_of_the_standin_only():
    probe = FpuProbe.open()
    assert probe.loaded, probe.blind_spot
    procs: list[subprocess.Popen] = []
    # the busy host is this test's own: its four processes in a cpu group of one task's weight
    # (in the load group beside other tests' hogs the nice-19 worker went unswitched for 40 s)
    with tempfile.TemporaryDirectory(prefix="gg-fpu-") as tmp, own_cpu_group() as group:
        pool = LoopbackPool(Path(tmp), tls=False)
        try:
            rounding = start_standin(pool, "nodestatd", threads=1, nice=19)
            steady = start_standin(pool, "metricsd", threads=1, rounding=False)
            procs += [rounding, steady]
            procs.append(
                start_in_load_group(
                    ["openssl", "speed", "-seconds", "8", "sha256", "rsa2048"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            procs.append(
                start_in_load_group(
                    [
                        sys.executable,
                        "-c",
                        "import math\nx=0.0\nwhile True: x = math.sin(x) + 1.1",
                    ]
                )
            )
            for proc in procs if group is not None else ():
                group.write_text(str(proc.pid))
            # one worker at nice 19 is switched out about once a second on a busy host
            deadline = time.monotonic() + 60
            counts = {}
            while time.monotonic() < deadline:
                counts = probe.counts()
                if counts.get(rounding.pid) and counts[rounding.pid].changes >= 10:
                    break
                time.sleep(1)
        finally:
            for proc in procs:
                stop(proc)
            pool.close()
            probe.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    seen = counts.get(rounding.pid)
    assert seen is not None and seen.changes >= 10 and seen.nondefault >= seen.changes // 2, seen
    for proc in procs[1:]:
        assert proc.pid not in counts, (proc.args, counts.get(proc.pid))


@pytest.mark.root
@pytest.mark.host_mutator
def test_fpu_probe_declares_its_blind_spot_without_btf():
    probe = FpuProbe.open(btf_path="/nonexistent/vmlinux")
    assert not probe.loaded and probe.counts() == {}
    assert probe.blind_spot.startswith(BLIND_PREFIX) and "BTF" in probe.blind_spot
    assert "\n" not in probe.blind_spot


# -- scan: lifetime evidence ----------------------------------------------------------


@pytest.mark.root
@pytest.mark.host_mutator
@pytest.mark.slow
def test_scan_sees_a_throttled_standin_with_huge_pages_from_its_lifetime():
    """Huge pages reserved for it, one worker at nice 19 beside two hogs, TLS to an IP: a
    scan with a 0.5 s CPU window finds the thread that never sleeps from its lifetime totals.
    The suite's one live test on the shipped rules' own minute (the others shorten it:
    tests/support/short_windows.py)."""
    from gpuguard.correlate.correlator import Correlator
    from gpuguard.sources.host.observation import observe_host

    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="gg-scan-rx-") as tmp:
        pool = LoopbackPool(Path(tmp), tls=True)
        try:
            with reserved_huge_pages(130):
                try:
                    procs += [cpu_hog(120), cpu_hog(120)]
                    miner = start_standin(pool, "syncagent", threads=1, nice=19)
                    procs.append(miner)
                    time.sleep(65)  # cpu-hugepages-miner asks for a minute of spinning
                    obs = observe_host(cpu_sample_s=0.5, gpu=False)
                finally:
                    for proc in procs:  # before the huge pages go back
                        stop(proc)
        finally:
            pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    facts = obs.facts[miner.pid]
    assert facts.hugetlb_bytes == 256 << 20, facts
    assert facts.cpu_percent is not None and facts.cpu_percent < 50  # what CPU % saw
    activity = obs.cpu_activity[miner.pid]
    assert activity.spinning_threads >= 1 and activity.spin_span_s >= 60, activity
    correlator = Correlator(facts_provider=obs.facts.get, config_reader=attach_config_files)
    engine = DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    correlator.feed(facts)
    for event in obs.events():
        if event.pid == miner.pid:
            correlator.feed(event)
    verdict = {v.pid: v for v in engine.score(time.time())}[miner.pid]
    rules = {e.rule_id for e in verdict.evidence}
    assert {"cpu-hugepages-randomx-size", "cpu-hugepages-miner"} <= rules, verdict.explain()
    assert verdict.verdict == "suspicious", verdict.explain()


def test_scan_skips_the_gpu_window_when_there_is_nothing_to_watch(tmp_path):
    """No GPU sampler works on this machine; a /proc with no process holds no GPU device: the
    3 s window is skipped rather than waited out."""
    from gpuguard.sources.gpu.registry import open_samplers
    from gpuguard.sources.host.observation import observe_host

    assert not open_samplers(on_status=lambda line: None), (
        "this test needs a host without GPU samplers"
    )
    started = time.monotonic()
    obs = observe_host(cpu_sample_s=0.0, proc_root=str(tmp_path), gpu_window_s=3.0)
    assert obs.gpu_window_skipped and obs.gpu_window_s == 0.0
    assert time.monotonic() - started < 3.0  # it did not sit out the window


# -- evidence read late -----------------------------------------------------------------

_HOLDER = """
import os, sys, time
held = open(sys.argv[2])  # -c PATH: read the config, keep it open, delete it
if sys.argv[3] == "close":
    held.close()
os.unlink(sys.argv[2])
print("ready", flush=True)
time.sleep(120)
"""


def _late_facts(pid: int):
    from gpuguard.sources.proc.config_files import attach_config_files

    facts = collect_process_facts(pid)
    assert facts is not None
    return attach_config_files(facts)


def test_a_config_deleted_after_start_is_read_through_its_descriptor_or_named(tmp_path):
    """Seen late: one process still holds its deleted config (the text is read through
    /proc/PID/fd), another closed it (only the deletion is left to report); `sh -c` and
    `python -c` name no config file."""
    from gpuguard.correlate.correlator import Correlator

    script = tmp_path / "agentd.py"
    script.write_text(_HOLDER)
    config = '{"donate-level": 1, "pools": [{"url": "198.51.100.7:443", "tls": true}]}'
    procs = []
    try:
        for mode in ("hold", "close"):
            path = tmp_path / f"settings-{mode}.json"
            path.write_text(config)
            proc = subprocess.Popen(
                [sys.executable, str(script), "-c", str(path), mode],
                stdout=subprocess.PIPE,
            )
            procs.append(proc)
            assert proc.stdout.readline().strip() == b"ready"
        shell = subprocess.Popen(["sh", "-c", "sleep 60"])
        procs.append(shell)
        time.sleep(0.2)
        held, closed, sh = (_late_facts(p.pid) for p in procs)
    finally:
        for proc in procs:
            stop(proc)
    held_key = f"{tmp_path}/settings-hold.json (deleted; read through its open descriptor)"
    assert held.config_files.get(held_key) == config, held.config_files
    assert closed.config_files == {f"{tmp_path}/settings-close.json (deleted after start)": ""}
    assert not any("deleted" in k for k in sh.config_files), sh.config_files

    correlator = Correlator(facts_provider=None)
    engine = DetectionEngine(correlator, load_ruleset([shipped_rules_file()]))
    for facts in (held, closed, sh):
        correlator.feed(facts)
    verdicts = {v.pid: v for v in engine.score(time.time())}
    held_rules = {e.rule_id for e in verdicts[held.pid].evidence}
    assert {"config-deleted-after-start", "miner-config-keys"} <= held_rules
    assert {e.rule_id for e in verdicts[closed.pid].evidence} == {"config-deleted-after-start"}
    assert not verdicts[sh.pid].evidence
