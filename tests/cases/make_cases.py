"""Write the golden cases' captures (synthetic: no real GPU traces exist yet).

Run ``python tests/cases/make_cases.py`` from the repository root to rewrite
every ``tests/cases/NAME/capture.ggrec``.  Each capture is a recording in the
wire format (``gpuguard.events.wire``) built from realistic sequences: the
ProcessFacts a /proc walk would record, GPU device opens, ioctl counts with
the command numbers from the driver headers (see indicators.md), connects,
recognised payloads, and one GPU snapshot every 5 s whose per-process
utilisation follows the published shapes — miners flat at ~92-99 % with very
low variance, training periodic with data-loader/eval dips, inference bursty,
monitors and idle holders near 0 %.  The random series use fixed seeds, so
the output is the same on every run.

``expected.yaml`` beside each capture is written by hand from what the case
SHOULD produce; this script never writes it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.events.gpu_snapshot import DeviceSample, GpuSnapshot, ProcessGpuUsage  # noqa: E402
from gpuguard.events.ioctl_names import ioc  # noqa: E402
from gpuguard.events.model import (  # noqa: E402
    ConnActivity,
    Connect,
    CpuActivity,
    Exec,
    Exit,
    GpuIoctl,
    GpuOpen,
    HugeAlloc,
    NetPayload,
)
from gpuguard.events.process_facts import Ancestor, ProcessFacts  # noqa: E402
from gpuguard.events.wire_write import RecordingWriter  # noqa: E402

CASES_DIR = Path(__file__).resolve().parent
T0 = 1_700_000_000.0
DURATION_S = 600
SNAPSHOT_EVERY_S = 5
GIB = 1 << 30
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
XMR_WALLET = "4" + "".join(
    random.Random(58).choice(_BASE58) for _ in range(94)
)  # synthetic, 95 characters

# NVIDIA escape numbers (nv_escape.h) and UVM commands, as the sensor reports them.
NV_RM_ALLOC = 0xC030462B
NV_RM_CONTROL = 0xC020462A
NV_RM_MAP_MEMORY = 0xC038464E
NV_RM_FREE = 0xC0104629
NV_RM_ALLOC_MEMORY = 0xC0204627
NV_CARD_INFO = ioc(3, ord("F"), 200, 0x900)
NV_REGISTER_FD = ioc(3, ord("F"), 201, 4)
NV_CHECK_VERSION_STR = ioc(3, ord("F"), 210, 0x48)
NV_ATTACH_GPUS_TO_FD = ioc(3, ord("F"), 212, 4)
UVM_INITIALIZE = 0x30000001
UVM_REGISTER_GPU = 37
UVM_REGISTER_GPU_VASPACE = 25
UVM_REGISTER_CHANNEL = 27
UVM_MAP_EXTERNAL_ALLOCATION = 33
UVM_MM_INITIALIZE = 75

BASH = Ancestor(pid=900, comm="bash", exe="/usr/bin/bash")
SSHD = Ancestor(pid=800, comm="sshd", exe="/usr/sbin/sshd")
SYSTEMD = Ancestor(pid=1, comm="systemd", exe="/usr/lib/systemd/systemd")


def facts(
    pid: int,
    comm: str,
    exe: str,
    cmdline: list[str],
    *,
    start: float = 0.0,
    ppid: int = 900,
    ancestors: list[Ancestor] | None = None,
    user: str = "bob",
    uid: int = 1000,
    **extra,
) -> ProcessFacts:
    return ProcessFacts(
        pid=pid,
        start_time=round(T0 + start, 2),
        ppid=ppid,
        comm=comm,
        exe=exe,
        cmdline=cmdline,
        cwd=extra.pop("cwd", "/home/bob"),
        uid=uid,
        username=user,
        cgroup=extra.pop("cgroup", "/user.slice/user-1000.slice/session-3.scope"),
        environ_readable=True,
        exe_identity=(2049, 100000 + pid, 4_000_000, int(T0 * 1e9)),
        ancestors=ancestors if ancestors is not None else [BASH, SSHD, SYSTEMD],
        **extra,
    )


def cuda_start(pid: int, comm: str, at: float, gpus: int = 1) -> list:
    """The device opens and ioctls of a CUDA context being created (cuInit + cuCtxCreate)."""
    t = T0 + at
    items: list = [
        GpuOpen(
            time=t,
            pid=pid,
            comm=comm,
            path="/dev/nvidiactl",
            device_class="nvidia-ctl",
            fd=3,
            flags=0o2,
        ),
        GpuOpen(
            time=t + 0.01,
            pid=pid,
            comm=comm,
            path="/dev/nvidia-uvm",
            device_class="nvidia-uvm",
            fd=4,
            flags=0o2,
        ),
    ]
    for gpu in range(gpus):
        items.append(
            GpuOpen(
                time=t + 0.02,
                pid=pid,
                comm=comm,
                path=f"/dev/nvidia{gpu}",
                device_class="nvidia",
                fd=5 + gpu,
                flags=0o2,
            )
        )
    counts = [
        ("nvidia-ctl", NV_CHECK_VERSION_STR, 1),
        ("nvidia-ctl", NV_CARD_INFO, 1),
        ("nvidia-ctl", NV_REGISTER_FD, gpus),
        ("nvidia-ctl", NV_ATTACH_GPUS_TO_FD, 1),
        ("nvidia-ctl", NV_RM_ALLOC, 60 * gpus),
        ("nvidia-ctl", NV_RM_CONTROL, 400 * gpus),
        ("nvidia-ctl", NV_RM_ALLOC_MEMORY, 12 * gpus),
        ("nvidia-ctl", NV_RM_MAP_MEMORY, 30 * gpus),
        ("nvidia-uvm", UVM_INITIALIZE, 1),
        ("nvidia-uvm", UVM_MM_INITIALIZE, 1),
        ("nvidia-uvm", UVM_REGISTER_GPU, gpus),
        ("nvidia-uvm", UVM_REGISTER_GPU_VASPACE, gpus),
        ("nvidia-uvm", UVM_REGISTER_CHANNEL, 4 * gpus),
        ("nvidia-uvm", UVM_MAP_EXTERNAL_ALLOCATION, 16 * gpus),
    ]
    items += [
        GpuIoctl(time=t + 1.0, pid=pid, comm=comm, device_class=dc, command=cmd, count=n)
        for dc, cmd, n in counts
    ]
    return items


def steady_ioctls(
    pid: int, comm: str, every_s: int, start: float, end: float, alloc: int, control: int
) -> list:
    """Per-interval ioctl counts after start-up (memory churn and control calls)."""
    out = []
    t = start
    while t < end:
        out.append(
            GpuIoctl(
                time=T0 + t,
                pid=pid,
                comm=comm,
                device_class="nvidia-ctl",
                command=NV_RM_CONTROL,
                count=control,
            )
        )
        if alloc:
            out.append(
                GpuIoctl(
                    time=T0 + t,
                    pid=pid,
                    comm=comm,
                    device_class="nvidia-ctl",
                    command=NV_RM_MAP_MEMORY,
                    count=alloc,
                )
            )
            out.append(
                GpuIoctl(
                    time=T0 + t,
                    pid=pid,
                    comm=comm,
                    device_class="nvidia-ctl",
                    command=NV_RM_FREE,
                    count=alloc,
                )
            )
        t += every_s
    return out


def snapshots(
    series: dict[int, list[tuple[float | None, int | None]]],
    *,
    gpus: int = 1,
    total: int = 80 * GIB,
    start: float = 0.0,
) -> list[GpuSnapshot]:
    """One snapshot per SNAPSHOT_EVERY_S: ``series[pid][i] = (sm_util, used_memory)``."""
    out = []
    steps = max(len(s) for s in series.values())
    for i in range(steps):
        t = T0 + start + i * SNAPSHOT_EVERY_S
        devices = [
            DeviceSample(vendor="nvidia", index=g, name="NVIDIA H100 80GB HBM3", memory_total=total)
            for g in range(gpus)
        ]
        processes = []
        for pid, points in sorted(series.items()):
            if i < len(points):
                util, memory = points[i]
                for g in range(gpus):
                    processes.append(
                        ProcessGpuUsage(
                            pid=pid,
                            vendor="nvidia",
                            device_index=g,
                            sm_util=util,
                            used_memory=memory,
                            kind="compute",
                        )
                    )
        out.append(GpuSnapshot(time=t, source="replay", devices=devices, processes=processes))
    return out


def flat_series(
    seed: int, mean: float, jitter: float, memory: int, steps: int
) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    return [(round(min(100.0, max(0.0, rng.gauss(mean, jitter))), 1), memory) for _ in range(steps)]


def training_series(seed: int, steps: int) -> list[tuple[float, int]]:
    """Busy steps with a data-loader stall every ~40 s and an eval/checkpoint dip every 150 s."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        t = i * SNAPSHOT_EVERY_S
        if t % 150 in (0, 5, 10):
            util = rng.uniform(5, 25)  # evaluation + checkpoint write
        elif t % 40 == 35:
            util = rng.uniform(35, 60)  # data loader cannot keep up
        else:
            util = rng.uniform(82, 99)
        out.append((round(util, 1), int(71.5 * GIB)))
    return out


def inference_series(seed: int, steps: int) -> list[tuple[float, int]]:
    """Idle with request bursts: mostly 0-8 %, bursts of 50-95 % lasting 10-30 s."""
    rng = random.Random(seed)
    out, burst = [], 0
    for _ in range(steps):
        if burst == 0 and rng.random() < 0.12:
            burst = rng.randint(2, 6)
        if burst:
            burst -= 1
            util = rng.uniform(50, 95)
        else:
            util = rng.uniform(0, 8)
        out.append((round(util, 1), int(22 * GIB)))
    return out


def sorted_items(items: list) -> list:
    """Facts first (as a recorder writes them), then everything in time order (stable)."""
    facts_items = [i for i in items if isinstance(i, ProcessFacts)]
    rest = [i for i in items if not isinstance(i, ProcessFacts)]
    return facts_items + sorted(rest, key=lambda i: i.time)


def write_case(name: str, description: str, items: list, out_dir: Path = CASES_DIR) -> Path:
    case_dir = out_dir / name
    case_dir.mkdir(exist_ok=True)
    path = case_dir / "capture.ggrec"
    meta = {
        "synthetic": True,
        "case": name,
        "description": description,
        "generator": "tests/cases/make_cases.py",
    }
    with RecordingWriter(path, meta=meta, overwrite=True) as writer:
        for item in sorted_items(items):
            writer.write(item)
    return path


STEPS = DURATION_S // SNAPSHOT_EVERY_S


# -- miners ----------------------------------------------------------------------


def miner_stratum_cmdline() -> list:
    pid, comm = 4242, "xmrig"
    cmd = [
        "./xmrig",
        "-o",
        "stratum+tcp://pool.supportxmr.com:3333",
        "-u",
        XMR_WALLET,
        "-p",
        "rig1",
        "-a",
        "rx/0",
        "--donate-level=1",
        "--cuda",
        "--no-cpu",
    ]
    items = [
        facts(
            900,
            "bash",
            "/usr/bin/bash",
            ["-bash"],
            start=-3600,
            ppid=800,
            ancestors=[SSHD, SYSTEMD],
        ),
        facts(pid, comm, "/home/bob/xmrig-6.21.0/xmrig", cmd, cwd="/home/bob/xmrig-6.21.0"),
        Exec(
            time=T0,
            pid=pid,
            comm=comm,
            filename="/home/bob/xmrig-6.21.0/xmrig",
            ppid=900,
            cmdline=cmd,
        ),
        *cuda_start(pid, comm, 1.0),
        Connect(
            time=T0 + 2,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="141.94.96.144",
            port=3333,
            fd=12,
            result=-115,
        ),
        NetPayload(
            time=T0 + 2.2,
            pid=pid,
            comm=comm,
            fd=12,
            protocol="cryptonote",
            detail={
                "method": "login",
                "agent": "XMRig/6.21.0 (Linux x86_64) libuv/1.44.2 gcc/12.2.0",
                "login": XMR_WALLET,
                "algo": ["rx/0", "cn/r"],
            },
            data=b'{"id":1,"jsonrpc":"2.0","method":"login","params":{"login":"'
            + XMR_WALLET.encode()
            + b'"',
        ),
        *steady_ioctls(pid, comm, 10, 10, DURATION_S, 0, 4),
        *snapshots({pid: flat_series(1, 97.5, 0.8, int(2.3 * GIB), STEPS)}),
    ]
    return items


def renamed_miner_shm() -> list:
    pid, comm = 31337, "kworker/0:2"
    items = [
        facts(
            pid,
            comm,
            "/dev/shm/.x/kw",
            ["[kworker/0:2]"],
            exe_deleted=True,
            user="www-data",
            uid=33,
            cwd="/dev/shm/.x",
            ancestors=[
                Ancestor(7001, "sh", "/usr/bin/dash"),
                Ancestor(610, "cron", "/usr/sbin/cron"),
                SYSTEMD,
            ],
            ppid=7001,
        ),
        *cuda_start(pid, comm, 3.0),
        Connect(
            time=T0 + 4,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="45.9.148.21",
            port=14444,
            fd=9,
            result=-115,
        ),
        NetPayload(
            time=T0 + 4.1,
            pid=pid,
            comm=comm,
            fd=9,
            protocol="tls",
            detail={},
            data=b"\x16\x03\x01\x02\x00\x01",
        ),
        *steady_ioctls(pid, comm, 10, 10, DURATION_S, 0, 3),
        *snapshots({pid: flat_series(2, 96.0, 1.0, int(5.1 * GIB), STEPS)}),
    ]
    return items


XMRIG_CONFIG = f"""{{
    "autosave": true,
    "donate-level": 1,
    "cpu": {{"enabled": false}},
    "cuda": {{"enabled": true, "loader": "libxmrig-cuda.so"}},
    "opencl": false,
    "randomx": {{"1gb-pages": false}},
    "pools": [
        {{
            "algo": "rx/0",
            "coin": "monero",
            "url": "gulf.moneroocean.stream:10128",
            "user": "{XMR_WALLET}",
            "pass": "x",
            "tls": true,
            "keepalive": true,
            "nicehash": false
        }}
    ]
}}
"""


def miner_config_file() -> list:
    pid, comm = 5150, "systemd-helper"
    exe = "/opt/app/.cache/systemd-helper"
    items = [
        facts(
            pid,
            comm,
            exe,
            [exe],
            cwd="/opt/app/.cache",
            ppid=1,
            ancestors=[SYSTEMD],
            user="app",
            uid=1002,
            cgroup="/system.slice/app-helper.service",
            config_files={"config.json": XMRIG_CONFIG},
        ),
        *cuda_start(pid, comm, 2.0),
        Connect(
            time=T0 + 3,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="172.67.72.114",
            port=10128,
            fd=11,
            result=-115,
        ),
        NetPayload(
            time=T0 + 3.1,
            pid=pid,
            comm=comm,
            fd=11,
            protocol="tls",
            detail={"sni": "gulf.moneroocean.stream"},
            data=b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        ),
        *steady_ioctls(pid, comm, 10, 10, DURATION_S, 0, 4),
        *snapshots({pid: flat_series(3, 95.0, 1.2, int(2.4 * GIB), STEPS)}),
    ]
    return items


def miner_socks5_proxy() -> list:
    pid, comm = 6200, "dbus-worker"
    exe = "/usr/local/lib/dbus-worker"
    items = [
        facts(
            pid,
            comm,
            exe,
            [exe, "-x", "127.0.0.1:1080", "--background"],
            ppid=1,
            ancestors=[SYSTEMD],
            user="root",
            uid=0,
            cgroup="/system.slice/dbus-worker.service",
        ),
        *cuda_start(pid, comm, 2.0),
        Connect(
            time=T0 + 3,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="127.0.0.1",
            port=1080,
            fd=10,
            result=0,
        ),
        NetPayload(
            time=T0 + 3.05,
            pid=pid,
            comm=comm,
            fd=10,
            seq=0,
            protocol="socks5",
            detail={"target_host": "pool.hashvault.pro", "target_port": 3333},
            data=b"\x05\x01\x00\x05\x01\x00\x03\x12pool.hashvault.pro\x0d\x05",
        ),
        NetPayload(
            time=T0 + 3.2,
            pid=pid,
            comm=comm,
            fd=10,
            seq=1,
            protocol="cryptonote",
            detail={
                "method": "login",
                "agent": "XMRig/6.20.0 (Linux x86_64) libuv/1.44.2 gcc/11.4.0",
                "login": XMR_WALLET,
            },
            data=b'{"id":1,"jsonrpc":"2.0","method":"login"',
        ),
        *steady_ioctls(pid, comm, 10, 10, DURATION_S, 0, 4),
        *snapshots({pid: flat_series(4, 96.5, 0.9, int(2.2 * GIB), STEPS)}),
    ]
    return items


# -- benign workloads ----------------------------------------------------------------


def benign_pytorch_training() -> list:
    main, flat_rank = 7100, 7101
    py = "/usr/bin/python3.11"
    cmd = [
        "python3",
        "train.py",
        "--config",
        "configs/resnet50.yaml",
        "--epochs",
        "90",
        "--batch-size",
        "256",
    ]
    workers = [7110 + i for i in range(4)]
    items = [
        facts(
            900,
            "bash",
            "/usr/bin/bash",
            ["-bash"],
            start=-3600,
            ppid=800,
            ancestors=[SSHD, SYSTEMD],
            user="alice",
            uid=1001,
        ),
        facts(
            main,
            "python3",
            py,
            cmd,
            user="alice",
            uid=1001,
            cwd="/home/alice/resnet",
            config_files={
                "configs/resnet50.yaml": "model: resnet50\nlr: 0.1\nepochs: 90\ndata: /datasets/imagenet\n"
            },
        ),
        facts(
            flat_rank,
            "python3",
            py,
            ["python3", "-m", "torch.distributed.run", "--nproc-per-node=1", "pretrain_llm.py"],
            user="alice",
            uid=1001,
            cwd="/home/alice/llm",
        ),
        *cuda_start(main, "python3", 5.0, gpus=1),
        *cuda_start(flat_rank, "python3", 5.0, gpus=1),
        Connect(
            time=T0 + 4,
            pid=main,
            comm="python3",
            family="ipv4",
            address="18.239.50.10",
            port=443,
            fd=20,
        ),
        NetPayload(
            time=T0 + 4.1,
            pid=main,
            comm="python3",
            fd=20,
            protocol="tls",
            detail={"sni": "huggingface.co"},
        ),
        Connect(
            time=T0 + 6,
            pid=flat_rank,
            comm="python3",
            family="ipv4",
            address="10.0.3.17",
            port=29500,
            fd=21,
        ),
        *steady_ioctls(main, "python3", 10, 10, DURATION_S, 40, 30),
        *steady_ioctls(flat_rank, "python3", 10, 10, DURATION_S, 10, 8),
        # A dense LLM rank really is flat near 99 % (the published 20 % false positives): alone it must stay clean.
        *snapshots(
            {
                main: training_series(5, STEPS),
                flat_rank: flat_series(6, 98.5, 0.6, int(78 * GIB), STEPS),
            }
        ),
    ]
    for i, worker in enumerate(workers):
        items.append(
            facts(
                worker,
                "pt_data_worker",
                py,
                cmd,
                start=6 + i * 0.01,
                ppid=main,
                user="alice",
                uid=1001,
                cwd="/home/alice/resnet",
                ancestors=[
                    Ancestor(main, "python3", py),
                    Ancestor(900, "bash", "/usr/bin/bash"),
                    SSHD,
                    SYSTEMD,
                ],
                cpu_percent=99.0,
            )
        )
    return items


def benign_inference_server() -> list:
    pid = 8800
    exe = "/opt/tritonserver/bin/tritonserver"
    cmd = [
        exe,
        "--model-repository=/models",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
    ]
    items = [
        facts(
            pid,
            "tritonserver",
            exe,
            cmd,
            ppid=8790,
            user="triton-server",
            uid=1000,
            cwd="/opt/tritonserver",
            ancestors=[
                Ancestor(8790, "tini", "/usr/bin/tini"),
                Ancestor(8700, "containerd-shim", "/usr/bin/containerd-shim-runc-v2"),
                SYSTEMD,
            ],
            cgroup="/kubepods.slice/kubepods-pod1234.slice/cri-containerd-" + "ab" * 32 + ".scope",
            container_runtime="containerd",
            container_id="ab" * 32,
            ld_preload="/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        ),
        *cuda_start(pid, "tritonserver", 1.0, gpus=1),
        Connect(
            time=T0 + 2,
            pid=pid,
            comm="tritonserver",
            family="ipv4",
            address="10.96.0.10",
            port=6379,
            fd=30,
        ),
        Connect(
            time=T0 + 2.5,
            pid=pid,
            comm="tritonserver",
            family="ipv4",
            address="10.0.0.42",
            port=9091,
            fd=31,
        ),
        *steady_ioctls(pid, "tritonserver", 10, 10, DURATION_S, 6, 20),
        *snapshots({pid: inference_series(7, STEPS)}),
    ]
    return items


def monitoring_agents() -> list:
    smi, exporter = 9100, 9200
    items = [
        facts(
            smi,
            "nvidia-smi",
            "/usr/bin/nvidia-smi",
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv", "-l", "5"],
            user="root",
            uid=0,
            ppid=1,
            ancestors=[SYSTEMD],
            cgroup="/system.slice/gpu-log.service",
        ),
        facts(
            exporter,
            "dcgm-exporter",
            "/usr/bin/dcgm-exporter",
            ["/usr/bin/dcgm-exporter", "-f", "/etc/dcgm-exporter/default-counters.csv"],
            user="root",
            uid=0,
            ppid=9190,
            ancestors=[
                Ancestor(9190, "containerd-shim", "/usr/bin/containerd-shim-runc-v2"),
                SYSTEMD,
            ],
            cgroup="/kubepods.slice/kubepods-besteffort.slice/cri-containerd-"
            + "cd" * 32
            + ".scope",
            container_runtime="containerd",
            container_id="cd" * 32,
        ),
    ]
    for pid, comm in ((smi, "nvidia-smi"), (exporter, "dcgm-exporter")):
        items += [
            GpuOpen(
                time=T0 + 1,
                pid=pid,
                comm=comm,
                path="/dev/nvidiactl",
                device_class="nvidia-ctl",
                fd=3,
                flags=0o2,
            ),
            GpuOpen(
                time=T0 + 1.01,
                pid=pid,
                comm=comm,
                path="/dev/nvidia0",
                device_class="nvidia",
                fd=4,
                flags=0o2,
            ),
            GpuIoctl(
                time=T0 + 1.5,
                pid=pid,
                comm=comm,
                device_class="nvidia-ctl",
                command=NV_CHECK_VERSION_STR,
                count=1,
            ),
            GpuIoctl(
                time=T0 + 1.5,
                pid=pid,
                comm=comm,
                device_class="nvidia-ctl",
                command=NV_CARD_INFO,
                count=1,
            ),
        ]
        t = 5.0
        while t < DURATION_S:
            items.append(
                GpuIoctl(
                    time=T0 + t,
                    pid=pid,
                    comm=comm,
                    device_class="nvidia-ctl",
                    command=NV_RM_CONTROL,
                    count=48,
                )
            )
            items.append(
                GpuIoctl(
                    time=T0 + t,
                    pid=pid,
                    comm=comm,
                    device_class="nvidia",
                    command=NV_RM_CONTROL,
                    count=12,
                )
            )
            t += 5
    return items


def cuda_compile_nvcc() -> list:
    nvcc, cicc, ptxas, app = 9500, 9501, 9502, 9510
    cuda = "/usr/local/cuda-12.4/bin"
    nvcc_cmd = ["nvcc", "-O3", "-arch=sm_90", "-o", "saxpy", "saxpy.cu"]
    nvcc_anc = [
        Ancestor(nvcc, "nvcc", f"{cuda}/nvcc"),
        Ancestor(9490, "make", "/usr/bin/make"),
        BASH,
        SSHD,
        SYSTEMD,
    ]
    items = [
        facts(
            nvcc,
            "nvcc",
            f"{cuda}/nvcc",
            nvcc_cmd,
            ppid=9490,
            cwd="/home/bob/saxpy",
            ancestors=[Ancestor(9490, "make", "/usr/bin/make"), BASH, SSHD, SYSTEMD],
            cpu_percent=12.0,
        ),
        facts(
            cicc,
            "cicc",
            "/usr/local/cuda-12.4/nvvm/bin/cicc",
            [
                "cicc",
                "--c++17",
                "-arch",
                "compute_90",
                "-o",
                "/tmp/tmpxft_0000251d_00000000-6_saxpy.ptx",
            ],
            start=0.5,
            ppid=nvcc,
            ancestors=nvcc_anc,
            cwd="/home/bob/saxpy",
            cpu_percent=100.0,
        ),
        facts(
            ptxas,
            "ptxas",
            f"{cuda}/ptxas",
            [
                "ptxas",
                "-arch=sm_90",
                "-m64",
                "/tmp/tmpxft_0000251d_00000000-6_saxpy.ptx",
                "-o",
                "/tmp/tmpxft_0000251d_00000000-8_saxpy.sm_90.cubin",
            ],
            start=2.0,
            ppid=nvcc,
            ancestors=nvcc_anc,
            cwd="/home/bob/saxpy",
            cpu_percent=100.0,
        ),
        facts(
            app,
            "saxpy",
            "/home/bob/saxpy/saxpy",
            ["./saxpy", "--n", "1000000000"],
            start=8.0,
            cwd="/home/bob/saxpy",
        ),
        Exec(
            time=T0 + 8,
            pid=app,
            comm="saxpy",
            filename="/home/bob/saxpy/saxpy",
            ppid=900,
            cmdline=["./saxpy", "--n", "1000000000"],
        ),
        *cuda_start(app, "saxpy", 8.2),
        *snapshots({app: [(99.0, int(12 * GIB))] * 3 + [(0.0, int(12 * GIB))]}, start=10.0),
    ]
    return items


def idle_gpu_holder() -> list:
    pid = 9900
    py = "/opt/conda/bin/python3.10"
    items = [
        facts(
            pid,
            "python",
            py,
            [
                py,
                "-m",
                "ipykernel_launcher",
                "-f",
                "/home/carol/.local/share/jupyter/runtime/kernel-4f1c.json",
            ],
            ppid=9800,
            user="carol",
            uid=1003,
            cwd="/home/carol/notebooks",
            ancestors=[Ancestor(9800, "jupyter-lab", "/opt/conda/bin/python3.10"), SYSTEMD],
        ),
        *cuda_start(pid, "python", 30.0),
        *snapshots({pid: [(0.0, int(10.5 * GIB))] * STEPS}),
    ]
    return items


# -- CPU miners with no strings, and the huge-page users that must stay clean ---------

MIB = 1 << 20
RANDOMX_DATASET = 2181038080  # 2 GiB + 32 MiB
MAP_PRIVATE_ANON_HUGETLB = 0x22 | 0x40000
MAP_SHARED_ANON_HUGETLB = 0x21 | 0x40000
MAP_HUGE_1GB = 30 << 26


def cpu_miner_stringless() -> list:
    """XMRig as root, rebuilt with no strings, renamed, behind TLS on 443: it loads msr with writes
    allowed (through sh -c), writes MSRs, reserves 1 GiB pages, maps its dataset in them and its
    cache in 2 MiB pages, and holds all four cores for ten minutes on one session."""
    pid, comm, exe = 7310, "node-agent", "/opt/node-agent/node-agent"
    root = dict(
        user="root",
        uid=0,
        cwd="/opt/node-agent",
        ppid=1,
        ancestors=[SYSTEMD],
        cgroup="/system.slice/node-agent.service",
    )
    shell, modprobe = 7311, 7312
    modprobe_cmd = ["/sbin/modprobe", "msr", "allow_writes=on"]
    items = [
        facts(
            pid,
            comm,
            exe,
            [exe],
            cpu_percent=396.0,
            num_threads=5,
            hugetlb_bytes=RANDOMX_DATASET + 256 * MIB,
            hugetlb_page_size=GIB,
            **root,
        ),
        facts(
            shell,
            "sh",
            "/usr/bin/dash",
            ["sh", "-c", "/sbin/modprobe msr allow_writes=on > /dev/null 2>&1"],
            start=0.4,
            ppid=pid,
            ancestors=[Ancestor(pid, comm, exe), SYSTEMD],
            user="root",
            uid=0,
        ),
        facts(
            modprobe,
            "modprobe",
            "/usr/bin/kmod",
            modprobe_cmd,
            start=0.5,
            ppid=shell,
            ancestors=[Ancestor(shell, "sh", "/usr/bin/dash"), Ancestor(pid, comm, exe), SYSTEMD],
            user="root",
            uid=0,
        ),
        Exec(
            time=T0 + 0.5,
            pid=modprobe,
            comm="modprobe",
            filename="/sbin/modprobe",
            ppid=shell,
            cmdline=modprobe_cmd,
        ),
        Exit(time=T0 + 0.6, pid=modprobe, comm="modprobe", exit_code=0),
        Exit(time=T0 + 0.6, pid=shell, comm="sh", exit_code=0),
        *[
            GpuOpen(
                time=T0 + 0.7 + cpu / 100,
                pid=pid,
                comm=comm,
                path=f"/dev/cpu/{cpu}/msr",
                device_class="msr",
                fd=5 + cpu,
                flags=0o2,
            )
            for cpu in range(4)
        ],
        GpuOpen(
            time=T0 + 0.8,
            pid=pid,
            comm=comm,
            path="/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            device_class="hugepages-config",
            fd=9,
            flags=0o1,
        ),
        HugeAlloc(
            time=T0 + 1.0,
            pid=pid,
            comm=comm,
            source="mmap",
            length=RANDOMX_DATASET,
            page_size=GIB,
            flags=MAP_PRIVATE_ANON_HUGETLB | MAP_HUGE_1GB,
        ),
        HugeAlloc(
            time=T0 + 1.1,
            pid=pid,
            comm=comm,
            source="mmap",
            length=256 * MIB,
            page_size=2 * MIB,
            flags=MAP_PRIVATE_ANON_HUGETLB,
        ),
        Connect(
            time=T0 + 2,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="198.51.100.23",
            port=443,
            fd=12,
            result=-115,
        ),
        ConnActivity(
            time=T0 + DURATION_S,
            pid=pid,
            comm=comm,
            fd=12,
            age_s=DURATION_S - 2,
            bytes_out=9200,
            writes_out=41,
            small_writes=40,
            small_write_times=[T0 + DURATION_S - 15.0 * i for i in range(8, 0, -1)],
            idle_s=3.0,
        ),
        *cpu_looks(pid, comm, threads=5, spinning=4, ran_share=0.98, fpu="randomx"),
    ]
    return items


# How each kind of program's looks spread over the rounding modes (nearest, down, up, toward
# zero) and how a thread's next look follows its last: RandomX as miners run it (the mode is
# reset to nearest per hash: nearest ~30 %), independent looks; interval arithmetic switching
# down/up/back around each operation faster than the probe looks (toward zero never); set-once
# code holding down for long stretches; a test suite stepping through the four modes in order,
# a run of looks in each (tests/workloads/rounding_benign.c measures the real ones).
FPU_SHARES = {
    "randomx": (0.30, 0.2333, 0.2333, 0.2334),
    "interval": (0.5, 0.25, 0.25, 0.0),
    "set-once": (0.2, 0.8, 0.0, 0.0),
    "stepping": (0.25, 0.25, 0.25, 0.25),
}


def _next_mode(pattern: str, last: int, shares: tuple[float, ...]) -> list[float]:
    if pattern in ("randomx", "interval"):
        return list(shares)  # independent of the last look
    if pattern == "set-once":
        return [0.98, 0.02, 0, 0] if last == 0 else [0.005, 0.995, 0, 0]
    return [0.85 if m == last else 0.15 if m == (last + 1) % 4 else 0.0 for m in range(4)]


def fpu_totals(pattern: str, looks: int, threads: int = 1, sleeps: int = 0) -> dict:
    """CpuActivity's FPU fields after ``looks`` looks of ``threads`` threads in ``pattern``."""
    shares = FPU_SHARES[pattern]
    modes = [int(looks * share) for share in shares]
    modes[0] += looks - sum(modes)
    pairs = looks - threads
    transitions = [
        int(pairs * shares[a] * p) for a in range(4) for p in _next_mode(pattern, a, shares)
    ]
    transitions[0] += pairs - sum(transitions)
    same = sum(transitions[i * 5] for i in range(4))
    return {
        "fpu_samples": looks,
        "fpu_round_nondefault": looks - modes[0],
        "fpu_round_changes": pairs - same + threads,
        "fpu_modes": modes,
        "fpu_transitions": transitions,
        "fpu_sleeps": sleeps,
        "fpu_threads": threads,
        "fpu_sleepless_threads": threads if looks >= 32 * threads and sleeps <= looks // 20 else 0,
    }


def cpu_looks(
    pid: int,
    comm: str,
    *,
    threads: int,
    spinning: int,
    ran_share: float | None,
    fpu: str | None = "",
    looks_per_s: float = 40.0,
    start: float = 0.0,
    every_s: float = 10.0,
) -> list:
    """The agent's CpuActivity look every housekeeping period (10 s) from ``start`` on:
    ``spinning`` threads runnable over their whole life; ``fpu`` the rounding-mode pattern of
    :data:`FPU_SHARES` the FPU probe counts, ``looks_per_s`` looks a second (None: the probe is
    not loaded, "": never left nearest)."""
    looks = []
    t = start + every_s
    while t <= DURATION_S:
        age = t - start
        if fpu is None:
            counted = {}
        elif fpu:
            counted = fpu_totals(fpu, int(age * looks_per_s), threads=max(spinning, 1))
            counted["fpu_span_s"] = round(age - 1, 1)
        else:
            counted = {"fpu_samples": 0, "fpu_round_nondefault": 0, "fpu_round_changes": 0}
        looks.append(
            CpuActivity(
                time=T0 + t,
                pid=pid,
                comm=comm,
                threads=threads,
                spinning_threads=spinning,
                spin_span_s=round(age, 1) if spinning else 0.0,
                runnable_max=0.99 if spinning else 0.05,
                ran_share=ran_share if spinning else None,
                **counted,
            )
        )
        t += every_s
    return looks


def quiet_session(
    pid: int,
    comm: str,
    *,
    fd: int,
    remote: str,
    watched_from: float,
    every_s: float = 10.0,
    push_every_s: float | None = 40.0,
) -> list:
    """Activity records of a watched TLS connection carrying small records both ways at random
    moments: ~1 write per 20 s out, each answered by one small segment in, and, with
    ``push_every_s``, a job the peer pushes unprompted now and then (a pool; None: a
    request/reply client).  The stack's segment counts include the TLS 1.3 handshake: 2 out,
    4 in (the server's flight and two session tickets, as measured on loopback)."""
    rng = random.Random(pid)
    records, t, writes, times, pushes = [], watched_from, 0, [], 0
    while t + every_s <= DURATION_S:
        t += every_s
        if rng.random() < every_s / 20.0:
            writes += 1
            times = (times + [T0 + t - rng.uniform(0, every_s)])[-8:]
        if push_every_s and rng.random() < every_s / push_every_s:
            pushes += 1
        records.append(
            ConnActivity(
                time=T0 + t,
                pid=pid,
                comm=comm,
                fd=fd,
                age_s=round(t - watched_from, 1),
                bytes_out=writes * 129,
                writes_out=writes,
                small_writes=writes,
                small_write_times=list(times),
                idle_s=round(T0 + t - times[-1], 1) if times else t - watched_from,
                seeded=True,
                remote=remote,
                bytes_in=1850 + writes * 60 + pushes * 230,
                data_segs_in=4 + writes + pushes,
                data_segs_out=2 + writes,
            )
        )
    return records


def client_hello(pid: int, comm: str, fd: int, at: float, ja4: str, sni: str | None = None):
    """The recognised ClientHello of a TLS client (detail as events.payload.tls gives it)."""
    detail = {"version": "TLS 1.3", "ja4": ja4} | ({"sni": sni} if sni else {})
    return NetPayload(
        time=T0 + at,
        pid=pid,
        comm=comm,
        fd=fd,
        protocol="tls",
        detail=detail,
        data=b"\x16\x03\x01\x02\x00\x01",
        truncated=True,
    )


# JA4 of real clients' hellos, measured on loopback (tests/test_tls_ja4.py): OpenSSL 3's
# default client without SNI or ALPN (the stand-in, `openssl s_client -noservername`), and
# Python 3.11's ssl module on OpenSSL 3.0 without SNI or ALPN.
JA4_OPENSSL = "t13i310900_e8f1e7e78f70_1f22a2ca17c4"
JA4_PYTHON = "t13i181000_85036bcba153_d41ae481755e"


def randomx_throttled_tls() -> list:
    """A string-scrubbed RandomX miner under an ordinary name and path, empty command line,
    config deleted, no huge pages, one worker at nice 19 on a host two other programs keep busy:
    it runs 3 % of the time yet is runnable always; TLS without SNI to an IP on 443, the pool
    pushing a job now and then.  Found only by what RandomX cannot drop: rounding-mode switching
    in a thread that never sleeps, with a network session."""
    pid, comm, exe = 7410, "nodestatd", "/opt/nodestat/nodestatd"
    return [
        facts(pid, comm, exe, [""], cpu_percent=3.0, num_threads=2, hugetlb_bytes=0),
        Connect(
            time=T0 + 1,
            pid=pid,
            comm=comm,
            family="ipv4",
            address="203.0.113.40",
            port=443,
            fd=3,
            result=-115,
        ),
        # TLS by address: no SNI, no ALPN
        client_hello(pid, comm, 3, 1.2, JA4_OPENSSL),
        *cpu_looks(
            pid, comm, threads=2, spinning=1, ran_share=0.03, fpu="randomx", looks_per_s=3.0
        ),
        # watched from its first suspicious score on (~40 s): shares at random moments, jobs
        # pushed every 10-120 s, a few bytes a second each way
        *quiet_session(pid, comm, fd=3, remote="203.0.113.40:443", watched_from=40.0),
        # the same program where huge pages are reserved: its 256 MiB cache in 2 MiB pages
        facts(
            pid + 1,
            comm,
            exe,
            [""],
            start=5.0,
            cpu_percent=150.0,
            num_threads=3,
            hugetlb_bytes=256 * MIB,
            hugetlb_page_size=2 * MIB,
        ),
        HugeAlloc(
            time=T0 + 5.1,
            pid=pid + 1,
            comm=comm,
            source="mmap",
            length=256 * MIB,
            page_size=2 * MIB,
            flags=MAP_PRIVATE_ANON_HUGETLB,
        ),
        Connect(
            time=T0 + 6,
            pid=pid + 1,
            comm=comm,
            family="ipv4",
            address="203.0.113.40",
            port=8443,
            fd=3,
            result=-115,
        ),
        *cpu_looks(pid + 1, comm, threads=3, spinning=2, ran_share=0.7, fpu="randomx", start=5.0),
    ]


def benign_rounding_and_busy() -> list:
    """Floating-point and busy programs that must stay clean: an interval-arithmetic solver
    (CGAL-like: switches rounding modes all the time, spins, talks to no one); numpy training
    a model on two threads with a connection to its data store; a compiler (cc1) spinning;
    openssl speed; a spinning DPDK-like poller with a control connection.  And rounding-mode
    users that hold a session while a thread spins, each session as quiet as a pool's (the
    worst case: watched as if another rule had scored them): interval arithmetic working a job
    queue with a heartbeat every 30 s (request/reply), set-once code holding round-down for
    long computations, and a test suite stepping through the four modes in order with a
    connection to its test database."""
    cgal, numpy_job, cc1, openssl, poller = 7510, 7520, 7530, 7540, 7550
    interval_job, set_once, stepping = 7560, 7570, 7580
    rounding_sessions = []
    for pid, comm, pattern, port in (
        (interval_job, "bound_solver", "interval", 5672),
        (set_once, "lower_bounds", "set-once", 6379),
        (stepping, "fenv_tests", "stepping", 5432),
    ):
        rounding_sessions += [
            facts(pid, comm, f"/opt/numerics/bin/{comm}", [comm, "--jobs", "queue"]),
            Connect(
                time=T0 + 2,
                pid=pid,
                comm=comm,
                family="ipv4",
                address="10.0.7.4",
                port=port,
                fd=5,
                result=-115,
            ),
            *cpu_looks(pid, comm, threads=2, spinning=1, ran_share=0.95, fpu=pattern),
            *quiet_session(
                pid, comm, fd=5, remote=f"10.0.7.4:{port}", watched_from=3.0, push_every_s=None
            ),
        ]
    return rounding_sessions + [
        facts(cgal, "mesh_refine", "/usr/local/bin/mesh_refine", ["mesh_refine", "in.off"]),
        *cpu_looks(cgal, "mesh_refine", threads=1, spinning=1, ran_share=0.9, fpu="interval"),
        facts(numpy_job, "python3", "/usr/bin/python3.11", ["python3", "fit.py"]),
        Connect(
            time=T0 + 2,
            pid=numpy_job,
            comm="python3",
            family="ipv4",
            address="10.0.4.9",
            port=6379,
            fd=5,
            result=-115,
        ),
        *cpu_looks(numpy_job, "python3", threads=3, spinning=2, ran_share=0.6),
        facts(cc1, "cc1", "/usr/lib/gcc/x86_64-linux-gnu/12/cc1", ["cc1", "-O2", "big.c"]),
        *cpu_looks(cc1, "cc1", threads=1, spinning=1, ran_share=0.5),
        facts(openssl, "openssl", "/usr/bin/openssl", ["openssl", "speed"]),
        *cpu_looks(openssl, "openssl", threads=1, spinning=1, ran_share=0.5),
        facts(poller, "poller", "/usr/bin/poller", ["poller", "-l", "1"], user="root", uid=0),
        Connect(
            time=T0 + 3,
            pid=poller,
            comm="poller",
            family="ipv4",
            address="10.0.0.2",
            port=443,
            fd=7,
            result=-115,
        ),
        *cpu_looks(poller, "poller", threads=2, spinning=1, ran_share=1.0),
        # its control connection is as quiet as a pool session
        *quiet_session(
            poller, "poller", fd=7, remote="10.0.0.2:443", watched_from=3.0, push_every_s=None
        ),
    ]


def benign_cpu_jobs() -> list:
    """CPU-bound work that is not mining: an ETL job on two spinning threads reporting a
    heartbeat over TLS to its scheduler by IP, no SNI (request/reply: one answer per beat);
    ffmpeg encoding with libx264 on six threads, streaming RTMP out (megabits, not bytes); a
    long pytest run spinning one thread with a connection to its test database; make driving
    the compiler (cc1plus) for ten minutes."""
    etl, ffmpeg, pytest_run, cc1plus = 7610, 7620, 7630, 7640
    items = [
        facts(etl, "python3", "/usr/bin/python3.11", ["python3", "/opt/etl/run.py", "--shard=7"]),
        Connect(
            time=T0 + 1,
            pid=etl,
            comm="python3",
            family="ipv4",
            address="10.20.0.5",
            port=443,
            fd=6,
            result=-115,
        ),
        client_hello(etl, "python3", 6, 1.1, JA4_PYTHON),
        *cpu_looks(etl, "python3", threads=4, spinning=2, ran_share=0.95),
        *quiet_session(
            etl, "python3", fd=6, remote="10.20.0.5:443", watched_from=1.0, push_every_s=None
        ),
        facts(
            ffmpeg,
            "ffmpeg",
            "/usr/bin/ffmpeg",
            ["ffmpeg", "-re", "-i", "talk.mkv", "-c:v", "libx264", "-preset", "veryfast"]
            + ["-f", "flv", "rtmp://198.51.100.7/live/stream"],
            cpu_percent=180.0,
            num_threads=9,
        ),
        Connect(
            time=T0 + 2,
            pid=ffmpeg,
            comm="ffmpeg",
            family="ipv4",
            address="198.51.100.7",
            port=1935,
            fd=5,
            result=-115,
        ),
        *cpu_looks(ffmpeg, "ffmpeg", threads=9, spinning=6, ran_share=0.9),
    ]
    # 2.5 Mbit/s out for the stream, acknowledgements and control messages in
    for t in range(10, DURATION_S + 1, 10):
        items.append(
            ConnActivity(
                time=T0 + t,
                pid=ffmpeg,
                comm="ffmpeg",
                fd=5,
                age_s=float(t - 2),
                bytes_out=(t - 2) * 312_500,
                writes_out=(t - 2) * 60,
                small_writes=(t - 2) * 2,
                remote="198.51.100.7:1935",
                bytes_in=3073 + t * 4,
                data_segs_in=3 + t // 10,
                data_segs_out=(t - 2) * 220,
            )
        )
    items += [
        facts(
            pytest_run,
            "python3",
            "/usr/bin/python3.11",
            ["python3", "-m", "pytest", "-x", "tests/"],
            cwd="/home/bob/src/app",
        ),
        Connect(
            time=T0 + 3,
            pid=pytest_run,
            comm="python3",
            family="ipv4",
            address="127.0.0.1",
            port=5432,
            fd=9,
            result=-115,
        ),
        *cpu_looks(pytest_run, "python3", threads=1, spinning=1, ran_share=0.97),
        facts(
            cc1plus,
            "cc1plus",
            "/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus",
            ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus", "-quiet", "-O2", "big.cc"],
            ppid=7645,
        ),
        *cpu_looks(cc1plus, "cc1plus", threads=1, spinning=1, ran_share=0.5),
    ]
    return items


def benign_hugepage_users() -> list:
    """Huge pages in ordinary use: PostgreSQL's shared buffers in 2 MiB pages on a busy server that
    only accepts connections; a JVM with 1 GiB large pages talking to its database at modest load;
    DPDK testpmd polling its NIC at 100 % of a core in 1 GiB pages, with no TCP at all."""
    postgres, java, testpmd = 2100, 2200, 2300
    system = dict(ppid=1, ancestors=[SYSTEMD])
    items = [
        facts(
            postgres,
            "postgres",
            "/usr/lib/postgresql/15/bin/postgres",
            [
                "/usr/lib/postgresql/15/bin/postgres",
                "-D",
                "/var/lib/postgresql/15/main",
                "-c",
                "huge_pages=on",
            ],
            user="postgres",
            uid=106,
            cwd="/var/lib/postgresql/15/main",
            cgroup="/system.slice/postgresql@15-main.service",
            cpu_percent=97.0,
            hugetlb_bytes=8 * GIB + 140 * MIB,
            hugetlb_page_size=2 * MIB,
            **system,
        ),
        HugeAlloc(
            time=T0 + 0.3,
            pid=postgres,
            comm="postgres",
            source="mmap",
            length=8 * GIB + 140 * MIB,
            page_size=2 * MIB,
            flags=MAP_SHARED_ANON_HUGETLB,
        ),
        facts(
            java,
            "java",
            "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
            [
                "java",
                "-XX:+UseLargePages",
                "-XX:LargePageSizeInBytes=1g",
                "-Xmx16g",
                "-jar",
                "/srv/orders/app.jar",
            ],
            user="orders",
            uid=1003,
            cwd="/srv/orders",
            cgroup="/system.slice/orders.service",
            cpu_percent=35.0,
            hugetlb_bytes=16 * GIB,
            hugetlb_page_size=GIB,
            **system,
        ),
        HugeAlloc(
            time=T0 + 1.0,
            pid=java,
            comm="java",
            source="mmap",
            length=16 * GIB,
            page_size=GIB,
            flags=MAP_PRIVATE_ANON_HUGETLB | MAP_HUGE_1GB,
        ),
        Connect(
            time=T0 + 5,
            pid=java,
            comm="java",
            family="ipv4",
            address="10.0.3.7",
            port=5432,
            fd=40,
            result=-115,
        ),
        facts(
            testpmd,
            "dpdk-testpmd",
            "/usr/bin/dpdk-testpmd",
            ["dpdk-testpmd", "-l", "2-3", "-n", "4", "--", "-i", "--forward-mode=io"],
            user="root",
            uid=0,
            cwd="/root",
            cgroup="/user.slice/user-0.slice/session-1.scope",
            cpu_percent=100.0,
            hugetlb_bytes=2 * GIB,
            hugetlb_page_size=GIB,
            ppid=900,
            ancestors=[BASH, SSHD, SYSTEMD],
        ),
        Connect(
            time=T0 + DURATION_S,
            pid=java,
            comm="java",
            family="ipv4",
            address="10.0.3.7",
            port=5432,
            fd=41,
            result=-115,
        ),
        *cpu_looks(postgres, "postgres", threads=1, spinning=0, ran_share=None),
        *cpu_looks(java, "java", threads=40, spinning=0, ran_share=None),
        *cpu_looks(testpmd, "dpdk-testpmd", threads=3, spinning=2, ran_share=1.0),
    ]
    return items


CASES = {
    "miner_stratum_cmdline": (
        "xmrig with a stratum URL, wallet and miner flags on its command line",
        miner_stratum_cmdline,
    ),
    "renamed_miner_shm": (
        "miner renamed kworker/0:2, deleted binary in /dev/shm, pool port, flat GPU",
        renamed_miner_shm,
    ),
    "miner_config_file": (
        "xmrig renamed systemd-helper; pool hidden in config.json beside it; TLS to the pool",
        miner_config_file,
    ),
    "miner_socks5_proxy": (
        "miner behind a local SOCKS5 proxy: SOCKS target pool, cryptonote login, flat GPU",
        miner_socks5_proxy,
    ),
    "benign_pytorch_training": (
        "PyTorch training: periodic utilisation, data-loader workers; one dense flat LLM rank",
        benign_pytorch_training,
    ),
    "benign_inference_server": (
        "Triton inference server in a pod: idle with bursts, jemalloc LD_PRELOAD",
        benign_inference_server,
    ),
    "monitoring_agents": (
        "nvidia-smi and dcgm-exporter: nvidiactl + nvidia0, query ioctls only",
        monitoring_agents,
    ),
    "cuda_compile_nvcc": (
        "nvcc compiling a kernel (cicc, ptxas) and a short test run",
        cuda_compile_nvcc,
    ),
    "idle_gpu_holder": ("Jupyter kernel holding GPU memory at 0 % utilisation", idle_gpu_holder),
    "cpu_miner_stringless": (
        "stringless XMRig as root behind TLS: modprobe msr allow_writes=on, MSR writes, "
        "1 GiB-page dataset, 2 MiB-page cache, four cores for ten minutes",
        cpu_miner_stringless,
    ),
    "benign_hugepage_users": (
        "PostgreSQL (2 MiB pages, busy, accepts only), a JVM with 1 GiB large pages, "
        "DPDK testpmd polling in 1 GiB pages",
        benign_hugepage_users,
    ),
    "randomx_throttled_tls": (
        "string-scrubbed RandomX miner, nice 19, one thread, busy host, no huge pages, "
        "TLS without SNI to an IP on 443: rounding-mode switching in a never-sleeping thread; "
        "the same with its 256 MiB cache in huge pages",
        randomx_throttled_tls,
    ),
    "benign_cpu_jobs": (
        "an ETL job with a TLS heartbeat by IP, ffmpeg/libx264 streaming RTMP, a long pytest "
        "run and the compiler: spinning threads, none with a pool's session",
        benign_cpu_jobs,
    ),
    "benign_rounding_and_busy": (
        "interval arithmetic switching rounding modes, numpy, cc1, openssl speed and a poller: "
        "busy or rounding, never both with a network session",
        benign_rounding_and_busy,
    ),
}


def main() -> int:
    for name, (description, build) in CASES.items():
        path = write_case(name, description, build())
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
