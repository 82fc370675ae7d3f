"""A container's image (and its Kubernetes names) from the container runtime's state on the node.

containerd keeps each running container's OCI bundle at
``/run/containerd/io.containerd.runtime.v2.task/<namespace>/<container id>/config.json``; its
CRI plugin (the Kubernetes one, namespace ``k8s.io``) writes the pod's names and the image as
annotations there (``io.kubernetes.cri.image-name``, ``...container-name``,
``...sandbox-namespace``, ``...sandbox-name``).  containerd writes the file as root before the
container's first instruction: the workload cannot choose what it says, only its pod spec
could (and the image name is the one it was pulled as).  Nothing is asked of the API server or
the runtime's socket.  A bundle is read once per container id (bounded, a regular file only).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from gpuguard.config.filecheck import read_regular_file
from gpuguard.errors import GpuguardError

TASK_ROOT = "/run/containerd/io.containerd.runtime.v2.task"
CRI_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI plugin's containers
MAX_BUNDLE_BYTES = 1 << 20  # an OCI spec is ~20 KiB
CACHE = 4096  # containers remembered (a node runs a few hundred)
IMAGE = "io.kubernetes.cri.image-name"
CONTAINER = "io.kubernetes.cri.container-name"
NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
POD = "io.kubernetes.cri.sandbox-name"


@dataclass(frozen=True, slots=True)
class RuntimeNames:
    """What the runtime's bundle says of a container ("" where it says nothing)."""

    image: str = ""
    container: str = ""
    namespace: str = ""
    pod: str = ""


UNKNOWN = RuntimeNames()


class ContainerImages:
    """Reads containerd's bundle of a container id; remembers what it found (a miss is re-read)."""

    def __init__(self, task_root: str = TASK_ROOT) -> None:
        self.task_root = task_root
        self._known: OrderedDict[str, RuntimeNames] = OrderedDict()

    def of(self, container_id: str | None) -> RuntimeNames:
        if not container_id:
            return UNKNOWN
        found = self._known.get(container_id)
        if found is not None:
            self._known.move_to_end(container_id)
            return found
        found = self._read(container_id)
        if found is not UNKNOWN:  # a container not started yet may have its bundle later
            self._known[container_id] = found
            if len(self._known) > CACHE:
                self._known.popitem(last=False)
        return found

    def _read(self, container_id: str) -> RuntimeNames:
        namespaces = [CRI_NAMESPACE] + [n for n in _listdir(self.task_root) if n != CRI_NAMESPACE]
        for namespace in namespaces:
            path = Path(self.task_root, namespace, container_id, "config.json")
            try:
                spec = json.loads(read_regular_file(path, MAX_BUNDLE_BYTES, "OCI bundle"))
            except (GpuguardError, OSError, ValueError):
                continue
            notes = spec.get("annotations") if isinstance(spec, dict) else None
            if not isinstance(notes, dict):
                continue
            values = [notes.get(k) for k in (IMAGE, CONTAINER, NAMESPACE, POD)]
            return RuntimeNames(*(v if isinstance(v, str) else "" for v in values))
        return UNKNOWN


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
