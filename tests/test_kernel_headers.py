"""The probes load on a node without kernel headers, and `gpuguard doctor` names what is missing."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from gpuguard.sources.ebpf import kernel_headers
from gpuguard.sources.ebpf.probe_cache import ENV as PROBE_CACHE_ENV
from tests.support.agent_run import AgentProcess
from tests.support.load import start_in_load_group
from tests.support.no_headers import (
    BROKEN_HOST_TREE,
    HIDE_FPU,
    HIDE_TRACEFS,
    own_runtime_dir,
    without_headers,
)
from tests.support.ports import free_port
from tests.support.processes import terminate
from tests.support.unprivileged import as_nobody

REPO = Path(__file__).resolve().parent.parent
GG = (sys.executable, "-m", "gpuguard")


def run(argv, timeout=120, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("cwd", REPO)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def trees(base: Path) -> list[str]:
    return sorted(p.name for p in base.glob("tree-*"))


@pytest.fixture(autouse=True)
def _compile_at_every_start(monkeypatch):
    """These tests are about compiling with each header source: no start here may take the
    probes from the run's probe cache (tests/test_probe_cache.py tests that)."""
    monkeypatch.setenv(PROBE_CACHE_ENV, "off")


# ---- the bundled set ------------------------------------------------------------


def test_the_bundled_set_is_what_its_manifest_pins():
    archive, manifest, why = kernel_headers.bundled_archive()
    assert archive is not None, why
    data = archive.read_bytes()
    assert hashlib.sha256(data).hexdigest() == manifest["tarball_sha256"]
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data))) as tar:
        got = {
            m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar if m.isfile()
        }
    assert got == manifest["files"]
    # What bcc reads first, and the probes' own includes.
    assert {
        kernel_headers.KCONFIG,
        "include/uapi/linux/bpf.h",
        "include/uapi/linux/ptrace.h",
    } <= set(got)
    assert set(manifest["packages"]) == {
        f"linux-headers-{manifest['abi']}-common",
        f"linux-headers-{manifest['abi']}-amd64",
    }


def test_a_tree_whose_process_is_gone_is_swept_and_a_live_ones_kept(tmp_path):
    dead, live = tmp_path / "tree-dead", tmp_path / "tree-live"
    for tree in (dead, live):
        (tree / "include").mkdir(parents=True)
        (tree / ".lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time\n"
            f"fd=os.open({str(live / '.lock')!r}, os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        kernel_headers._sweep_stale(tmp_path)
        assert not dead.exists() and live.is_dir()
    finally:
        terminate(holder)
    kernel_headers._sweep_stale(tmp_path)
    assert not live.exists()


def test_the_plan_puts_the_host_first_then_the_kernels_then_ours(tmp_path, monkeypatch):
    release = "9.9.9-test"
    build = tmp_path / release / "build"
    for rel in kernel_headers.NEEDED:
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text("")
    kheaders = tmp_path / "kheaders.tar.xz"
    kheaders.write_bytes(b"")
    monkeypatch.setattr(kernel_headers, "MODULES", tmp_path)
    monkeypatch.setattr(kernel_headers, "KHEADERS", kheaders)
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    assert [s.kind for s in kernel_headers.plan(release)] == ["host", "kheaders", "bundled"]
    (build / "include/uapi/linux/bpf.h").unlink()
    tree, why = kernel_headers.host_tree(release)
    assert tree is None and "lack include/uapi/linux/bpf.h" in why
    assert [s.kind for s in kernel_headers.plan(release)] == ["kheaders", "bundled"]
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(build))
    assert kernel_headers.plan(release)[0].kind == "env"


# ---- the probes load without the node's headers (real kernel) -------------------


@pytest.mark.root
@pytest.mark.self_contained
def test_the_agent_loads_every_probe_with_its_own_headers_and_selftest_passes_with_ebpf(tmp_path):
    runtime = tmp_path / "headers"
    runtime.mkdir()
    port = free_port()
    agent = AgentProcess(
        tmp_path,
        "--sensor",
        "ebpf",
        "--metrics-address",
        f"127.0.0.1:{port}",
        wrapper=without_headers(own_runtime_dir(str(runtime))),
    )
    try:
        doc = agent.wait_ready(timeout=120)
        assert doc["sensor"] == "ebpf", agent.stderr()
        assert doc["headers"]["source"] == "bundled", doc["headers"]
        assert "no kernel headers at /lib/modules/" in doc["headers"]["detail"]
        assert doc["blind_spots"] == [], doc["blind_spots"]  # the FPU probe loaded too
        assert doc["probes_attached"] >= 20
        start = agent.wait_record(lambda r: r.get("event", {}).get("action") == "start")
        assert "kernel headers: bundled" in start["message"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            info = [
                line
                for line in page.read().decode().splitlines()
                if line.startswith("gpuguard_agent_info{")
            ]
        assert len(info) == 1 and 'headers="bundled"' in info[0], info
        selftest = run([*GG, "selftest", "--state-file", str(agent.state), "--require-ebpf"])
        assert selftest.returncode == 0, selftest.stdout + selftest.stderr
        assert selftest.stdout.startswith("PASS: running agent"), selftest.stdout
        assert "sensor ebpf" in selftest.stdout
        assert len(trees(runtime)) == 1  # the agent's own, while it runs
    finally:
        assert agent.stop() == 0, agent.stderr()
    assert list(runtime.iterdir()) == []  # removed at stop


@pytest.mark.root
@pytest.mark.self_contained
def test_watch_loads_with_its_own_headers_and_leaves_nothing_behind(tmp_path):
    out = run([*without_headers(own_runtime_dir(str(tmp_path))), *GG, "watch", "--duration", "1"])
    assert out.returncode == 0, out.stderr
    assert "with bundled kernel headers" in out.stderr
    assert "Traceback" not in out.stderr
    assert trees(tmp_path) == []


@pytest.mark.root
@pytest.mark.self_contained
def test_a_host_tree_for_another_kernel_that_does_not_compile_falls_back_quietly():
    out = run([*without_headers(BROKEN_HOST_TREE), *GG, "watch", "--duration", "1"])
    assert out.returncode == 0, out.stderr
    assert "with bundled kernel headers" in out.stderr
    # clang's diagnostics about the broken tree stay out of the operator's way
    assert "error" not in out.stderr.lower(), out.stderr


@pytest.mark.root
@pytest.mark.self_contained
def test_the_kernels_own_kheaders_archive_is_used_when_there_is_no_host_tree(tmp_path):
    # The kernel's archive (CONFIG_IKHEADERS) lays its files under "./"; made here from ours.
    archive, _, _ = kernel_headers.bundled_archive()
    raw = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(archive.read_bytes()))) as src:
        with tarfile.open(fileobj=raw, mode="w") as out:
            for member in src:
                data = src.extractfile(member).read()
                member.name = f"./{member.name}"
                out.addfile(member, io.BytesIO(data))
    kheaders = tmp_path / "kheaders.tar.xz"
    kheaders.write_bytes(lzma.compress(raw.getvalue()))
    code = (
        "import gpuguard.sources.ebpf.kernel_headers as k, pathlib, sys\n"
        f"k.KHEADERS = pathlib.Path({str(kheaders)!r})\n"
        "k.bundled_archive = lambda: (None, {}, 'not offered in this test')\n"
        "from gpuguard.cli import main\n"
        "raise SystemExit(main(['watch', '--duration', '1']))\n"
    )
    out = run([*without_headers(), sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert "with kheaders kernel headers" in out.stderr


@pytest.mark.root
@pytest.mark.self_contained
def test_scan_watches_rounding_modes_with_its_own_headers():
    from gpuguard.sources.proc.cpu_usage import MIN_SPAN_S

    spinner = start_in_load_group([sys.executable, "-c", "while True: pass"])
    try:
        # old enough to be judged by its lifetime when the scan reads it (a scan with a warm
        # YARA cache takes well under a second on a quiet host)
        time.sleep(MIN_SPAN_S + 1.0)
        out = run(
            [*without_headers(), *GG, "scan", "--json", "--cpu-window", "1", "--gpu-window", "0.5"],
            timeout=180,
        )
        assert out.returncode in (0, 1), out.stderr  # 1: something on this host was flagged
        report = json.loads(out.stdout)
        options = report["scanner"]["options"]
        assert options["cpu_window_observed_s"] > 0, options  # the FPU probe loaded and watched
        could_not_see = report["summary"]["could_not_see"]
        assert not any("rounding" in line for line in could_not_see), could_not_see
    finally:
        terminate(spinner)


# ---- gpuguard doctor -------------------------------------------------------------


def doctor(*also: str, load: bool = False) -> tuple[int, dict]:
    argv = [*without_headers(*also), *GG, "doctor", "--json", *([] if load else ["--no-load"])]
    out = run(argv, timeout=180)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.root
@pytest.mark.self_contained
def test_doctor_is_green_without_host_headers_and_proves_it_by_loading_the_probes():
    code, report = doctor(load=True)
    checks = by_name(report)
    assert code == 0 and report["ready"], [c for c in report["checks"] if not c["ok"]]
    assert checks["kernel headers"]["ok"] and "bundled" in checks["kernel headers"]["detail"]
    assert checks["probes load"]["ok"], checks["probes load"]
    assert "with bundled kernel headers" in checks["probes load"]["detail"]


@pytest.mark.root
@pytest.mark.self_contained
def test_doctor_names_tracefs_and_every_tracepoint_when_tracefs_is_hidden():
    code, report = doctor(HIDE_TRACEFS, load=True)
    checks = by_name(report)
    assert code == 1 and not report["ready"]
    assert not checks["tracefs"]["ok"] and "mount -t tracefs" in checks["tracefs"]["fix"]
    tracepoints = [c for c in report["checks"] if c["name"].startswith("tracepoint ")]
    assert "tracepoint syscalls:sys_enter_openat" in checks
    assert tracepoints and not any(c["ok"] for c in tracepoints)
    assert not checks["probes load"]["ok"] and "not tried" in checks["probes load"]["detail"]


@pytest.mark.root
@pytest.mark.self_contained
def test_doctor_names_the_missing_x86_fpu_tracepoint_and_what_it_costs():
    code, report = doctor(HIDE_FPU)
    checks = by_name(report)
    fpu = checks["tracepoint x86_fpu:x86_fpu_regs_deactivated"]
    assert code == 1 and not report["ready"]
    assert not fpu["ok"] and "RandomX" in fpu["cost"]
    others = [c for c in report["checks"] if c["name"].startswith("tracepoint ") and c is not fpu]
    assert others and all(c["ok"] for c in others)
    assert checks["tracefs"]["ok"] and checks["kernel headers"]["ok"]


def test_doctor_text_has_one_line_per_check_with_a_mark():
    out = run([*GG, "doctor", "--no-load"])
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("gpuguard doctor: ")
    assert all(line[0] in "✔✗" for line in lines[:-1]), lines
    assert any("kernel headers" in line for line in lines)
    assert out.returncode in (0, 1)


@pytest.mark.root
@pytest.mark.self_contained
def test_the_response_programs_compile_with_its_own_headers():
    # kill-on-touch and the cgroup programs (quarantine, block-egress), pinned under a root of
    # the test's own on bpffs, then removed.
    code = (
        "import os, shutil\n"
        "from gpuguard.respond import bpf_pins\n"
        "from gpuguard.sources.ebpf.kernel_headers import HEADERS\n"
        "root = f'/sys/fs/bpf/gg-test-headers-{os.getpid()}'\n"
        "try:\n"
        "    bpf_pins.ensure_pin_root(root)  # mounts bpffs where the host has not\n"
        "    for name in ('respond_cgroup.bpf.c', 'respond_touch.bpf.c'):\n"
        "        bpf_pins.compile_program(name, bpf_pins.Path(root)).cleanup()\n"
        "    print(HEADERS.source.kind)\n"
        "finally:\n"
        "    shutil.rmtree(root, ignore_errors=True)\n"
    )
    out = run([*without_headers(), sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bundled"]


def test_a_read_only_runtime_dir_unpacks_under_the_temporary_dir(tmp_path, monkeypatch):
    # The runtime dir's parent is a file: it cannot be made (as on a read-only root).
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    headers = kernel_headers.Headers(runtime_dir=blocked / "headers")
    try:
        tree = headers._unpacked(kernel_headers.bundled_archive()[0], "bundled")
        assert tree.parent == tmp_path / "tmp" / "gpuguard-headers"
        assert (tree / kernel_headers.KCONFIG).is_file()
    finally:
        headers.close()
    assert not tree.exists() and not tree.parent.exists()  # its folder too: it held no other


def test_a_pass_in_reduced_mode_says_so_and_fails_when_ebpf_is_required():
    from gpuguard.commands.selftest import verdict
    from gpuguard.proving.selftest import SelftestResult

    full = SelftestResult(True, "found", sensor="ebpf")
    reduced = SelftestResult(True, "found", sensor="proc")
    assert verdict(full, require_ebpf=True) == "PASS"
    assert verdict(reduced, require_ebpf=False).startswith("PASS (reduced mode, sensor proc")
    assert verdict(reduced, require_ebpf=True).startswith("FAIL (eBPF required; reduced mode")
    assert verdict(SelftestResult(False, "not found", sensor="ebpf"), require_ebpf=False) == "FAIL"


@pytest.mark.root
@pytest.mark.self_contained
def test_doctor_as_a_user_without_capabilities_names_them_without_a_traceback():
    out = run(
        [*as_nobody(), *GG, "doctor", "--json"],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 1
    checks = by_name(json.loads(out.stdout))
    assert not checks["capabilities"]["ok"] and "CAP_BPF" in checks["capabilities"]["detail"]
    assert not checks["tracefs"]["ok"] and "CAP_DAC_READ_SEARCH" in checks["tracefs"]["fix"]
    assert not checks["probes load"]["ok"]
