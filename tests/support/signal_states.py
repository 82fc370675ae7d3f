"""Process states with what the golden cases lack, for tests that score every signal."""

from __future__ import annotations

from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.shipped import shipped_rules_file
from gpuguard.detect.scoring.score import score_process
from gpuguard.events.model import CpuActivity
from gpuguard.events.process_facts import Ancestor, ProcessFacts

T = 1_700_002_800.0  # the clock of these states (tests/test_signal_inputs.py's)


def built_states() -> list[ProcessState]:
    """States with what the golden cases lack: config files, payloads, recent ioctls, YARA."""
    miner = ProcessState(ProcessKey(9, T), first_seen=T, last_seen=T)
    miner.set_facts(
        ProcessFacts(
            pid=9,
            start_time=T,
            comm="kworker/0:1",
            exe="/memfd:x (deleted)",
            cmdline=["./x", "-o", "stratum+tcp://pool.supportxmr.com:3333", "-a", "rx/0"],
            uid=1000,
            username="bob",
            exe_deleted=True,
            environ_readable=True,
            ld_preload="/tmp/h.so",
            config_files={"config.json": '{"pools": [{"url": "gulf.moneroocean.stream:3333"}]}'},
            ancestors=[Ancestor(900, "bash", "/usr/bin/bash")],
        )
    )
    miner.add_connection("1.2.3.4", 3333)
    miner.add_payload(T, "tls", {"sni": "gulf.moneroocean.stream", "ja4": "t13i310900_e8f1"})
    miner.add_payload(T, "socks5", {"target_host": "pool.supportxmr.com", "target_port": 3333})
    miner.add_payload(T, "cryptonote", {"method": "login", "login": "4" + "A" * 94, "agent": "x"})
    miner.add_gpu_device("nvidia-uvm", "/dev/nvidia-uvm", written=True)
    for category, name in (
        ("submit", "UVM_REGISTER_CHANNEL"),
        ("query", "NV_ESC_RM_CONTROL"),
        ("memory", "UVM_MAP_EXTERNAL_ALLOCATION"),
        ("setup", "NV_ESC_CARD_INFO"),
        ("other", "NV_ESC_RM_FREE"),
    ):
        miner.add_ioctl(T, name, category, 40)
    for n in range(6):
        miner.add_gpu_sample(T - 60 + 10 * n, 99.0, 3 << 30)
    miner.gpu_memory_total = 16 << 30
    miner.add_huge_alloc(256 << 20, 2 << 20)
    miner.add_yara_result({"xmrig_strings"}, {"miner"})
    miner.cpu_activity = CpuActivity(
        time=T, pid=9, threads=4, spinning_threads=4, spin_span_s=30.0, runnable_max=1.0,
        ran_share=0.9, fpu_samples=100, fpu_round_nondefault=40, fpu_round_changes=30,
        fpu_span_s=20.0,
    )  # fmt: skip
    miner.exited_at = T + 5
    child = ProcessState(ProcessKey(10, T), first_seen=T, last_seen=T)
    child.parent_verdict = score_process(miner, load_ruleset([shipped_rules_file()]), T)
    return [miner, child, ProcessState(ProcessKey(11, T), first_seen=T, last_seen=T)]
