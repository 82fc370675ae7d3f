"""The built image runs as the DaemonSet runs it: eBPF without the node's headers, selftest caught.

Deselected unless pytest gets ``--image-dir`` (building the image takes minutes, beyond the
suite's budget): ``sudo bash packaging/build-image.sh`` first, then
``pytest tests/test_image.py --image-dir --require-root-tests -n 0`` (docs/deploy.md).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "packaging" / "run-image-rootfs.py"
DAEMONSET = REPO / "packaging" / "kubernetes" / "base" / "daemonset.yaml"


def _runner():
    spec = importlib.util.spec_from_file_location("gg_run_image_rootfs", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _container() -> dict:
    (container,) = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"]
    return container


def test_the_runner_grants_the_daemonsets_capabilities_and_mounts_its_volumes(tmp_path):
    runner = _runner()
    pod, container, configmaps = runner.load_pod(DAEMONSET, None)
    (tmp_path / "scratch").mkdir()
    args = runner.argparse.Namespace(
        image_dir=tmp_path, hide_host_headers=True, node_dirs=tmp_path / "node"
    )
    script = runner.mount_script(args, pod, container, configmaps, tmp_path / "scratch")
    for mount in container["volumeMounts"]:
        target = f"$new{mount['mountPath']}"
        assert f" {target}\n" in script + "\n" or f" {target};" in script, mount
        assert (f"remount,bind,ro {target}\n" in script) == bool(mount.get("readOnly")), mount
    assert script.rstrip().endswith('$new "$@"') and runner.PIVOT in script
    assert "\nmount -o remount,bind,ro $new\n" in script  # readOnlyRootFilesystem
    assert (tmp_path / "scratch/volumes/config/agent.yaml").is_symlink()  # the kubelet's layout
    bounding = next(a for a in runner.capability_argv(container) if a.startswith("--bounding"))
    assert bounding == "--bounding-set=-all," + ",".join(
        f"+{c.lower()}" for c in _container()["securityContext"]["capabilities"]["add"]
    )
    enforce = runner.load_pod(DAEMONSET, "enforce")[1]["securityContext"]["capabilities"]["add"]
    assert set(enforce) - set(container["securityContext"]["capabilities"]["add"]) == {
        "KILL",
        "NET_ADMIN",
    }


def _stale_files(rootfs: Path) -> list[str]:
    """The checkout's package files the rootfs holds in another version (or not at all)."""
    site = next((rootfs / "opt/gpuguard/lib").glob("python3*/site-packages/gpuguard"))
    stale = []
    for source in (REPO / "gpuguard").rglob("*.py"):
        copy = site / source.relative_to(REPO / "gpuguard")
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            stale.append(str(source.relative_to(REPO)))
    for source in (REPO / "probes").rglob("*"):
        copy = site / "probes" / source.relative_to(REPO / "probes")
        if source.is_file() and (not copy.exists() or copy.read_bytes() != source.read_bytes()):
            stale.append(str(source.relative_to(REPO)))
    return stale


@pytest.mark.root
@pytest.mark.self_contained
@pytest.mark.image
def test_the_image_loads_every_probe_without_node_headers_and_catches_the_selftest_miner(
    tmp_path, request
):
    image_dir = request.config.getoption("--image-dir")
    assert (image_dir / "rootfs/opt/gpuguard").is_dir(), (
        f"no rootfs in {image_dir} (fix: sudo bash packaging/build-image.sh)"
    )
    stale = _stale_files(image_dir / "rootfs")
    assert not stale, (
        f"the rootfs is older than this checkout: {stale[:5]} (fix: sudo bash packaging/build-image.sh)"
    )
    node, port = tmp_path / "node", free_port()
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--image-dir", str(image_dir), "--node-dirs", str(node),
         "--hide-host-headers", "--metrics-port", str(port), "--doctor", "--selftest",
         "--scratch-parent", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    granted = sorted(_container()["securityContext"]["capabilities"]["add"])
    assert summary["bounding"] == summary["effective"] == granted, summary
    assert summary["no_new_privs"] and summary["root_read_only"], summary
    assert (summary["sensor"], summary["headers"]) == ("ebpf", "bundled"), summary
    # the pod's own preflight, with its capabilities: the full sensor loads, block-egress could run
    doctor = summary["doctor"]["out"]
    assert summary["doctor"]["rc"] == 0 and "the full eBPF sensor will load" in doctor, doctor
    assert re.search(r"^✔ nftables ", doctor, re.M), doctor
    assert summary["selftest"]["rc"] == 0 and "PASS" in summary["selftest"]["out"], summary
    assert "sensor ebpf" in summary["selftest"]["out"], summary
    assert summary["exit"] == 0, summary
    # what the agent unpacked for bcc is gone with it; it wrote only where the pod may write
    headers = node / "run/gpuguard/headers"
    assert not headers.exists() or not any(headers.iterdir()), list(headers.iterdir())
    records = [
        json.loads(line)
        for line in (node / "var/log/gpuguard/events.json").read_text().splitlines()
        if line.strip()
    ]
    started = next(r for r in records if r["event"]["action"] == "start")
    assert "sensor ebpf (kernel headers: bundled" in started["message"], started["message"]
    assert not list(tmp_path.glob("gpuguard-rootfs-*")), "the run's scratch was left behind"
