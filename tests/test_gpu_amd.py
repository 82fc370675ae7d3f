"""amdsmi adapter against a faithful fake amdsmi, and the real amdsmi import here (no ROCm)."""

from __future__ import annotations

import sys

import pytest

from gpuguard.sources.gpu import amd
from gpuguard.sources.gpu.registry import open_samplers
from gpuguard.sources.gpu.sampler import SourceUnavailable
from tests.fakes.fake_amdsmi import STATUS, FakeAmdGpu, FakeAmdProcess, FakeAmdSmi

MIB = 1024 * 1024
GIB = 1024 * MIB


class Clock:
    def __init__(self) -> None:
        self.t = 1_750_000_000.0

    def __call__(self) -> float:
        return self.t


def open_fake(fake: FakeAmdSmi, clock: Clock | None = None, proc_root: str = "/nonexistent"):
    clock = clock or Clock()
    return amd.open_sampler(proc_root=proc_root, library=fake.module, clock=clock, monotonic=clock)


def busy_mi300x(**kw) -> FakeAmdGpu:
    values = dict(
        gfx_activity=100,
        umc_activity=38,
        vram_used_mb=180_224,
        current_socket_power=712,
        gfx_clock=2100,
        mem_clock=1300,
        hotspot_c=83,
    )
    values.update(kw)
    return FakeAmdGpu(**values)


def test_device_fields_in_contract_units():
    snap = open_fake(FakeAmdSmi([busy_mi300x()])).sample()
    assert snap.source == "amdsmi" and snap.errors == []
    (dev,) = snap.devices
    assert (dev.vendor, dev.name, dev.pci_bus_id) == ("amd", "AMD Instinct MI300X", "0000:0c:00.0")
    assert (dev.driver, dev.driver_version) == ("amdgpu", "6.10.5")
    assert (dev.gpu_util, dev.mem_util) == (100.0, 38.0)
    assert dev.memory_total == 192 * GIB and dev.memory_used == 180_224 * MIB
    assert (dev.power_w, dev.power_limit_w) == (712.0, 750.0)
    assert (dev.sm_clock_mhz, dev.mem_clock_mhz, dev.temperature_c) == (2100, 1300, 83.0)
    assert dev.extra == {"state": "ok"}  # mm_activity "N/A" -> absent, not 0


def test_process_engine_ns_become_percent_between_samples(tmp_path):
    (tmp_path / "900").mkdir()
    (tmp_path / "900" / "status").write_text("NSpid:\t900\t1\n")
    proc = FakeAmdProcess(
        pid=900,
        name="python3",
        mem=170 * GIB,
        gfx_ns=5_000_000_000,
        vram=170 * GIB,
        gtt=2 * MIB,
        cpu=4096,
    )
    gpu = busy_mi300x(processes=[proc])
    clock = Clock()
    sampler = open_fake(FakeAmdSmi([gpu]), clock, proc_root=str(tmp_path))
    (p,) = sampler.sample().processes
    assert p.sm_util is None and p.engines == {}  # first sighting: no rate yet
    assert p.used_memory == 170 * GIB and p.ns_pid == 1
    assert p.memory_regions == {"vram": 170 * GIB, "gtt": 2 * MIB, "cpu": 4096}
    clock.t += 2.0
    proc.gfx_ns += 1_900_000_000  # 1.9 s busy in 2 s
    proc.enc_ns += 100_000_000
    (p,) = sampler.sample().processes
    assert p.engines == {"gfx": 95.0, "enc": 5.0}
    assert (p.sm_util, p.enc_util) == (95.0, 5.0)


def test_legacy_process_api_uses_process_info():
    fake = FakeAmdSmi([busy_mi300x(processes=[FakeAmdProcess(77, "hashcat", 8 * GIB)])])
    fake.legacy_process_api = True
    (p,) = open_fake(fake).sample().processes
    assert (p.pid, p.used_memory) == (77, 8 * GIB)


def test_not_supported_and_no_permission_fields_reported_once():
    gpu = busy_mi300x(
        failing={
            "amdsmi_get_power_info": STATUS["AMDSMI_STATUS_NOT_SUPPORTED"],
            "amdsmi_get_gpu_process_list": STATUS["AMDSMI_STATUS_NO_PERM"],
        }
    )
    sampler = open_fake(FakeAmdSmi([gpu]))
    snap = sampler.sample()
    assert (
        snap.devices[0].power_w is None
        and snap.devices[0].gpu_util == 100.0
        and snap.processes == []
    )
    assert snap.errors == [
        "amdsmi gpu0 power: AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
        "amdsmi gpu0 processes: AMDSMI_STATUS_NO_PERM - Permission Denied",
    ]
    assert sampler.sample().errors == []


def test_gpu_lost_then_back():
    gpus = [busy_mi300x(), busy_mi300x(bdf="0000:1f:00.0", uuid="other", gfx_activity=7)]
    sampler = open_fake(FakeAmdSmi(gpus))
    sampler.sample()
    gpus[0].gone = True
    snap = sampler.sample()
    assert snap.devices[0].extra == {"state": "lost"} and snap.devices[0].gpu_util is None
    assert snap.devices[0].pci_bus_id == "0000:0c:00.0" and snap.devices[1].gpu_util == 7.0
    assert snap.errors == [
        "amdsmi gpu0 (0000:0c:00.0) unavailable: AMDSMI_STATUS_NOT_FOUND - Device Not found; "
        "retrying each sample"
    ]
    assert sampler.sample().errors == []
    gpus[0].gone = False
    snap = sampler.sample()
    assert snap.devices[0].gpu_util == 100.0 and snap.devices[0].extra == {"state": "ok"}


def test_library_lost_its_state_reinitialises():
    fake = FakeAmdSmi([busy_mi300x()])
    clock = Clock()
    sampler = open_fake(fake, clock)
    sampler.sample()
    fake.initialized = False  # e.g. amdgpu reloaded under us
    fake.init_status = STATUS["AMDSMI_STATUS_DRIVER_NOT_LOADED"]
    snap = sampler.sample()
    assert snap.devices[0].extra == {"state": "lost"}
    clock.t += 1
    assert (
        "amdsmi: re-initialising failed: AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded; retrying every 5 s"
        in sampler.sample().errors
    )
    fake.init_status = None
    clock.t += amd.REINIT_INTERVAL_S
    assert sampler.sample().devices[0].gpu_util == 100.0


@pytest.mark.parametrize(
    "status, cause",
    [
        ("AMDSMI_STATUS_DRIVER_NOT_LOADED", "amdgpu driver not loaded"),
        ("AMDSMI_STATUS_NO_PERM", "no permission to open the AMD GPUs"),
        (
            "AMDSMI_STATUS_INIT_ERROR",
            "amdsmi_init failed: AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred",
        ),
    ],
)
def test_init_failures(status, cause):
    fake = FakeAmdSmi()
    fake.init_status = STATUS[status]
    with pytest.raises(SourceUnavailable) as info:
        open_fake(fake)
    assert info.value.cause == cause


def test_no_amd_gpu():
    with pytest.raises(SourceUnavailable, match="no AMD GPU found"):
        open_fake(FakeAmdSmi([]))


def test_open_samplers_imports_the_injected_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([busy_mi300x()]).module)
    lines: list[str] = []
    (sampler,) = open_samplers(("amdsmi",), on_status=lines.append)
    assert lines == [] and sampler.sample().devices[0].gpu_util == 100.0


def test_real_amdsmi_without_rocm_is_one_line_and_prints_nothing(capfd):
    try:
        amd.load_library()
    except SourceUnavailable:
        pass
    else:
        pytest.skip("ROCm's libamd_smi.so is installed here")
    lines: list[str] = []
    assert open_samplers(("amdsmi",), on_status=lines.append) == []
    assert lines == [
        "amdsmi not available: libamd_smi.so not found "
        "(fix: install ROCm's amd-smi-lib (it ships libamd_smi.so) or set ROCM_PATH)"
    ]
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the binding's own print did not reach stdout
