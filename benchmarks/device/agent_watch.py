"""The agent under check, and what it said about each workload: verdicts, times, GPU series.

gpuguard's own ``Agent`` runs in this process (as the tests run it), so the check can give it
the dry run's fake NVML and a kubelet log tree of its own for pod names, and read the
correlator's state of a workload while it runs.  It opens NVML like a deployed agent and takes
the sensor it can get (``sensor: auto``): the eBPF probes, or the declared reduced mode.
Pods: the workload runs in cgroups named the way the kubelet names a pod's and a container's
(systemd driver), with the kubelet's log links for their names.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuguard.agent.config import AgentConfig
from gpuguard.agent.pipeline import Agent
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from gpuguard.sources.proc.pod_names import PodNames

PROCESS_SM, PROCESS_MEM = "gpuguard_process_gpu_sm_percent", "gpuguard_process_gpu_memory_bytes"
POD_SM, POD_MEM = "gpuguard_pod_gpu_sm_percent", "gpuguard_pod_gpu_memory_bytes"
ALERTS = ("suspicious", "malicious")


def remove_stale_pods() -> None:
    """The pod cgroups of a check that was killed (its pid is gone; its workloads died with it)."""
    for top in Path(cgroup2_mount()).glob("gg-devcheck-*"):
        pid = top.name.split("-")[2]
        if not Path(f"/proc/{pid}").exists():
            _remove_tree(top)


def _remove_tree(top: Path) -> None:
    dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for path in [*dirs, top]:
        try:
            path.rmdir()
        except OSError:
            pass


class KubeletPod:
    """One pod cgroup with one container cgroup, and the kubelet's log links that name them."""

    def __init__(self, logs: Path, namespace: str, name: str, container: str) -> None:
        self.namespace, self.name, self.container = namespace, name, container
        self.top = Path(cgroup2_mount()) / f"gg-devcheck-{os.getpid()}-{name}"
        uid, cid = str(uuid.uuid4()), os.urandom(32).hex()
        self.cgroup = (
            self.top
            / "kubepods.slice"
            / "kubepods-besteffort.slice"
            / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
            / f"cri-containerd-{cid}.scope"
        )
        self.cgroup.mkdir(parents=True)
        (logs / "pods" / f"{namespace}_{name}_{uid}" / container).mkdir(parents=True)
        (logs / "containers").mkdir(exist_ok=True)
        (logs / "containers" / f"{name}_{namespace}_{container}-{cid}.log").symlink_to(
            logs / "pods" / f"{namespace}_{name}_{uid}" / container / "0.log"
        )

    def add(self, pid: int) -> None:
        (self.cgroup / "cgroup.procs").write_text(str(pid))

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.name, "container": self.container}

    def close(self) -> None:
        _remove_tree(self.top)


class CheckAgent:
    def __init__(self, workdir: Path, sampler_openers: dict | None, sensor: str = "auto") -> None:
        self.log = workdir / "agent.log"
        self.pod_logs = workdir / "kubelet-log"
        self.pod_logs.mkdir()
        try:
            remove_stale_pods()
        except OSError:
            pass  # no cgroup v2: the pods are reported missing where they are made
        config = AgentConfig(
            sensor=sensor,
            log_path=str(self.log),
            status_path=workdir / "status.json",
            metrics_address="127.0.0.1:0",
            per_process_gpu=True,
            status_interval_s=1.0,
        )
        self.stderr: list[str] = []
        self.agent = Agent(
            config,
            install_signals=False,
            stderr=self.stderr.append,
            sampler_openers=sampler_openers,
        )
        names = PodNames(str(self.pod_logs))
        self.agent.telemetry.pod_names = names
        self.agent.findings.pod_names = names
        self.thread = threading.Thread(target=self.agent.run, daemon=True)

    def start(self, timeout: float = 90.0) -> float:
        started = time.monotonic()
        self.thread.start()
        while not self.agent.ready.wait(0.1):
            if not self.thread.is_alive() or time.monotonic() - started > timeout:
                raise RuntimeError(f"the agent did not start: {self.stderr[-5:]}")
        return time.monotonic() - started

    def sensor(self) -> dict:
        counters = self.agent.counters
        return {"mode": counters.sensor_mode, "blind_spots": list(counters.blind_spots)}

    def pod(self, namespace: str, name: str, container: str) -> KubeletPod:
        return KubeletPod(self.pod_logs, namespace, name, container)

    def state(self, pid: int) -> dict | None:
        """What the correlator holds about ``pid`` now (read from another thread: copies)."""
        try:
            st = self.agent.correlator.state_of(pid)
            if st is None:
                return None
            verdict = st.verdict
            return {
                "verdict": verdict.verdict if verdict else None,
                "score": verdict.score if verdict else None,
                "rules": sorted(e.rule_id for e in verdict.evidence) if verdict else [],
                "gpu_device_classes": sorted(st.gpu_device_classes),
                "gpu_util_samples": len(st.gpu_util),
                "gpu_util_mean": _round(st.gpu_util.mean),
                "gpu_window_s": _round(st.gpu_util.duration_s),
                "ioctl_total": st.ioctl_total,
                "ioctl_names": dict(sorted(st.ioctl_counts.items(), key=lambda kv: -kv[1])[:20]),
                "connections": [f"{a}:{p}" for (a, p) in list(st.connections)[:8]],
                "payload_protocols": sorted(st.payload_protocols),
            }
        except (RuntimeError, AttributeError):  # changed while read: the next look gets it
            return None

    def records(self, pid: int) -> list[dict]:
        """The agent's log records (ECS) about ``pid``."""
        out = []
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("process", {}).get("pid") == pid:
                    out.append(record)
        return out

    def scrape(self) -> list[tuple[str, dict, float]]:
        port = self.agent.telemetry.server.port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        return [
            (s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
        ]

    def stop(self) -> None:
        self.agent.request_stop()
        self.thread.join(30)


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


class WorkloadWatch(threading.Thread):
    """Twice a second: the agent's state of the workload; every second its GPU series."""

    def __init__(self, agent: CheckAgent, pid: int, pod: KubeletPod | None, started: float) -> None:
        super().__init__(daemon=True)
        self.agent, self.pid, self.pod, self.started = agent, pid, pod, started
        self.stop = threading.Event()
        self.first: dict[str, float] = {}
        self.verdicts: list[dict] = []
        self.last_state: dict | None = None
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.errors: list[str] = []

    def _at(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def _first(self, what: str) -> None:
        self.first.setdefault(what, self._at())

    def run(self) -> None:
        next_scrape = 0.0
        while not self.stop.wait(0.5):
            self._guarded(self.look)
            if time.monotonic() >= next_scrape:
                next_scrape = time.monotonic() + 1.0
                self._guarded(self.scrape)
        self._guarded(self.look)
        self._guarded(self.scrape)

    def _guarded(self, fn) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a failed look is noted; the watch goes on
            if len(self.errors) < 5:
                self.errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")

    def look(self) -> None:
        state = self.agent.state(self.pid)
        if state is None:
            return
        self.last_state = state
        self._first("known")
        if state["gpu_device_classes"]:
            self._first("gpu_files")
        if state["gpu_util_samples"]:
            self._first("gpu_samples")
        if state["ioctl_total"]:
            self._first("ioctls")
        if state["verdict"] in ALERTS:
            self._first(state["verdict"])
        last = self.verdicts[-1] if self.verdicts else None
        now = (state["verdict"], state["score"], state["rules"])
        if state["verdict"] and (
            last is None or (last["verdict"], last["score"], last["rules"]) != now
        ):
            self.verdicts.append(
                {"at_s": self._at(), **dict(zip(("verdict", "score", "rules"), now, strict=True))}
            )

    def scrape(self) -> None:
        samples = self.agent.scrape()
        pod = self.pod.labels() if self.pod else None
        for name, labels, value in samples:
            if name in (PROCESS_SM, PROCESS_MEM) and labels.get("pid") == str(self.pid):
                key = f"process {name.removeprefix('gpuguard_')}"
            elif (
                name in (POD_SM, POD_MEM)
                and pod
                and all(labels.get(k) == v for k, v in pod.items())
            ):
                key = f"pod {name.removeprefix('gpuguard_')}"
            else:
                continue
            self._first(key.split()[0] + "_series")
            self.series.setdefault(key, []).append((self._at(), value))

    def report(self) -> dict:
        records = self.agent.records(self.pid)
        alerts = [r for r in records if r.get("gpuguard", {}).get("verdict") in ALERTS]
        return {
            "first_s": self.first,
            "verdicts": self.verdicts[-12:],
            "final": self.last_state,
            "log_records": len(records),
            "log_alerts": [
                {
                    "verdict": r["gpuguard"]["verdict"],
                    "score": r["gpuguard"].get("score"),
                    "rules": r["gpuguard"].get("rule_ids", []),
                    "pod": r.get("orchestrator", {}).get("resource", {}),
                }
                for r in alerts[:4]
            ],
            "series": {k: _summary(v) for k, v in self.series.items()},
            "watch_errors": self.errors,
        }


def _summary(points: list[tuple[float, float]]) -> dict:
    values = [v for _, v in points]
    return {
        "points": len(points),
        "first_at_s": points[0][0],
        "mean": round(sum(values) / len(values), 2),
        "min": min(values),
        "max": max(values),
        "last": values[-1],
    }
