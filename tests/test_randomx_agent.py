"""The agent flags a string-free RandomX stand-in in every disguise within 120 s; floating-point
and busy look-alikes beside it stay clean.

One agent run (eBPF sensor, FPU probe) watches, at once, on this two-core host kept busy by
two CPU hogs: the stand-in over plain TCP, over TLS (no SNI) and throttled (nice 19, one
thread), each under an ordinary name in /opt with nothing but its path on its command line
(settings on stdin); beside them numpy, `openssl speed` and a compiler.  No huge pages
are reserved here, so the stand-ins say so and use ordinary pages: what convicts them is
RandomX's rounding-mode pattern in threads that never sleep, with a session
(tests/support/randomx.py).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.agent_run import finding_for, running_agent
from tests.support.load import start_in_load_group
from tests.support.randomx import INSTALL_DIR, LoopbackPool, cpu_hog, start_standin, stop

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 120.0

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]


def _python_with_numpy() -> str | None:
    """An interpreter on this machine that has numpy (the test venv need not)."""
    for candidate in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import numpy"]).returncode == 0:
            return candidate
    return None


def _benign_workloads(workdir: Path) -> dict[str, subprocess.Popen]:
    source = workdir / "big.c"
    source.write_text(
        "".join(f"double f{i}(double x) {{ return x * {i}.5 + f{i - 1}(x / 3); }}\n" for i in [0])
        .replace("f-1(x / 3)", "0")
        .replace("f0(x / 3)", "0")
        + "".join(
            f"double f{i}(double x) {{ double s = 0; for (int k = 0; k < {i}; k++) "
            f"s += f{i - 1}(x + k) / (k + 1); return s; }}\n"
            for i in range(1, 400)
        )
    )
    numpy_loop = (
        "import numpy as np, time\n"
        "end = time.time() + 600\n"
        "while time.time() < end: np.linalg.svd(np.random.rand(150, 150))\n"
    )
    out = {}
    numpy_python = _python_with_numpy()
    if numpy_python is not None:
        out["numpy"] = start_in_load_group([numpy_python, "-c", numpy_loop])
    return out | {
        "openssl": start_in_load_group(
            ["openssl", "speed", "-seconds", "100", "sha256", "aes-128-cbc", "rsa2048"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        "compiler": start_in_load_group(
            [
                "sh",
                "-c",
                'end=$(($(date +%s)+150)); while [ "$(date +%s)" -lt "$end" ]; do '
                f"gcc -O2 -c -o /dev/null {source}; done",
            ]
        ),
    }


def test_randomx_standin_is_flagged_in_every_disguise_and_benign_work_stays_clean():
    if shutil.which("openssl") is None or shutil.which("gcc") is None:
        pytest.fail("openssl and gcc are part of this machine's image (platform.md)")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="gg-randomx-") as tmp:
        workdir = Path(tmp)
        plain_pool = LoopbackPool(workdir, tls=False, push_s=(10, 40))
        tls_pool = LoopbackPool(workdir, tls=True, push_s=(10, 40))
        try:
            with running_agent(workdir, "--sensor", "ebpf") as agent:
                status = agent.status()
                assert not any("rounding-mode" in b for b in status.get("blind_spots", [])), status
                procs += [cpu_hog(400), cpu_hog(400)]  # the busy host
                benign = _benign_workloads(workdir)
                procs += list(benign.values())
                started = time.time()
                # The stand-ins at an ordinary task's weight: this test times how soon the agent
                # sees what they do, and in the load group, beside its own hogs and benign work,
                # a busy host would leave them a few percent of a core (the run beside two busy
                # loops started them 90 s late).  The hogs and benign work stay there.
                standin = functools.partial(start_standin, submit_s=15, low_weight=False)
                standins = {
                    "plain": standin(plain_pool, "nodestatd"),
                    "tls": standin(tls_pool, "metricsd"),
                    "throttled": standin(tls_pool, "syncagent", nice=19, threads=1),
                }
                procs += list(standins.values())
                found = {}
                for variant, proc in standins.items():
                    left = max(1.0, DEADLINE_S - (time.time() - started))
                    # RandomX's rounding-mode pattern (all four modes, even shares, independent
                    # looks) is what convicts, not mere switching.  A finding can come before
                    # it: the 256 MiB huge-page request, a thread that never sleeps and the
                    # session are suspicious on their own, and the throttled one, at nice 19
                    # beside the hogs, may take longer to show enough looks.  The pattern must
                    # be in a finding about it by the deadline.
                    found[variant] = agent.wait_record(
                        lambda r, pid=proc.pid: (
                            finding_for(pid)(r)
                            and "cpu-fpu-rounding-random" in r["gpuguard"]["rule_ids"]
                        ),
                        timeout=left,
                    )
                    print(f"{variant}: pattern after {time.time() - started:.0f} s", found[variant])
                    assert found[variant]["gpuguard"]["verdict"] == "malicious", found[variant]
                    findings = [r for r in agent.records() if finding_for(proc.pid)(r)]
                    for finding in findings:
                        assert finding["gpuguard"]["verdict"] in ("suspicious", "malicious")
                        # the command line is the program's path alone, or blank if the agent
                        # read it after the stand-in wiped its argv: no clue there either way
                        process = finding["process"]
                        assert process.get("command_line", "").strip() in (
                            "",
                            process["executable"],
                        )
                        rules = set(finding["gpuguard"]["rule_ids"])
                        assert "yara-miner" not in rules and "net-pool-protocol" not in rules
                elapsed = time.time() - started
                records = agent.records()
                for name, proc in benign.items():
                    hits = [r for r in records if finding_for(proc.pid)(r)]
                    assert not hits, (name, hits)
        finally:
            for proc in procs:
                stop(proc)
            plain_pool.close()
            tls_pool.close()
            shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    assert elapsed <= DEADLINE_S + 5
