"""The preflight: each prerequisite of the sensor and the response, its cost when missing, the fix.

Reads the host and changes nothing, except the last check, which loads the agent's probes
(and detaches them) to prove they load.  ``ready`` holds when every required check passed:
the full eBPF sensor will load.  docs/doctor.md lists the kernel features behind each line.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuguard.agent.capabilities import ENFORCE_CAPABILITIES, MONITOR_CAPABILITIES
from gpuguard.errors import GpuguardError
from gpuguard.events.abi import probe_dir
from gpuguard.sources.ebpf import kernel_headers, preflight
from gpuguard.sources.proc.capabilities import effective_capabilities

BTF = Path("/sys/kernel/btf/vmlinux")
LOCKDOWN = Path("/sys/kernel/security/lockdown")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The oldest kernel that runs every probe: bpf_ktime_get_boot_ns, the ring buffer (5.8);
# docs/doctor.md lists each feature and its kernel.
OLDEST = (5, 8)
_TRACEPOINT = re.compile(r"^\s*TRACEPOINT_PROBE\((\w+),\s*(\w+)\)", re.M)
# What a missing tracepoint costs, by category (the rest cost the sensor its load).
_TRACEPOINT_COST = {
    "x86_fpu": "RandomX's rounding-mode pattern is not seen (scrubbed CPU miners)",
    "sched": "process exits and exec lineage are not seen",
}


@dataclass(frozen=True, slots=True)
class Check:
    """One prerequisite: whether it holds, what was seen, the cost when it does not, the fix."""

    name: str
    ok: bool
    detail: str
    cost: str = ""
    fix: str = ""
    required: bool = True  # needed for the full eBPF sensor (``ready``)

    def line(self) -> str:
        mark = "✔" if self.ok else "✗"
        text = f"{mark} {self.name:<22} {self.detail}"
        if not self.ok:
            text += f" (without it: {self.cost}; fix: {self.fix})"
        return text


def _release_tuple(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def kernel() -> Check:
    uname = os.uname()
    return Check(
        "kernel",
        _release_tuple(uname.release) >= OLDEST,
        f"{uname.release} {uname.machine}",
        "the probes use BPF helpers and the ring buffer of Linux 5.8: they do not load",
        "run Linux 5.8 or later",
    )


def btf() -> Check:
    ok = os.access(BTF, os.R_OK)
    return Check(
        "BTF",
        ok,
        f"{BTF} readable" if ok else f"no readable {BTF}",
        "the rounding-mode probe cannot find its task offsets: RandomX's pattern is not seen",
        "a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's since 2021)",
    )


def tracefs() -> tuple[Check, Path | None]:
    try:
        base = preflight.require_tracefs()
    except GpuguardError as exc:
        cost = "no probe can attach: the agent runs in reduced mode (/proc sweeps)"
        return Check("tracefs", False, exc.cause, cost, exc.fix), None
    return Check("tracefs", True, f"mounted at {base}"), base


def probe_tracepoints() -> list[tuple[str, str]]:
    """Every (category, event) a probe program attaches to, read from the probe sources."""
    found: set[tuple[str, str]] = set()
    for source in sorted(probe_dir().glob("*.c")):
        found.update(_TRACEPOINT.findall(source.read_text()))
    return sorted(found)


def tracepoints(base: Path | None) -> list[Check]:
    """One check per tracepoint the probes use (x86_fpu only on x86, where the probe exists)."""
    x86 = os.uname().machine in ("x86_64", "i686", "i386")
    checks = []
    for category, event in probe_tracepoints():
        if category == "x86_fpu" and not x86:
            continue
        ok = base is not None and (base / "events" / category / event / "id").is_file()
        checks.append(
            Check(
                f"tracepoint {category}:{event}",
                ok,
                "present" if ok else "missing" if base is not None else "unknown (no tracefs)",
                _TRACEPOINT_COST.get(category, "the sensor cannot load its probes: reduced mode"),
                "mount tracefs; a kernel with CONFIG_FTRACE_SYSCALLS=y"
                if category == "syscalls"
                else "mount tracefs; a kernel with this trace event",
            )
        )
    return checks


def headers() -> Check:
    first = kernel_headers.plan()[0]
    detail = first.line() if first.kind != "none" else first.why
    if first.kind in ("kheaders", "bundled"):
        detail += f"; {kernel_headers.host_tree()[1]}"
    return Check(
        "kernel headers",
        first.kind != "none",
        detail,
        "bcc cannot compile the probes: reduced mode",
        "install linux-headers-$(uname -r), or reinstall gpuguard (it carries a header set)",
    )


def lockdown() -> Check:
    try:
        text = LOCKDOWN.read_text()
    except OSError:
        return Check("lockdown", True, "unknown (securityfs not mounted); the probe load decides")
    mode = re.search(r"\[(\w+)\]", text)
    mode_name = mode.group(1) if mode else text.strip()
    return Check(
        "lockdown",
        mode_name != "confidentiality",
        f"mode {mode_name}",
        "the kernel refuses BPF reads of kernel memory: the probes do not load",
        "boot with lockdown=integrity or none",
    )


def cgroups() -> Check:
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        detail, ok = f"v2 at {CGROUP_ROOT}", True
    elif (CGROUP_ROOT / "unified" / "cgroup.controllers").is_file():
        detail, ok = f"v2 at {CGROUP_ROOT / 'unified'} (hybrid)", True
    else:
        detail, ok = "v1 only", False
    return Check(
        "cgroup",
        ok,
        detail,
        "enforce cannot quarantine GPUs or block egress per cgroup (cgroup BPF needs v2)",
        "boot with systemd.unified_cgroup_hierarchy=1",
        required=False,
    )


def capabilities() -> list[Check]:
    held = effective_capabilities()
    missing = [c for c in MONITOR_CAPABILITIES if c not in held]
    enforce_missing = [c for c in ENFORCE_CAPABILITIES if c not in held and c not in missing]
    return [
        Check(
            "capabilities",
            not missing,
            f"monitor needs {', '.join(MONITOR_CAPABILITIES)}"
            + (f"; missing {', '.join(missing)}" if missing else ": held"),
            "the probes cannot load or read other processes: reduced mode",
            "run as root, or grant these (packaging/gpuguard.service, the DaemonSet)",
        ),
        Check(
            "enforce capabilities",
            not enforce_missing,
            "CAP_KILL, CAP_NET_ADMIN"
            + (f": missing {', '.join(enforce_missing)}" if enforce_missing else ": held"),
            "enforce mode cannot signal other users' processes or set host-wide nftables sets",
            "grant them for enforce only (packaging/gpuguard-enforce.conf, the enforce overlay)",
            required=False,
        ),
    ]


def nftables() -> Check:
    nft = shutil.which("nft")
    try:
        import nftables  # noqa: F401 - only whether Debian's python3-nftables is there
    except ImportError:
        module = False
    else:
        module = True
    ok = bool(nft) and module
    return Check(
        "nftables",
        ok,
        f"nft {'at ' + nft if nft else 'missing'}, python3-nftables {'present' if module else 'missing'}",
        "block-egress cannot add pools to the host-wide nftables sets (enforce)",
        "apt-get install nftables python3-nftables",
        required=False,
    )


def gpu_sources() -> list[Check]:
    from gpuguard.sources.gpu.registry import GPU_SOURCES
    from gpuguard.sources.gpu.sampler import SourceUnavailable

    checks = []
    for source in GPU_SOURCES:
        try:
            sampler = source.open()
        except SourceUnavailable as exc:
            fix = exc.fix or "install the GPU's driver and its library on the node"
            detail = f"not available: {exc.cause}"[:240]
            if exc.absent:
                detail += " (this host has no GPU it reads)"
            cost = f"no per-process GPU use from {source.label}"
            checks.append(
                Check(f"GPU source {source.name}", False, detail, cost, fix, required=False)
            )
            continue
        sampler.close()
        checks.append(
            Check(f"GPU source {source.name}", True, f"{source.label} opened", required=False)
        )
    return checks


def probes_load() -> Check:
    """Load the agent's probes as the agent would, then detach them: the proof."""
    from gpuguard.sources.ebpf.probe_source import ProbeSettings
    from gpuguard.sources.ebpf.sensor import Sensor

    sensor = Sensor(ProbeSettings(exec_filter=True), fpu=True)
    started = time.monotonic()
    try:
        sensor.start()
        loaded = sensor.loaded()
        blind = sensor.fpu.blind_spot if sensor.fpu is not None else ""
    except GpuguardError as exc:
        return Check("probes load", False, exc.one_line(), "reduced mode", "the lines above")
    finally:
        sensor.close()
    detail = f"{loaded}; attached and detached in {time.monotonic() - started:.1f} s"
    if blind:
        return Check(
            "probes load",
            False,
            f"{detail}; {blind}",
            "RandomX's pattern unseen",
            "the lines above",
        )
    return Check("probes load", True, detail)


def run_checks(load: bool = True) -> list[Check]:
    """Every check, in order; the probe load only when the others it needs passed."""
    tfs, base = tracefs()
    checks = [
        kernel(),
        btf(),
        tfs,
        *tracepoints(base),
        headers(),
        lockdown(),
        cgroups(),
        *capabilities(),
    ]
    try:
        preflight.import_bcc()
        checks.append(Check("bcc", True, "importable"))
    except GpuguardError as exc:
        checks.append(
            Check("bcc", False, exc.cause, "no probe can be compiled: reduced mode", exc.fix)
        )
    checks += [nftables(), *gpu_sources()]
    if load:
        if all(c.ok for c in checks if c.required):
            checks.append(probes_load())
        else:
            checks.append(
                Check(
                    "probes load",
                    False,
                    "not tried (see the lines above)",
                    "reduced mode",
                    "the lines above",
                )
            )
    return checks


def ready(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)


def as_json(checks: list[Check]) -> dict:
    return {"ready": ready(checks), "checks": [asdict(c) for c in checks]}
