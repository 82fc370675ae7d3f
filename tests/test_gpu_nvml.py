"""NVML adapter against a faithful fake pynvml, and against the real pynvml here (no driver)."""

from __future__ import annotations

import sys

import pytest

from gpuguard.sources.gpu import nvml
from gpuguard.sources.gpu.registry import open_samplers
from gpuguard.sources.gpu.sampler import SourceUnavailable
from tests.fakes.fake_pynvml import ERROR_CODES, MIB, FakeGpu, FakeNvml, FakeProcess

NOW = 1_750_000_000.0
NOW_US = int(NOW * 1_000_000)


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def busy_h100(**kw) -> FakeGpu:
    values = dict(
        util_gpu=98,
        util_memory=61,
        memory_used=76_210 * MIB,
        power_mw=688_512,
        sm_clock=1980,
        temperature=71,
        pcie_tx_kbs=1_250,
        pcie_rx_kbs=3_400,
    )
    values.update(kw)
    return FakeGpu(**values)


def open_fake(fake: FakeNvml, clock: Clock | None = None, proc_root: str = "/nonexistent"):
    return nvml.open_sampler(proc_root=proc_root, library=fake.module, clock=clock or Clock())


def test_device_fields_come_from_nvml_in_contract_units():
    # A GPU without PCIe byte counters: the first sample reads the throughput call
    # (tests/test_nvml_behaviour.py covers the counters and the slow cadence).
    snap = open_fake(FakeNvml([busy_h100(pcie_counters=False)])).sample()
    assert snap.source == "nvml" and snap.errors == []
    (dev,) = snap.devices
    assert (dev.vendor, dev.index, dev.name) == ("nvidia", 0, "NVIDIA H100 80GB HBM3")
    assert dev.uuid == "GPU-5c5f5a8e-3b0c-8c0e-2a42-6f1e6d7b1c01"
    assert dev.pci_bus_id == "00000000:18:00.0"
    assert dev.driver_version == "550.54.15"
    assert (dev.gpu_util, dev.mem_util) == (98.0, 61.0)
    assert dev.memory_total == 81_559 * MIB and dev.memory_used == 76_210 * MIB
    assert dev.power_w == pytest.approx(688.512) and dev.power_limit_w == 700.0
    assert (dev.sm_clock_mhz, dev.mem_clock_mhz, dev.temperature_c) == (1980, 2619, 71.0)
    assert (dev.pcie_tx_kbs, dev.pcie_rx_kbs, dev.mig_mode) == (1_250, 3_400, False)
    assert dev.extra == {"state": "ok", "sm_clock_max_mhz": 1980}


def test_processes_merge_compute_and_graphics_lists(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "status").write_text("Name:\tpython3\nNSpid:\t4242\t7\n")
    gpu = busy_h100(
        compute=[FakeProcess(4242, 70_000 * MIB), FakeProcess(5000, 2_000 * MIB)],
        graphics=[FakeProcess(5000, 2_000 * MIB), FakeProcess(6000, None)],
    )
    procs = {
        p.pid: p for p in open_fake(FakeNvml([gpu]), proc_root=str(tmp_path)).sample().processes
    }
    assert set(procs) == {4242, 5000, 6000}
    assert procs[4242].kind == "compute" and procs[4242].used_memory == 70_000 * MIB
    assert procs[4242].ns_pid == 7  # from NSpid: the pid inside its container
    assert procs[5000].kind == "compute+graphics" and procs[5000].used_memory == 2_000 * MIB
    assert procs[5000].ns_pid is None  # no /proc entry: not mapped
    assert procs[6000].kind == "graphics" and procs[6000].used_memory is None
    assert all(p.device_uuid == gpu.uuid for p in procs.values())


def test_process_utilization_never_reads_a_sample_twice_and_goes_stale():
    gpu = busy_h100(
        compute=[FakeProcess(4242, 70_000 * MIB)],
        util_samples=[
            (4242, NOW_US - 900_000, 80, 30, 0, 0),
            (4242, NOW_US - 200_000, 97, 55, 1, 2),
        ],
    )
    fake = FakeNvml([gpu])
    seen_args = []
    real = fake.module.nvmlDeviceGetProcessUtilization

    def spy(handle, ts):
        seen_args.append(ts)
        return real(handle, ts)

    fake.module.nvmlDeviceGetProcessUtilization = spy
    clock = Clock()
    sampler = open_fake(fake, clock)

    (p,) = sampler.sample().processes
    assert (p.sm_util, p.mem_util, p.enc_util, p.dec_util) == (
        97.0,
        55.0,
        1.0,
        2.0,
    )  # newest sample wins
    clock.t += 1
    (p,) = sampler.sample().processes  # NOT_FOUND: nothing new -> last value kept
    assert p.sm_util == 97.0
    assert seen_args == [0, NOW_US - 200_000]
    gpu.util_samples.append((4242, NOW_US + 1_500_000, 12, 5, 0, 0))
    clock.t += 1
    (p,) = sampler.sample().processes
    assert p.sm_util == 12.0 and seen_args[-1] == NOW_US - 200_000
    clock.t += nvml.UTIL_STALE_AFTER_S + 1
    (p,) = sampler.sample().processes
    assert p.sm_util is None and p.used_memory == 70_000 * MIB  # stale: not available, still listed


def test_not_supported_field_is_none_and_reported_once():
    gpu = busy_h100(
        failing={
            "nvmlDeviceGetPowerUsage": ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"],
            "nvmlDeviceGetMigMode": ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"],
        }
    )
    sampler = open_fake(FakeNvml([gpu]))
    first = sampler.sample()
    assert first.devices[0].power_w is None and first.devices[0].mig_mode is None
    assert first.devices[0].power_limit_w == 700.0 and first.devices[0].gpu_util == 98.0
    assert first.errors == ["nvml gpu0 power: Not Supported", "nvml gpu0 mig_mode: Not Supported"]
    assert sampler.sample().errors == []
    del gpu.failing["nvmlDeviceGetPowerUsage"]
    assert sampler.sample().devices[0].power_w == pytest.approx(688.512)
    gpu.failing["nvmlDeviceGetPowerUsage"] = ERROR_CODES["NVML_ERROR_NO_PERMISSION"]
    assert sampler.sample().errors == ["nvml gpu0 power: Insufficient Permissions"]


def test_process_lists_fall_back_to_older_versions():
    gpu = busy_h100(
        compute=[FakeProcess(4242, 1 * MIB)],
        failing={
            "nvmlDeviceGetComputeRunningProcesses_v2": ERROR_CODES["NVML_ERROR_FUNCTION_NOT_FOUND"]
        },
    )
    fake = FakeNvml([gpu])
    fake.remove(
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"
    )
    sampler = open_fake(fake)
    snap = sampler.sample()
    assert [p.pid for p in snap.processes] == [4242] and snap.errors == []
    assert sampler._list_fn == {
        "compute": "nvmlDeviceGetComputeRunningProcesses",
        "graphics": "nvmlDeviceGetGraphicsRunningProcesses_v2",
    }


def test_no_usable_process_list_function_is_reported_not_raised():
    gpu = busy_h100(
        failing={
            f"nvmlDeviceGetComputeRunningProcesses{s}": ERROR_CODES["NVML_ERROR_FUNCTION_NOT_FOUND"]
            for s in ("_v3", "_v2", "")
        }
    )
    snap = open_fake(FakeNvml([gpu])).sample()
    assert snap.errors == ["nvml gpu0 compute processes: no list function in this library/driver"]
    assert snap.devices[0].gpu_util == 98.0


def test_gpu_lost_mid_run_then_recovers():
    gpus = [busy_h100(), busy_h100(uuid="GPU-second", bus_id="00000000:2A:00.0", util_gpu=3)]
    gpus[0].compute = [FakeProcess(4242, 70_000 * MIB)]
    sampler = open_fake(FakeNvml(gpus))
    assert [d.gpu_util for d in sampler.sample().devices] == [98.0, 3.0]

    gpus[0].lost = True
    snap = sampler.sample()
    lost, ok = snap.devices
    assert lost.extra == {"state": "lost"} and lost.gpu_util is None and lost.memory_used is None
    assert lost.uuid == gpus[0].uuid and lost.name == "NVIDIA H100 80GB HBM3"  # identity kept
    assert ok.gpu_util == 3.0 and snap.processes == []
    assert snap.errors == [
        f"nvml gpu0 ({gpus[0].uuid}) unavailable: GPU is lost; retrying each sample"
    ]
    assert sampler.sample().errors == []  # still lost: not repeated

    gpus[0].lost = False
    snap = sampler.sample()
    assert snap.devices[0].gpu_util == 98.0 and snap.devices[0].extra["state"] == "ok"
    assert [p.pid for p in snap.processes] == [4242]


def test_driver_unloaded_then_reloaded_reinitialises_nvml():
    fake = FakeNvml([busy_h100()])
    clock = Clock()
    sampler = open_fake(fake, clock)
    sampler.sample()

    fake.driver_unloaded()
    snap = sampler.sample()
    assert snap.devices[0].extra == {"state": "lost"}
    assert any("Uninitialized" in e for e in snap.errors)
    calls = fake.init_calls
    clock.t += 1
    snap = sampler.sample()  # re-init attempted: driver still missing
    assert fake.init_calls == calls + 1 and snap.devices[0].extra == {"state": "lost"}
    assert "nvml: re-initialising failed: Driver Not Loaded; retrying every 5 s" in snap.errors
    clock.t += 1
    sampler.sample()
    assert fake.init_calls == calls + 1  # rate-limited

    fake.driver_loaded()
    clock.t += nvml.REINIT_INTERVAL_S
    snap = sampler.sample()
    assert snap.devices[0].gpu_util == 98.0 and snap.devices[0].extra["state"] == "ok"


@pytest.mark.parametrize(
    "code, cause, fix_word",
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", "library not found", "install the NVIDIA driver"),
        ("NVML_ERROR_DRIVER_NOT_LOADED", "driver not loaded", "modprobe nvidia"),
        ("NVML_ERROR_NO_PERMISSION", "no permission to open the NVIDIA devices", "root"),
    ],
)
def test_init_failures_become_one_status_line(code, cause, fix_word):
    fake = FakeNvml()
    fake.init_error = ERROR_CODES[code]
    with pytest.raises(SourceUnavailable) as info:
        open_fake(fake)
    assert info.value.cause == cause and fix_word in info.value.fix


def test_no_gpu_is_unavailable_and_nvml_is_shut_down():
    fake = FakeNvml([])
    with pytest.raises(SourceUnavailable, match="no NVIDIA GPU found"):
        open_fake(fake)
    assert fake.initialized is False


def test_open_samplers_imports_the_injected_module(monkeypatch):
    fake = FakeNvml([busy_h100()])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    lines: list[str] = []
    samplers = open_samplers(("nvml",), on_status=lines.append)
    assert lines == [] and [s.source for s in samplers] == ["nvml"]
    assert samplers[0].sample().devices[0].gpu_util == 98.0
    samplers[0].close()
    assert fake.initialized is False


def test_pynvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    lines: list[str] = []
    assert open_samplers(("nvml",), on_status=lines.append) == []
    assert lines == ["NVML not available: pynvml is not installed (fix: pip install nvidia-ml-py)"]


def test_real_pynvml_without_a_driver_is_reported_once():
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # a machine with an NVIDIA driver: this test is about one without
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is installed here")
    lines: list[str] = []
    assert open_samplers(("nvml",), on_status=lines.append) == []
    assert lines == [
        "NVML not available: library not found "
        "(fix: install the NVIDIA driver (it ships libnvidia-ml.so.1))"
    ]
