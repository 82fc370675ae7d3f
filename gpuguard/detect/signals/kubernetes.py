"""Rule signals of where a process runs in Kubernetes: namespace, pod, container and image.

The names come from the node alone (``sources.proc.pod_names``: the kubelet's log tree, then
containerd's state); a process outside a pod, or one the node cannot name, has none (not
available: never matches, so ``not:`` of one matches a host process too).
"""

from __future__ import annotations

from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.definition import signal


@signal(
    "k8s_namespace",
    "text",
    "identity",
    "Kubernetes namespace of its pod (kubelet log tree, containerd state; absent outside a pod)",
    reads=("facts.pod_namespace",),
)
def k8s_namespace(s: ProcessState, now: float) -> str | None:
    return s.facts.pod_namespace if s.facts is not None else None


@signal(
    "k8s_pod",
    "text",
    "identity",
    "Kubernetes pod name",
    reads=("facts.pod_name",),
)
def k8s_pod(s: ProcessState, now: float) -> str | None:
    return s.facts.pod_name if s.facts is not None else None


@signal(
    "k8s_container",
    "text",
    "identity",
    "container name in its pod's spec",
    reads=("facts.container_name",),
)
def k8s_container(s: ProcessState, now: float) -> str | None:
    return s.facts.container_name if s.facts is not None else None


@signal(
    "container_image",
    "text",
    "identity",
    "image its container runs, as pulled (containerd's io.kubernetes.cri.image-name)",
    reads=("facts.container_image",),
)
def container_image(s: ProcessState, now: float) -> str | None:
    return s.facts.container_image if s.facts is not None else None
