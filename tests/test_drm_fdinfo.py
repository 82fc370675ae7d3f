"""DRM fdinfo sampler: parsing the kernel's drm-usage-stats format, utilisation, and a real /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuguard.sources.gpu import drm_fdinfo
from gpuguard.sources.gpu.drm_fdinfo import DrmFdinfoSampler, engine_utilization, parse_fdinfo
from gpuguard.sources.gpu.registry import open_samplers
from gpuguard.sources.gpu.sampler import SourceUnavailable

REPO = Path(__file__).resolve().parent.parent

KIB, MIB = 1024, 1024 * 1024

# amdgpu on Linux 6.12 (amdgpu_fdinfo.c + drm_print_memory_stats): a ROCm job on an RX 7900 XTX.
AMDGPU = textwrap.dedent("""\
    pos:\t0
    flags:\t02100002
    mnt_id:\t26
    ino:\t1142
    drm-driver:\tamdgpu
    drm-client-id:\t17
    drm-pdev:\t0000:03:00.0
    pasid:\t32771
    drm-total-cpu:\t0
    drm-shared-cpu:\t0
    drm-resident-cpu:\t0
    drm-total-gtt:\t6144 KiB
    drm-shared-gtt:\t0
    drm-resident-gtt:\t6144 KiB
    drm-total-vram:\t8462336 KiB
    drm-shared-vram:\t0
    drm-resident-vram:\t8450048 KiB
    amd-evicted-vram:\t0 KiB
    amd-requested-vram:\t8462336 KiB
    drm-engine-gfx:\t0 ns
    drm-engine-compute:\t78120938451 ns
    drm-engine-dec:\t0 ns
    """)
# amdgpu before 6.11 printed the now-deprecated drm-memory-<region> (KiB).
AMDGPU_OLD = (
    "drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t4\ndrm-memory-vram:\t1048576 KiB\n"
    "drm-memory-gtt:\t2048 KiB\ndrm-memory-cpu:\t0 KiB\namd-memory-visible-vram:\t1048576 KiB\n"
    "drm-engine-gfx:\t1000 ns\n"
)
# i915 (i915-usage-stats): video is a class of two engines.
I915 = textwrap.dedent("""\
    pos:\t0
    flags:\t02100002
    drm-driver:\ti915
    drm-pdev:\t0000:00:02.0
    drm-client-id:\t7
    drm-engine-render:\t9288864723 ns
    drm-engine-copy:\t2035071108 ns
    drm-engine-video:\t52567609040 ns
    drm-engine-capacity-video:\t2
    drm-engine-video-enhance:\t0 ns
    drm-total-system0:\t232411136
    drm-resident-system0:\t122638336
    drm-active-system0:\t4018176
    """)
# xe (xe-usage-stats): cycles against the GPU timestamp; ccs is four engines.
XE = textwrap.dedent("""\
    drm-driver:\txe
    drm-client-id:\t42
    drm-pdev:\t0000:03:00.0
    drm-total-system:\t1048576
    drm-resident-system:\t524288
    drm-total-vram0:\t64 MiB
    drm-resident-vram0:\t32 MiB
    drm-cycles-rcs:\t28257900
    drm-total-cycles-rcs:\t7655183225
    drm-cycles-ccs:\t1000
    drm-total-cycles-ccs:\t7655183225
    drm-engine-capacity-ccs:\t4
    """)
# panfrost (panfrost-usage-stats): time, and cycles with a maximum frequency.
PANFROST = textwrap.dedent("""\
    drm-driver:\tpanfrost
    drm-client-id:\t3
    drm-engine-fragment:\t1000000000 ns
    drm-cycles-fragment:\t800000000
    drm-maxfreq-fragment:\t800000000 Hz
    drm-curfreq-fragment:\t400000000 Hz
    drm-engine-vertex-tiler:\t0 ns
    drm-total-memory:\t12 MiB
    drm-resident-memory:\t10 MiB
    panfrost-total-heap:\t4 MiB
    """)


def replace_counter(text: str, key: str, value: int) -> str:
    lines = [
        f"{key}:\t{value}"
        + (" ns" if key.startswith("drm-engine-") and "capacity" not in key else "")
        if line.startswith(key + ":")
        else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def test_amdgpu_keys():
    c = parse_fdinfo(AMDGPU)
    assert (c.driver, c.client_id, c.pdev) == ("amdgpu", "17", "0000:03:00.0")
    assert c.engine_ns == {"gfx": 0, "compute": 78_120_938_451, "dec": 0}
    assert c.memory["total"]["vram"] == 8_462_336 * KIB
    assert c.held_memory() == {
        "cpu": 0,
        "gtt": 6144 * KIB,
        "vram": 8_450_048 * KIB,
    }  # resident wins


def test_amdgpu_deprecated_drm_memory_keys():
    c = parse_fdinfo(AMDGPU_OLD)
    assert c.held_memory() == {"vram": 1024 * MIB, "gtt": 2 * MIB, "cpu": 0}


def test_i915_capacity_and_time_based_utilisation():
    first = parse_fdinfo(I915)
    assert first.capacity == {"video": 2} and first.engine_ns["video-enhance"] == 0
    assert first.held_memory() == {"system0": 122_638_336}
    util, base = engine_utilization(first, None, mono=100.0)
    assert util == {}  # no baseline yet
    text = replace_counter(I915, "drm-engine-video", 52_567_609_040 + 1_500_000_000)
    text = replace_counter(text, "drm-engine-render", 9_288_864_723 + 250_000_000)
    util, _ = engine_utilization(parse_fdinfo(text), base, mono=101.0)
    # video: 1.5 s busy over 1 s on 2 engines = 75 %; render 0.25 s of 1 s = 25 %
    assert util == {"video": 75.0, "render": 25.0, "copy": 0.0, "video-enhance": 0.0}


def test_xe_cycles_based_utilisation():
    first = parse_fdinfo(XE)
    assert first.engine_ns == {} and first.cycles == {"rcs": 28_257_900, "ccs": 1000}
    assert first.total_cycles == {"rcs": 7_655_183_225, "ccs": 7_655_183_225}
    assert first.held_memory() == {"system": 524_288, "vram0": 32 * MIB}
    _, base = engine_utilization(first, None, mono=10.0)
    text = replace_counter(XE, "drm-cycles-rcs", 28_257_900 + 6_000_000)
    text = replace_counter(text, "drm-total-cycles-rcs", 7_655_183_225 + 10_000_000)
    text = replace_counter(text, "drm-cycles-ccs", 1000 + 20_000_000)
    text = replace_counter(text, "drm-total-cycles-ccs", 7_655_183_225 + 10_000_000)
    util, _ = engine_utilization(parse_fdinfo(text), base, mono=10.5)  # wall time does not matter
    assert util == {"rcs": 60.0, "ccs": 50.0}


def test_panfrost_prefers_time_and_msm_style_cycles_with_maxfreq():
    c = parse_fdinfo(PANFROST)
    assert c.maxfreq_hz == {"fragment": 800_000_000} and c.held_memory() == {"memory": 10 * MIB}
    _, base = engine_utilization(c, None, mono=0.0)
    text = replace_counter(PANFROST, "drm-engine-fragment", 1_000_000_000 + 400_000_000)
    util, _ = engine_utilization(parse_fdinfo(text), base, mono=1.0)
    assert util["fragment"] == 40.0  # from ns, not from cycles (which did not move)
    cycles_only = (
        "drm-driver:\tmsm\ndrm-client-id:\t1\ndrm-cycles-gpu:\t{}\ndrm-maxfreq-gpu:\t700 MHz\n"
    )
    _, base = engine_utilization(parse_fdinfo(cycles_only.format(0)), None, mono=0.0)
    util, _ = engine_utilization(parse_fdinfo(cycles_only.format(350_000_000)), base, mono=2.0)
    assert util == {"gpu": 25.0}  # 350 M cycles / (700 MHz * 2 s)


def test_counter_going_backwards_keeps_the_larger_value():
    text = "drm-driver:\ti915\ndrm-client-id:\t1\ndrm-engine-render:\t{} ns\n"
    _, base = engine_utilization(parse_fdinfo(text.format(5_000_000_000)), None, 0.0)
    util, base = engine_utilization(parse_fdinfo(text.format(4_000_000_000)), base, 1.0)
    assert util == {"render": 0.0}
    util, _ = engine_utilization(parse_fdinfo(text.format(5_500_000_000)), base, 2.0)
    assert util == {"render": 50.0}  # measured from 5.0 s, not from 4.0 s


def test_no_drm_keys_is_none():
    assert parse_fdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\t24\nino:\t3\n") is None


class FakeProc:
    """A /proc-shaped tree: pid/fd/N symlinks (targets need not exist) and pid/fdinfo/N."""

    def __init__(self, root) -> None:
        self.root = root
        (root / "self" / "fdinfo").mkdir(parents=True)

    def fd(
        self,
        pid: int,
        fd: int,
        target: str,
        fdinfo: str = "pos:\t0\nflags:\t02\n",
        nspid: str | None = None,
    ):
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True, exist_ok=True)
        (base / "fdinfo").mkdir(exist_ok=True)
        link = base / "fd" / str(fd)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
        (base / "fdinfo" / str(fd)).write_text(fdinfo)
        (base / "status").write_text(f"Name:\tx\nNSpid:\t{nspid or pid}\n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_synthetic_proc_tree_counts_each_client_once(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    engine = "drm-engine-compute:\t{} ns\n"
    # pid 300: one client on two fds (card + render node, as Mesa does) plus a non-DRM fd
    proc.fd(
        300,
        5,
        "/dev/dri/card0",
        AMDGPU.replace("drm-engine-compute:\t78120938451 ns\n", engine.format(0)),
    )
    proc.fd(
        300,
        6,
        "/dev/dri/renderD128",
        AMDGPU.replace("drm-engine-compute:\t78120938451 ns\n", engine.format(0)),
    )
    proc.fd(300, 7, "/dev/null")
    # pid 301 (in a container: NSpid) holds the same client after fd passing
    proc.fd(
        301,
        3,
        "/dev/dri/renderD128",
        AMDGPU.replace("drm-engine-compute:\t78120938451 ns\n", engine.format(0)),
        nspid="301\t12",
    )
    clock = Clock()
    sampler = DrmFdinfoSampler(
        proc_root=str(proc.root), sys_root=str(tmp_path / "sys"), clock=clock, monotonic=clock
    )
    snap = sampler.sample()
    by_pid = {p.pid: p for p in snap.processes}
    assert set(by_pid) == {300, 301}
    vram = 8_450_048 * KIB
    assert by_pid[300].used_memory == vram + 6144 * KIB  # not doubled by the second fd
    assert by_pid[300].memory_regions == {"cpu": 0, "gtt": 6144 * KIB, "vram": vram}
    assert by_pid[301].ns_pid == 12 and by_pid[300].ns_pid is None
    assert by_pid[300].sm_util is None  # first sighting
    (dev,) = snap.devices
    assert (dev.index, dev.driver, dev.pci_bus_id) == (0, "amdgpu", "0000:03:00.0")
    assert dev.memory_used == vram + 6144 * KIB and dev.extra["clients"] == 1  # shared client once

    clock.t += 2.0
    busy = AMDGPU.replace("drm-engine-compute:\t78120938451 ns\n", engine.format(1_800_000_000))
    for pid, fd in ((300, 5), (300, 6), (301, 3)):
        (proc.root / str(pid) / "fdinfo" / str(fd)).write_text(busy)
    snap = sampler.sample()
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[300].engines["compute"] == 90.0 and by_pid[300].sm_util == 90.0
    assert by_pid[301].sm_util == 90.0
    assert snap.devices[0].gpu_util == 90.0  # the shared client is not summed twice
    assert snap.errors == []


def test_sysfs_device_identity_and_amdgpu_busy_percent(tmp_path):
    pci = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:03:00.0"
    pci.mkdir(parents=True)
    (tmp_path / "sys" / "bus" / "pci" / "drivers" / "amdgpu").mkdir(parents=True)
    (pci / "driver").symlink_to(tmp_path / "sys" / "bus" / "pci" / "drivers" / "amdgpu")
    (pci / "gpu_busy_percent").write_text("37\n")
    (pci / "mem_info_vram_total").write_text(str(24 * 1024 * MIB) + "\n")
    (pci / "mem_info_vram_used").write_text(str(9 * 1024 * MIB) + "\n")
    card = tmp_path / "sys" / "class" / "drm" / "card1"
    card.mkdir(parents=True)
    (card / "device").symlink_to(pci)
    (tmp_path / "sys" / "class" / "drm" / "card1-DP-1").mkdir()
    proc = FakeProc(tmp_path / "proc")
    sampler = drm_fdinfo.open_sampler(proc_root=str(proc.root), sys_root=str(tmp_path / "sys"))
    (dev,) = sampler.sample().devices
    assert (dev.index, dev.driver, dev.pci_bus_id, dev.gpu_util) == (
        1,
        "amdgpu",
        "0000:03:00.0",
        37.0,
    )
    assert (dev.memory_used, dev.memory_total) == (9 * 1024 * MIB, 24 * 1024 * MIB)


def test_no_drm_anywhere_is_unavailable(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    with pytest.raises(SourceUnavailable, match="no DRM device"):
        drm_fdinfo.open_sampler(proc_root=str(proc.root), sys_root=str(tmp_path / "sys"))


@pytest.mark.skipif(os.path.exists("/sys/class/drm"), reason="this machine has DRM devices")
def test_open_samplers_on_this_gpu_less_machine_reports_one_line(tmp_path):
    # This machine's /sys; a /proc of its own where no process holds /dev/dri open (another
    # test may hold a stand-in DRM node open on the real one while this runs).
    proc = FakeProc(tmp_path / "proc")
    lines: list[str] = []
    assert open_samplers(("drm-fdinfo",), proc_root=str(proc.root), on_status=lines.append) == []
    assert lines == [
        "DRM fdinfo not available: no DRM device (/sys/class/drm has no card, no process holds "
        "/dev/dri open) (fix: nothing to fix on a host without GPUs; else load the GPU's kernel driver)"
    ]


# Run inside the namespaces below: the sampler on the real /sys and the namespace's own /proc.
_SAMPLE_IN_NAMESPACE = """
import json, os
from gpuguard.sources.gpu import drm_fdinfo
snap = drm_fdinfo.open_sampler().sample()
print(json.dumps({
    "me": os.getpid(),
    "processes": [
        [p.pid, p.vendor, p.device_index, p.sm_util, p.used_memory, p.engines, p.memory_regions]
        for p in snap.processes
    ],
    "devices": [[d.index, d.gpu_util, d.extra.get("clients_with_data")] for d in snap.devices],
    "errors": snap.errors,
}))
"""


@pytest.mark.root
@pytest.mark.self_contained
def test_real_proc_finds_a_drm_named_fd_with_no_data():
    """A private mount namespace with its own /dev where renderD128 is the null device
    (platform.md), and its own pid namespace and /proc: the sampler, run there on the real
    /proc code path, sees the fd link /dev/dri/renderD128 of its own process, and no other
    process of the host, so the device's whole client count is this test's."""
    script = (
        "mount --make-rprivate / && mount -t tmpfs tmpfs /dev && mkdir /dev/dri && "
        "mknod /dev/dri/renderD128 c 1 3 && exec 7</dev/dri/renderD128 && "
        'exec "$0" -c "$1"'
    )
    out = subprocess.run(
        ["unshare", "-m", "-p", "-f", "--mount-proc", "sh", "-c", script]
        + [sys.executable, _SAMPLE_IN_NAMESPACE],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    (usage,) = [p for p in seen["processes"] if p[0] == seen["me"]]
    assert usage[1:] == ["drm", 0, None, None, {}, {}]
    assert len(seen["processes"]) == 1  # the namespace holds no other client
    (dev,) = [d for d in seen["devices"] if d[0] == 0]
    assert dev == [0, None, 0]  # one client, no utilisation, none with data
    assert seen["errors"] == []  # "no data" is not an error


def test_sweeper_finds_late_opens_within_the_sweep_period_and_drops_closed_fds(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.fd(500, 3, "/usr/lib/libc.so.6")  # seen first with no DRM fd
    proc.fd(501, 4, "/dev/dri/renderD128", I915)
    sampler = DrmFdinfoSampler(
        proc_root=str(proc.root), sys_root=str(tmp_path / "sys"), sweep_every=3
    )
    assert [p.pid for p in sampler.sample().processes] == [501]
    proc.fd(500, 5, "/dev/dri/renderD128", XE)  # opened later
    seen = [[p.pid for p in sampler.sample().processes] for _ in range(3)]
    assert seen[-1] == [500, 501] and seen.count([501]) <= 2  # found within 3 samples
    (proc.root / "501" / "fd" / "4").unlink()  # closed: gone at once, no sweep needed
    assert [p.pid for p in sampler.sample().processes] == [500]
