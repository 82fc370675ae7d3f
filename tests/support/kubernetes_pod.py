"""A Kubernetes pod as a node shows it: a kubelet-named cgroup, log tree entries, a containerd bundle."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.cgroup_start import in_cgroup


class Pod:
    """A pod as the node shows it: a cgroup named like the kubelet's (systemd driver), the
    kubelet's log tree entries, and (``image``) containerd's bundle with its CRI annotations."""

    def __init__(self, root: Path, logs: Path, tasks: Path, namespace: str, name: str, image):
        self.namespace, self.name, self.image = namespace, name, image
        self.uid = str(uuid.uuid4())
        self.container_id = uuid.uuid4().hex + uuid.uuid4().hex
        slice_ = root / "kubepods.slice" / "kubepods-besteffort.slice"
        pod = slice_ / f"kubepods-besteffort-pod{self.uid.replace('-', '_')}.slice"
        self.cgroup = pod / f"cri-containerd-{self.container_id}.scope"
        self.cgroup.mkdir(parents=True)
        log = logs / "pods" / f"{namespace}_{name}_{self.uid}" / "main" / "0.log"
        log.parent.mkdir(parents=True)
        log.touch()
        (logs / "containers").mkdir(exist_ok=True)
        (logs / "containers" / f"{name}_{namespace}_main-{self.container_id}.log").symlink_to(log)
        if image:
            bundle = tasks / "k8s.io" / self.container_id
            bundle.mkdir(parents=True)
            notes = {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "main",
                "io.kubernetes.cri.image-name": image,
                "io.kubernetes.cri.sandbox-name": name,
                "io.kubernetes.cri.sandbox-namespace": namespace,
            }
            (bundle / "config.json").write_text(
                json.dumps({"ociVersion": "1.1.0", "annotations": notes})
            )
        self.proc: subprocess.Popen | None = None

    def start(self, marker: str) -> int:
        argv = [sys.executable, "-c", "import time; time.sleep(600)", marker]
        self.proc = subprocess.Popen(in_cgroup(argv, self.cgroup), stdin=subprocess.DEVNULL)
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)
