"""Convert the real H100 traces into recordings (the wire format) and write the synthetic variants.

Run ``python tests/traces/convert_h100.py`` from the repository root to rewrite
every ``tests/traces/cases/NAME/capture.ggrec``; ``expected.yaml`` beside each
is written by hand and never by this script.

Real (``h100_*``): ``tests/traces/h100/*.gpus.jsonl`` are ``gpuguard gpus
--watch 1 --json`` output recorded on an NVIDIA H100 (see the README there,
copied from ``shared/traces/h100``).  Each line becomes one ``GpuSnapshot``
unchanged; each GPU process gets the ``ProcessFacts`` a /proc walk would
record.  ``h100_hashing_loop_blanked`` replaces the hashing loop's name, path
and command line (``/tmp/xmrig-cuda -o stratum+tcp://...``) with neutral ones
and records no network, so only its GPU behaviour is left.
``h100_inference_server`` adds the ``nvidia-smi`` runs (once a second) that the
trace's README says were polling during the recording: their exec/exit events
and facts are synthetic, the GPU figures are real.

Synthetic (``synthetic_*``, marked ``synthetic: true`` in the recording header):
the memory-hard profile (Ethash/KawPow-like: a 4.5 GiB allocation made once,
memory controller ~100 %, SM ~97 %, PCIe near zero), the time-gated duty cycle
(busy only 22-06 UTC over 35 hours), a miner that pauses while ``nvidia-smi``
runs, and a GPU burn-in tool (flat SM 100 %, busy memory controller, 90 % of
memory) that must stay clean.  Their device figures (power, clocks, PCIe at
rest) are taken from the hashing-loop trace.  Random series use fixed seeds.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage  # noqa: E402
from gpuguard.events.model import Exec, Exit  # noqa: E402
from gpuguard.events.process_facts import Ancestor, ProcessFacts  # noqa: E402
from gpuguard.events.wire_write import RecordingWriter  # noqa: E402

TRACES = HERE / "h100"
CASES = HERE / "cases"
GIB = 1 << 30
MIB = 1 << 20
_PROCESS_FIELDS = set(ProcessGpuUsage.__dataclass_fields__)
_DEVICE_FIELDS = set(DeviceSample.__dataclass_fields__)
BASH = Ancestor(pid=1800, comm="bash", exe="/usr/bin/bash")
SYSTEMD = Ancestor(pid=1, comm="systemd", exe="/usr/lib/systemd/systemd")
# Who the blanked hashing loop claims to be: an ordinary service binary, no options, no network.
BLANK_IDENTITY = {
    "comm": "worker",
    "exe": "/opt/svc/bin/worker",
    "cmdline": ["/opt/svc/bin/worker"],
}


def load_trace(name: str) -> list[dict]:
    with open(TRACES / f"{name}.gpus.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def snapshot_of(record: dict) -> GpuSnapshot:
    """One ``gpus --json`` line as the GpuSnapshot the NVML sampler produced."""
    return GpuSnapshot(
        time=record["time"],
        source="nvml",
        devices=[
            DeviceSample(**{k: v for k, v in d.items() if k in _DEVICE_FIELDS})
            for d in record["devices"]
        ],
        processes=[
            ProcessGpuUsage(**{k: v for k, v in p.items() if k in _PROCESS_FIELDS})
            for p in record["processes"]
        ],
        errors=list(record.get("errors", [])),
    )


def facts_for(
    pid: int, start: float, comm: str, exe: str, cmdline: list[str], user: str = "root", **extra
) -> ProcessFacts:
    return ProcessFacts(
        pid=pid,
        start_time=round(start, 2),
        ppid=BASH.pid,
        comm=comm,
        exe=exe,
        cmdline=cmdline,
        cwd="/root",
        uid=0 if user == "root" else 1000,
        username=user,
        cgroup="/user.slice/user-0.slice/session-1.scope",
        environ_readable=True,
        exe_identity=(2049, 500000 + pid, 1_000_000, 1_795_000_000_000_000_000),
        ancestors=[BASH, SYSTEMD],
        **extra,
    )


def real_items(name: str, identity: dict | None = None) -> list:
    """Facts for every GPU process of the trace (before its first snapshot), then the snapshots."""
    records = load_trace(name)
    items: list = []
    seen: set[int] = set()
    for record in records:
        for proc in record["processes"]:
            if proc["pid"] in seen:
                continue
            seen.add(proc["pid"])
            who = identity or {"comm": proc["name"], "exe": proc["exe"], "cmdline": [proc["exe"]]}
            items.append(
                facts_for(
                    proc["pid"],
                    record["time"] - 2.0,
                    who["comm"],
                    who["exe"],
                    list(who["cmdline"]),
                    proc.get("user") or "root",
                )
            )
        items.append(snapshot_of(record))
    return items


def with_nvidia_smi_polls(items: list, every_s: float = 1.0, first_pid: int = 30000) -> list:
    """Add an ``nvidia-smi`` run (facts, exec, exit 0.3 s later) before each snapshot, as the recording had."""
    out: list = []
    pid = first_pid
    for item in items:
        if isinstance(item, GpuSnapshot):
            t = item.time - 0.5
            out.append(
                facts_for(
                    pid,
                    t,
                    "nvidia-smi",
                    "/usr/bin/nvidia-smi",
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv"],
                )
            )
            out.append(
                Exec(
                    time=t,
                    pid=pid,
                    comm="nvidia-smi",
                    ppid=BASH.pid,
                    filename="/usr/bin/nvidia-smi",
                    cmdline=["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv"],
                )
            )
            out.append(Exit(time=t + 0.3, pid=pid, comm="nvidia-smi", exit_code=0))
            pid += 1
        out.append(item)
    return out


# -- synthetic variants --------------------------------------------------------


def _device(template: DeviceSample, **changes) -> DeviceSample:
    values = {f: getattr(template, f) for f in DeviceSample.__dataclass_fields__}
    values["extra"] = dict(template.extra)
    values.update(changes)
    return DeviceSample(**values)


def _busy_device(
    rng: random.Random,
    base: DeviceSample,
    sm: float,
    memctl: float,
    used: int,
    power: float,
    pcie_kbs: tuple[int, int],
) -> DeviceSample:
    return _device(
        base,
        gpu_util=round(sm),
        mem_util=round(memctl),
        memory_used=used,
        power_w=round(power + rng.gauss(0, power * 0.015), 3),
        sm_clock_mhz=1980,
        pcie_tx_kbs=int(pcie_kbs[0] * rng.uniform(0.9, 1.1)),
        pcie_rx_kbs=int(pcie_kbs[1] * rng.uniform(0.9, 1.1)),
    )


def _idle_device(rng: random.Random, base: DeviceSample, used: int) -> DeviceSample:
    return _device(
        base,
        gpu_util=0.0,
        mem_util=0.0,
        memory_used=used,
        power_w=round(72.8 + rng.gauss(0, 0.3), 3),
        sm_clock_mhz=345,
        pcie_tx_kbs=int(rng.uniform(450, 1500)),
        pcie_rx_kbs=int(rng.uniform(400, 520)),
    )


def _usage(pid: int, base: DeviceSample, sm: float, memctl: float, used: int) -> ProcessGpuUsage:
    return ProcessGpuUsage(
        pid=pid,
        vendor="nvidia",
        device_index=0,
        device_uuid=base.uuid,
        sm_util=float(round(sm)),
        mem_util=float(round(memctl)),
        enc_util=0.0,
        dec_util=0.0,
        used_memory=used,
        kind="compute",
    )


def _template() -> tuple[DeviceSample, float]:
    first = load_trace("hashing-loop")[0]
    return snapshot_of(first).devices[0], first["time"]


def memory_hard_items() -> list:
    rng = random.Random(4)
    base, t0 = _template()
    pid, used = 4100, int(4.5 * GIB)
    items: list = [facts_for(pid, t0 - 2, "worker", "/opt/svc/bin/worker", ["/opt/svc/bin/worker"])]
    for i in range(150):  # 150 s, one sample a second, like the real traces
        sm, memctl = min(100.0, rng.gauss(97, 0.8)), min(100.0, rng.gauss(99, 0.6))
        dev = _busy_device(rng, base, sm, memctl, used + 504 * MIB, 430, (1500, 1400))
        items.append(
            GpuSnapshot(
                time=t0 + i,
                source="nvml",
                devices=[dev],
                processes=[_usage(pid, base, sm, memctl, used)],
            )
        )
    return items


def time_gated_items() -> list:
    """35 hours, one sample a minute, from 12:00 UTC: busy 22:00-06:00 UTC, idle (allocation kept)
    by day; ends at night."""
    rng = random.Random(22)
    base, _ = _template()
    t0 = 1_795_305_600.0 + 12 * 3600  # 2026-11-22 12:00 UTC
    pid, used = 4200, 545_259_520
    items: list = [
        facts_for(pid, t0 - 60, "worker", "/opt/svc/bin/worker", ["/opt/svc/bin/worker"])
    ]
    for i in range(35 * 60):
        t = t0 + 60 * i
        night = int(t // 3600) % 24 in (22, 23, 0, 1, 2, 3, 4, 5)
        sm = min(100.0, rng.gauss(98.8, 0.7)) if night else 0.0
        dev = (
            _busy_device(rng, base, sm, 0, used + 504 * MIB, 395, (1500, 1400))
            if night
            else _idle_device(rng, base, used + 504 * MIB)
        )
        items.append(
            GpuSnapshot(
                time=t, source="nvml", devices=[dev], processes=[_usage(pid, base, sm, 0, used)]
            )
        )
    return items


def pauses_when_watched_items() -> list:
    """Busy; nvidia-smi runs for 10 s every minute and the process idles while it does (20 minutes)."""
    rng = random.Random(7)
    base, t0 = _template()
    pid, used, smi = 4300, 545_259_520, 31000
    items: list = [facts_for(pid, t0 - 2, "worker", "/opt/svc/bin/worker", ["/opt/svc/bin/worker"])]
    for i in range(1200):
        t = t0 + i
        if i % 60 == 30:
            items.append(
                facts_for(
                    smi, t - 0.5, "nvidia-smi", "/usr/bin/nvidia-smi", ["nvidia-smi", "-l", "1"]
                )
            )
            items.append(
                Exec(
                    time=t - 0.5,
                    pid=smi,
                    comm="nvidia-smi",
                    ppid=BASH.pid,
                    filename="/usr/bin/nvidia-smi",
                    cmdline=["nvidia-smi", "-l", "1"],
                )
            )
        watched = 30 <= i % 60 < 40
        sm = 0.0 if watched else min(100.0, rng.gauss(98.8, 0.7))
        dev = (
            _idle_device(rng, base, used + 504 * MIB)
            if watched
            else _busy_device(rng, base, sm, 0, used + 504 * MIB, 395, (1500, 1400))
        )
        items.append(
            GpuSnapshot(
                time=t, source="nvml", devices=[dev], processes=[_usage(pid, base, sm, 0, used)]
            )
        )
        if i % 60 == 39:
            items.append(Exit(time=t + 0.5, pid=smi, comm="nvidia-smi", exit_code=0))
            smi += 1
    return items


def burn_in_items() -> list:
    """gpu-burn-like stress test: SM 100 % flat, DGEMM keeps the memory controller busy, 90 % of memory."""
    rng = random.Random(9)
    base, t0 = _template()
    pid, used = 4400, int(0.9 * base.memory_total)
    items: list = [
        facts_for(pid, t0 - 2, "gpu_burn", "/opt/gpu-burn/gpu_burn", ["./gpu_burn", "600"])
    ]
    for i in range(400):
        sm, memctl = 100.0, min(100.0, rng.gauss(42, 3))
        dev = _busy_device(rng, base, sm, memctl, used + 504 * MIB, 690, (1500, 1400))
        items.append(
            GpuSnapshot(
                time=t0 + i,
                source="nvml",
                devices=[dev],
                processes=[_usage(pid, base, sm, memctl, used)],
            )
        )
    return items


def write_case(name: str, items: list, synthetic: bool, description: str) -> Path:
    case = CASES / name
    case.mkdir(parents=True, exist_ok=True)
    path = case / "capture.ggrec"
    meta = {
        "synthetic": synthetic,
        "case": name,
        "description": description,
        "generator": "tests/traces/convert_h100.py",
    }
    with RecordingWriter(path, meta=meta, overwrite=True) as writer:
        for item in items:
            writer.write(item)
    return path


def all_cases() -> dict[str, tuple[list, bool, str]]:
    """name -> (items, synthetic, description); the test regenerates these and compares them."""
    return {
        "h100_hashing_loop_blanked": (
            real_items("hashing-loop", BLANK_IDENTITY),
            False,
            "real H100 hashing loop, name/path/cmdline blanked, no network",
        ),
        "h100_cnn_training": (real_items("cnn-training"), False, "real H100 PyTorch CNN training"),
        "h100_inference_server": (
            with_nvidia_smi_polls(real_items("inference-server")),
            False,
            "real H100 inference server; nvidia-smi polls synthetic (the trace had them)",
        ),
        "synthetic_memory_hard": (
            memory_hard_items(),
            True,
            "synthetic memory-hard (DAG) miner profile",
        ),
        "synthetic_time_gated": (
            time_gated_items(),
            True,
            "synthetic night-only hashing loop over 35 h",
        ),
        "synthetic_pauses_when_watched": (
            pauses_when_watched_items(),
            True,
            "synthetic miner that idles while nvidia-smi runs",
        ),
        "synthetic_burn_in": (
            burn_in_items(),
            True,
            "synthetic GPU burn-in tool (must stay clean)",
        ),
    }


def main() -> None:
    for name, (items, synthetic, description) in all_cases().items():
        print(write_case(name, items, synthetic, description))


if __name__ == "__main__":
    main()
