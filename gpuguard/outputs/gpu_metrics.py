"""The agent's per-GPU, per-process and per-pod GPU series, labelled the way dcgm-exporter is.

:class:`GpuSeries` turns each sampler :class:`~gpuguard.events.gpu_snapshot.GpuSnapshot` into
gauges of :class:`~gpuguard.outputs.metrics.AgentMetrics`' registry.  Every series names its
GPU by ``gpu`` (``nvidia0``: dcgm-exporter's ``device``) and by dcgm-exporter's own label
names, ``UUID``, ``modelName`` and ``Hostname``, so ``DCGM_FI_DEV_*`` joins them ``on (UUID)``
with no label_replace (docs/deploy.md, "Joining DCGM").
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuguard.escape import escape_text
from gpuguard.events.gpu_snapshot import GpuSnapshot

DEFAULT_TOP_PROCESSES = 5
DEFAULT_MAX_POD_SERIES = 2000
GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]
PROCESS_LABELS = [*GPU_LABELS, "pid", "comm"]
POD_LABELS = ["namespace", "pod", "container", *GPU_LABELS]
POD_PROCESS_LABELS = [*POD_LABELS, "pid", "comm"]
NAME_MAX = 64


def gpu_label(vendor: str, index: int) -> str:
    return f"{vendor}{index}"


def label(value: str | None) -> str:
    """A label value from a string anyone may have set: escaped, bounded."""
    return escape_text(value or "")[:NAME_MAX]


def node_name() -> str:
    """The node, as dcgm-exporter names it in its Hostname label: $NODE_NAME (the DaemonSet
    sets it from spec.nodeName), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class GpuSeries:
    """The GPU gauges of one registry, kept to what the latest samples say."""

    def __init__(
        self,
        r: CollectorRegistry,
        top_processes: int = DEFAULT_TOP_PROCESSES,
        per_process_gpu: bool = False,
        max_pod_series: int = DEFAULT_MAX_POD_SERIES,
        hostname: str | None = None,
    ) -> None:
        self.hostname = label(hostname if hostname is not None else node_name())
        self.top_processes = top_processes
        self.per_process_gpu = per_process_gpu
        self.max_pod_series = max_pod_series
        self.gpu_util = Gauge(
            "gpuguard_gpu_utilization_percent", "GPU busy percent", GPU_LABELS, registry=r
        )
        self.gpu_mem_used = Gauge(
            "gpuguard_gpu_memory_used_bytes", "GPU memory in use", GPU_LABELS, registry=r
        )
        self.gpu_mem_total = Gauge(
            "gpuguard_gpu_memory_total_bytes", "GPU memory size", GPU_LABELS, registry=r
        )
        self.gpu_power = Gauge("gpuguard_gpu_power_watts", "GPU power draw", GPU_LABELS, registry=r)
        self.proc_util = Gauge(
            "gpuguard_gpu_process_utilization_percent",
            "Top GPU users: SM busy percent per process",
            PROCESS_LABELS,
            registry=r,
        )
        self.proc_mem = Gauge(
            "gpuguard_gpu_process_memory_bytes",
            "Top GPU users: GPU memory per process",
            PROCESS_LABELS,
            registry=r,
        )
        self.pod_sm = Gauge(
            "gpuguard_pod_gpu_sm_percent",
            "SM busy percent per pod container and GPU: the sum of its processes' own samples",
            POD_LABELS,
            registry=r,
        )
        self.pod_mem = Gauge(
            "gpuguard_pod_gpu_memory_bytes",
            "GPU memory per pod container and GPU: the sum of its processes' allocations",
            POD_LABELS,
            registry=r,
        )
        self.pod_proc_sm = self.pod_proc_mem = None
        if per_process_gpu:
            self.pod_proc_sm = Gauge(
                "gpuguard_process_gpu_sm_percent",
                "SM busy percent per process and GPU, with its pod (metrics.per_process_gpu)",
                POD_PROCESS_LABELS,
                registry=r,
            )
            self.pod_proc_mem = Gauge(
                "gpuguard_process_gpu_memory_bytes",
                "GPU memory per process and GPU, with its pod (metrics.per_process_gpu)",
                POD_PROCESS_LABELS,
                registry=r,
            )
        self.pod_series_dropped = Counter(
            "gpuguard_pod_gpu_series_dropped",
            "Per-pod or per-process GPU series left out of one sample by metrics.max_pod_series",
            ["family"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._proc_labels: set[tuple[str, ...]] = set()
        self._pod_series: dict[tuple[str, str], set[tuple[str, ...]]] = {}  # (family, source) ->

    def observe(self, snapshot: GpuSnapshot, comm_of: Any = None, pod_of: Any = None) -> None:
        """Per-GPU gauges, the top per-process users and the per-pod use from one sampler snapshot.

        ``comm_of(pid) -> str | None`` names a pid (the correlator knows); without it
        the label is empty.  ``pod_of(pid) -> PodRef | None`` gives its pod (None: the
        process is gone); without it there are no per-pod series.
        """
        gpu_labels = self._gpu_labels(snapshot)
        if pod_of is not None:
            self._observe_pods(snapshot, gpu_labels, comm_of, pod_of)
        for device in snapshot.devices:
            labels = gpu_labels(device.vendor, device.index, None)
            for metric, value in (
                (self.gpu_util, device.gpu_util),
                (self.gpu_mem_used, device.memory_used),
                (self.gpu_mem_total, device.memory_total),
                (self.gpu_power, device.power_w),
            ):
                if value is not None:
                    metric.labels(*labels).set(value)
        by_gpu: dict[tuple[str, ...], list[Any]] = {}
        for usage in snapshot.processes:
            gpu = gpu_labels(usage.vendor, usage.device_index, usage.device_uuid)
            by_gpu.setdefault(gpu, []).append(usage)
        fresh: set[tuple[str, ...]] = set()
        for gpu, users in by_gpu.items():
            users.sort(key=lambda u: (-(u.sm_util or 0.0), -(u.used_memory or 0), u.pid))
            for usage in users[: self.top_processes]:
                comm = comm_of(usage.pid) if comm_of is not None else None
                labels = (*gpu, str(usage.pid), label(comm))
                fresh.add(labels)
                self.proc_util.labels(*labels).set(usage.sm_util or 0.0)
                self.proc_mem.labels(*labels).set(usage.used_memory or 0)
        with self._lock:
            stale = self._proc_labels - fresh if snapshot.processes or snapshot.devices else set()
            for labels in stale:
                for metric in (self.proc_util, self.proc_mem):
                    try:
                        metric.remove(*labels)
                    except KeyError:
                        pass
            self._proc_labels = (self._proc_labels - stale) | fresh

    def _gpu_labels(self, snapshot: GpuSnapshot) -> Any:
        """``(vendor, index, uuid or None) -> GPU_LABELS values`` for the GPUs of ``snapshot``
        (a process's own UUID, as the driver reported it, wins over its device's)."""
        devices = {(d.vendor, d.index): d for d in snapshot.devices}

        def labels(vendor: str, index: int, uuid: str | None) -> tuple[str, ...]:
            device = devices.get((vendor, index))
            uuid = uuid or (device.uuid if device is not None else None)
            model = device.name if device is not None else None
            return (gpu_label(vendor, index), label(uuid), label(model), self.hostname)

        return labels

    def _observe_pods(
        self, snapshot: GpuSnapshot, gpu_labels: Any, comm_of: Any, pod_of: Any
    ) -> None:
        """Each pod's own share of each GPU: its processes' samples summed (under time-slicing or
        MPS every process has its own sample, so pods sharing a GPU are told apart).  The series
        of a sample replace those of the same source's previous one: a pod that is gone goes."""
        pods: dict[tuple[str, ...], list[float]] = {}
        procs: dict[tuple[str, ...], list[float]] = {}
        for usage in snapshot.processes:
            ref = pod_of(usage.pid)
            if ref is None:
                continue  # exited since the sample
            gpu = gpu_labels(usage.vendor, usage.device_index, usage.device_uuid)
            key = (label(ref.namespace), label(ref.pod), label(ref.container), *gpu)
            total = pods.setdefault(key, [0.0, 0.0])
            total[0] += usage.sm_util or 0.0
            total[1] += usage.used_memory or 0
            if self.per_process_gpu:
                comm = comm_of(usage.pid) if comm_of is not None else None
                pkey = (*key, str(usage.pid), label(comm))
                procs[pkey] = [usage.sm_util or 0.0, float(usage.used_memory or 0)]
        self._replace_series("pod", snapshot.source, pods, (self.pod_sm, self.pod_mem))
        if self.per_process_gpu:
            self._replace_series(
                "process", snapshot.source, procs, (self.pod_proc_sm, self.pod_proc_mem)
            )

    def _replace_series(
        self, family: str, source: str, values: dict[tuple[str, ...], list[float]], gauges: tuple
    ) -> None:
        """Set ``values`` (the largest ``max_pod_series`` by SM then memory; the rest counted)
        and remove this family's series of ``source`` that are not among them."""
        keep = sorted(values, key=lambda k: (-values[k][0], -values[k][1], k))
        if len(keep) > self.max_pod_series:
            self.pod_series_dropped.labels(family).inc(len(keep) - self.max_pod_series)
            keep = keep[: self.max_pod_series]
        else:
            self.pod_series_dropped.labels(family)  # present at 0: an alert can watch it
        sm, mem = gauges
        for key in keep:
            sm.labels(*key).set(values[key][0])
            mem.labels(*key).set(values[key][1])
        fresh = set(keep)
        with self._lock:
            before = self._pod_series.get((family, source), set())
            self._pod_series[(family, source)] = fresh
            others = set().union(
                *(v for (f, src), v in self._pod_series.items() if f == family and src != source)
            )
        for key in before - fresh - others:
            for gauge in gauges:
                try:
                    gauge.remove(*key)
                except KeyError:
                    pass
