"""Kubernetes names (namespace, pod, container) of a process, from its cgroup and the kubelet's logs.

The cgroup path gives only ids (:mod:`gpuguard.sources.proc.containers`: pod uid and
container id).  The kubelet names them on the node itself, without the API server:
every container's log is linked as
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` and every
pod has ``/var/log/pods/<namespace>_<pod>_<pod uid>/``.  These names are written by
the kubelet (root), not by the workload, and Kubernetes names cannot hold ``_``, so
the split is unambiguous.  A process whose ids are not found there keeps them as
its names (``pod`` = the uid, ``container`` = the first 12 hex of the id).  The image, and
any name the log tree lacks, come from the container runtime's state on the node
(:mod:`gpuguard.sources.proc.container_images`).  :meth:`PodNames.fill` writes what is known
into a process's facts, where rules, the allowlist and the response scope read it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from gpuguard.events.process_facts import ProcessFacts
from gpuguard.sources.proc.container_images import ContainerImages
from gpuguard.sources.proc.containers import container_from_cgroup, read_cgroup_path

LOG_ROOT = "/var/log"
RESCAN_S = 5.0  # an unknown id rescans the directories at most this often
_NAME = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_CONTAINER_LINK = re.compile(rf"^({_NAME})_({_NAME})_({_NAME})-([0-9a-f]{{64}})\.log$")
_POD_DIR = re.compile(rf"^({_NAME})_({_NAME})_([0-9a-f]{{8}}(-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}})$")


@dataclass(frozen=True, slots=True)
class PodRef:
    """Who runs a process: ``namespace``/``pod``/``container`` ("" for a host process)."""

    namespace: str
    pod: str
    container: str
    image: str = ""  # from the container runtime's state ("" unknown)


HOST = PodRef("", "", "")


class PodNames:
    """Names pod uids and container ids from the kubelet's log links; rescans on a miss."""

    def __init__(
        self,
        log_root: str = LOG_ROOT,
        clock=time.monotonic,
        images: ContainerImages | None = None,
    ) -> None:
        self.log_root = log_root
        self.clock = clock
        self.images = images or ContainerImages()
        self._containers: dict[str, tuple[str, str, str]] = {}  # id -> (namespace, pod, container)
        self._pods: dict[str, tuple[str, str]] = {}  # uid -> (namespace, pod)
        self._scanned = float("-inf")

    def _rescan(self) -> None:
        now = self.clock()
        if now - self._scanned < RESCAN_S:
            return
        self._scanned = now
        containers: dict[str, tuple[str, str, str]] = {}
        pods: dict[str, tuple[str, str]] = {}
        for name in _listdir(os.path.join(self.log_root, "containers")):
            m = _CONTAINER_LINK.match(name)
            if m:
                containers[m.group(7)] = (m.group(3), m.group(1), m.group(5))
        for name in _listdir(os.path.join(self.log_root, "pods")):
            m = _POD_DIR.match(name)
            if m:
                pods[m.group(5)] = (m.group(1), m.group(3))
        self._containers, self._pods = containers, pods

    def name(self, pod_uid: str | None, container_id: str | None) -> PodRef:
        """The names of one pod uid / container id pair (either may be None); an unknown name
        is the id (``pod`` = the uid, ``container`` = 12 hex of the id)."""
        if pod_uid is None and container_id is None:
            return HOST
        ref = self.lookup(pod_uid, container_id)
        return PodRef(
            ref.namespace,
            ref.pod or (pod_uid or ""),
            ref.container or (container_id[:12] if container_id else ""),
            ref.image,
        )

    def lookup(self, pod_uid: str | None, container_id: str | None) -> PodRef:
        """What the node says of a pod uid / container id pair: "" for each name it does not
        know (the kubelet's log tree first, then the runtime's bundle)."""
        if pod_uid is None and container_id is None:
            return HOST
        known = (container_id is None or container_id in self._containers) and (
            pod_uid is None or pod_uid in self._pods
        )
        if not known:
            self._rescan()
        if container_id is not None and container_id in self._containers:
            namespace, pod, container = self._containers[container_id]
        else:
            namespace, pod = self._pods.get(pod_uid or "", ("", ""))
            container = ""
        runtime = self.images.of(container_id)
        return PodRef(
            namespace or runtime.namespace,
            pod or runtime.pod,
            container or runtime.container,
            runtime.image,
        )

    def fill(self, facts: ProcessFacts) -> ProcessFacts:
        """Put the pod's and container's names and the image in ``facts`` (None: unknown)."""
        if facts.pod_uid is None and facts.container_id is None:
            return facts
        ref = self.lookup(facts.pod_uid, facts.container_id)
        facts.pod_namespace = ref.namespace or None
        facts.pod_name = ref.pod or None
        facts.container_name = ref.container or None
        facts.container_image = ref.image or None
        return facts

    def of_pid(self, pid: int, proc_root: str = "/proc") -> PodRef | None:
        """The names of a live process (None when it is gone)."""
        path = read_cgroup_path(pid, proc_root)
        if not path:
            return None
        ref = container_from_cgroup(path)
        return self.name(ref.pod_uid, ref.container_id)


def pod_names_for(log_root: str = LOG_ROOT, task_root: str | None = None) -> PodNames:
    """Names from the kubelet's log tree under ``log_root`` and containerd's state under
    ``task_root`` (the agent's ``kubernetes:`` settings)."""
    images = ContainerImages(task_root) if task_root is not None else ContainerImages()
    return PodNames(log_root, images=images)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
