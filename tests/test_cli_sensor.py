"""The sensor commands from the outside: watch, record, replay and their errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.cli import GPUGUARD, REPO, gpuguard, start_recorder
from tests.support.unprivileged import as_nobody
from tests.support.workloads import build_workload, run_with_gpu_nodes


def test_print_probes_shows_the_compiled_c_without_root():
    out = gpuguard("watch", "--print-probes", "--no-payload")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("/* bcc cflags: ")
    assert "-DGG_PAYLOAD_CAPTURE" not in out.stdout.splitlines()[0]
    assert "TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)" in out.stdout
    assert "struct gg_gpu_open {" in out.stdout  # the shared header is part of the text


@pytest.mark.root
@pytest.mark.self_contained
@pytest.mark.parametrize(
    "command",
    [["watch", "--duration", "1"], ["record", "--output", "/tmp/x.ggrec", "--duration", "1"]],
)
def test_sensor_commands_without_root_give_one_line_and_exit_2(command):
    out = gpuguard(*command, nobody=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert (
        "needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), and this process holds none of them"
        in out.stderr
    )
    assert "fix:" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr in (REPO / "README.md").read_text(), "README.md's example is not this line"


def _with_capabilities(*caps: str) -> list[str]:
    """nobody, holding ``caps`` (setpriv's names) in its effective set through exec."""
    held = ",".join(f"+{c}" for c in caps)
    return [*as_nobody(f"--inh-caps={held}", f"--ambient-caps={held}"), *GPUGUARD]


@pytest.mark.root
@pytest.mark.self_contained
def test_a_user_holding_the_capabilities_is_not_told_it_needs_root():
    """The check asks for the capabilities, not for uid 0: nobody with CAP_BPF, CAP_PERFMON and
    CAP_DAC_READ_SEARCH (tracefs is root's 0700) loads the probes; with the first two alone it is
    told, in one line, which one it lacks."""
    watch = ["watch", "--duration", "1"]
    run = lambda *caps: subprocess.run(  # noqa: E731 - one command, three capability sets
        _with_capabilities(*caps) + watch, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    full = run("bpf", "perfmon", "dac_read_search")
    assert full.returncode == 0, full.stderr
    assert "probes loaded" in full.stderr and "needs" not in full.stderr
    admin = run("sys_admin", "dac_read_search")  # SYS_ADMIN grants what BPF and PERFMON do
    assert admin.returncode == 0 and "probes loaded" in admin.stderr, admin.stderr
    partial = run("bpf", "perfmon")
    assert partial.returncode == 2 and partial.stderr.count("\n") == 1, partial.stderr
    assert "CAP_DAC_READ_SEARCH" in partial.stderr and "tracefs" in partial.stderr
    assert "root" not in partial.stderr.split("(fix:")[0] and "Traceback" not in partial.stderr


@pytest.mark.root
@pytest.mark.self_contained
def test_missing_kernel_headers_is_one_line(tmp_path, monkeypatch):
    # No host tree, no kheaders, and gpuguard's own set gone (a damaged install).
    code = (
        "import pathlib, gpuguard.sources.ebpf.kernel_headers as k\n"
        "k.MODULES = pathlib.Path('/nonexistent')\n"
        "k.KHEADERS = pathlib.Path('/nonexistent/kheaders.tar.xz')\n"
        'k.bundled_archive = lambda: (None, {}, "gpuguard\'s header set is missing (test)")\n'
        "from gpuguard.cli import main\n"
        "raise SystemExit(main(['watch', '--duration', '1']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.startswith("gpuguard: no kernel headers for bcc to compile the probes ")
    assert "no kernel headers at /nonexistent/" in out.stderr
    assert "header set is missing" in out.stderr and "gpuguard doctor" in out.stderr
    assert out.stderr.count("\n") == 1


@pytest.mark.root
@pytest.mark.self_contained
def test_record_then_replay_reads_back_exactly(tmp_path):
    rec = tmp_path / "capture.ggrec"
    recorder = start_recorder(rec, "--duration", "6", "--interval", "0.2")
    # It stays alive a moment: facts are read from /proc when the process first matters.
    proc = run_with_gpu_nodes(
        [
            str(build_workload()),
            "open:/dev/nvidiactl",
            "ioctl:0:0xc020462a:321",
            "sleep:1500",
            "exit:5",
        ]
    )
    proc.wait(timeout=10)
    _, err = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, err
    assert "wrote" in err

    replay = gpuguard("replay", str(rec), "--json")
    assert replay.returncode == 0, replay.stderr
    items = [json.loads(line) for line in replay.stdout.splitlines()]
    mine = [i for i in items if i.get("pid") == proc.pid]
    kinds = [i["kind"] for i in mine]
    assert "process" in kinds  # facts recorded the first time the process mattered
    assert [i["path"] for i in mine if i["kind"] == "gpu_open"] == ["/dev/nvidiactl"]
    assert sum(i["count"] for i in mine if i["kind"] == "gpu_ioctl") == 321
    assert [i["exit_code"] for i in mine if i["kind"] == "exit"] == [5]

    # Reading it twice gives the same items: replay is exact and deterministic.
    assert gpuguard("replay", str(rec), "--json").stdout == replay.stdout
    table = gpuguard("replay", str(rec))
    assert f"pid {proc.pid}" in table.stdout and "NV_ESC_RM_CONTROLx321" in table.stdout


@pytest.mark.root
@pytest.mark.self_contained
def test_record_keeps_the_pool_a_miner_hides_in_its_config_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        '{"pools": [{"url": "stratum+tcp://pool.hidden.example:3333", "user": "4wallet"}]}'
    )
    rec = tmp_path / "capture.ggrec"
    recorder = start_recorder(rec, "--duration", "5", "--gpu-interval", "0")
    proc = run_with_gpu_nodes(
        [str(build_workload()), "open:/dev/nvidia0", "sleep:1500", "exit:0", "-c", str(config)]
    )
    proc.wait(timeout=10)
    recorder.communicate(timeout=60)
    facts = [
        json.loads(line) for line in gpuguard("replay", str(rec), "--json").stdout.splitlines()
    ]
    mine = [f for f in facts if f["kind"] == "process" and f["pid"] == proc.pid]
    assert mine and "stratum+tcp://pool.hidden.example:3333" in mine[0]["config_files"][str(config)]


@pytest.mark.root
@pytest.mark.self_contained
def test_replay_of_a_truncated_recording_shows_the_prefix_then_one_error(tmp_path):
    rec = tmp_path / "capture.ggrec"
    recorder = start_recorder(rec, "--duration", "4", "--gpu-interval", "0")
    workload = run_with_gpu_nodes(
        [
            str(build_workload()),
            "open:/dev/nvidia0",
            "open:/dev/kfd",
            "ioctl:0:0xc020462a:10",
            "sleep:1200",
            "exit:0",
        ]
    )
    workload.wait(timeout=10)
    recorder.communicate(timeout=60)
    assert recorder.returncode == 0
    whole = gpuguard("replay", str(rec), "--json").stdout.splitlines()
    assert len(whole) > 3
    cut = tmp_path / "cut.ggrec"
    data = rec.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    damaged = gpuguard("replay", str(cut), "--json")
    assert damaged.returncode == 2
    assert damaged.stderr.count("\n") == 1 and "Traceback" not in damaged.stderr
    assert "cut.ggrec" in damaged.stderr
    got = damaged.stdout.splitlines()
    assert 0 < len(got) < len(whole)
    assert got == whole[: len(got)]  # exactly the items before the damage


def test_record_refuses_to_overwrite(tmp_path):
    existing = tmp_path / "keep.ggrec"
    existing.write_bytes(b"precious")
    out = gpuguard("record", "--output", str(existing), "--duration", "1")
    if os.geteuid() != 0:
        assert out.returncode == 2  # the root check or the file check, either way one line
        return
    assert out.returncode == 2
    assert "already exists" in out.stderr and existing.read_bytes() == b"precious"


def test_replay_missing_file_is_one_line(tmp_path):
    out = gpuguard("replay", str(tmp_path / "nope.ggrec"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "nope.ggrec" in out.stderr
