"""Runs the image's exported rootfs as packaging/kubernetes/base/daemonset.yaml runs the image.

For hosts where no container runtime can start (hybrid cgroups): the host's PID and network
namespaces, a read-only overlay root pivoted into a private mount namespace, and every volume,
env var, arg and capability read from the DaemonSet file, so the run cannot drift from it
(docs/deploy.md, "Running the image where no container runtime can").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

try:
    import yaml
except ImportError:  # the host's python3 without PyYAML
    sys.exit(
        "run-image-rootfs: PyYAML is missing (fix: use .venv/bin/python, or apt-get install python3-yaml)"
    )

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from gpuguard.sources.proc.capabilities import CAPABILITY_BITS  # noqa: E402 - the checkout first

KUBE = ROOT / "packaging" / "kubernetes"
IMAGE_DIR = Path("/var/cache/gpuguard-image")  # where build-image.sh exports the rootfs
# The paths the container runtimes mask or make read-only in a container that is not
# privileged (containerd's and CRI-O's defaults), so the agent sees what it sees in a pod.
MASKED = [
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
# The container's root becomes its mount namespace's root, as runc does it (pivot_root(".", ".")
# then a lazy unmount of the old root): paths the agent reads in /proc are the pod's, not the
# host's.  Python, because the image has no umount(8); all it needs is loaded before the pivot.
PIVOT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
if libc.syscall({"x86_64": 155, "aarch64": 41}[os.uname().machine], b".", b".") != 0:
    sys.exit(f"pivot_root: {os.strerror(ctypes.get_errno())}")
if libc.umount2(b".", 2) != 0:  # MNT_DETACH
    sys.exit(f"umount the old root: {os.strerror(ctypes.get_errno())}")
os.chdir("/")
os.execv(sys.argv[2], sys.argv[2:])
"""
DEV_NODES = {
    "null": (1, 3),
    "zero": (1, 5),
    "full": (1, 7),
    "random": (1, 8),
    "urandom": (1, 9),
    "tty": (5, 0),
}


def fail(message: str) -> None:
    sys.exit(f"run-image-rootfs: {message}")


def load_pod(daemonset: Path, overlay: str | None) -> tuple[dict, dict, list[dict]]:
    """The DaemonSet's pod spec and container (an overlay's patch applied), and its ConfigMaps."""
    base = daemonset.parent
    resources = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    docs = [d for r in resources for d in yaml.safe_load_all((base / r).read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    if overlay:  # the overlays patch the container's args and capabilities only (a test says so)
        patch = yaml.safe_load((KUBE / "overlays" / overlay / f"{overlay}.yaml").read_text())
        (patched,) = patch["spec"]["template"]["spec"]["containers"]
        container = {**container, **{k: v for k, v in patched.items() if k != "securityContext"}}
        container["securityContext"] = {
            **container["securityContext"],
            **patched["securityContext"],
        }
    return pod, container, [d for d in docs if d["kind"] == "ConfigMap"]


def project_configmaps(volume: dict, configmaps: list[dict], target: Path) -> None:
    """A projected ConfigMap volume laid out as the kubelet's atomic writer does (..data link)."""
    data: dict[str, str] = {}
    by_name = {c["metadata"]["name"]: c for c in configmaps}
    for source in volume["projected"]["sources"]:
        data.update(by_name[source["configMap"]["name"]]["data"])
    stamp = target / "..2026_12_02_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, text in data.items():
        (stamp / key).write_text(text)
        (stamp / key).chmod(volume["projected"].get("defaultMode", 0o644))
        os.symlink(f"..data/{key}", target / key)
    os.symlink(stamp.name, target / "..data")


def mount_script(args, pod: dict, container: dict, configmaps: list[dict], scratch: Path) -> str:
    """The shell that builds the container's mount namespace, then execs the entrypoint."""
    rootfs = args.image_dir / "rootfs"
    new = scratch / "root"
    q = shlex.quote
    lines = ["set -eu", f"new={q(str(new))}"]
    if args.hide_host_headers:  # a managed GPU node: no kernel headers anywhere
        for path in ("/lib/modules", "/usr/src"):
            lines.append(f"[ ! -d {path} ] || mount -t tmpfs -o ro,mode=0755 gg-empty {path}")
    for d in ("upper", "work", "root"):
        (scratch / d).mkdir()
    lines += [
        f"mount -t overlay gg-rootfs -o lowerdir={q(str(rootfs))},upperdir={q(str(scratch / 'upper'))},"
        f"workdir={q(str(scratch / 'work'))} $new",
        "mount -t proc -o nosuid,nodev,noexec proc $new/proc",
        "mount -t tmpfs -o nosuid,mode=0755,size=65536k gg-dev $new/dev",
        "mkdir $new/dev/pts $new/dev/shm",
        "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $new/dev/pts",
        "mount -t tmpfs -o nosuid,nodev,noexec,size=65536k shm $new/dev/shm",
        "ln -s pts/ptmx $new/dev/ptmx; ln -s /proc/self/fd $new/dev/fd",
        "mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $new/sys",
    ]
    for name, (major, minor) in DEV_NODES.items():
        lines.append(f"mknod -m 0666 $new/dev/{name} c {major} {minor}")
    for path in ("/etc/hosts", "/etc/resolv.conf"):  # the kubelet's, for a host-network pod
        lines.append(f"touch $new{path}; mount --bind -o ro {path} $new{path}")
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume, target = volumes[mount["name"]], "$new" + q(mount["mountPath"])
        if "hostPath" in volume:
            host = volume["hostPath"]["path"]
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                # the node's own paths, or with --node-dirs a scratch copy (a shared host's
                # /var/log/gpuguard and /run/gpuguard belong to its own agent)
                host = str(args.node_dirs / host.lstrip("/")) if args.node_dirs else host
                Path(host).mkdir(parents=True, exist_ok=True)
            lines.append(f"mkdir -p {target}; mount --rbind {q(host)} {target}")
        elif "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
            lines.append(
                f"mkdir -p {target}; mount -t tmpfs -o nosuid,nodev,size={size} gg-empty {target}"
            )
        elif "projected" in volume:
            files = scratch / "volumes" / mount["name"]
            project_configmaps(volume, configmaps, files)
            lines.append(f"mkdir -p {target}; mount --bind {q(str(files))} {target}")
        else:
            fail(f"volume {mount['name']} is of a kind this runner does not know (fix: teach it)")
        if mount.get("readOnly"):
            lines.append(f"mount -o remount,bind,ro {target}")
    for path in MASKED:
        lines.append(
            f"if [ -d $new{path} ]; then mount -t tmpfs -o ro gg-masked $new{path}; "
            f"elif [ -e $new{path} ]; then mount --bind /dev/null $new{path}; fi"
        )
    for path in READ_ONLY:
        lines.append(
            f"[ ! -e $new{path} ] || {{ mount --bind $new{path} $new{path} && "
            f"mount -o remount,bind,ro $new{path}; }}"
        )
    if container["securityContext"].get("readOnlyRootFilesystem"):
        lines.append("mount -o remount,bind,ro $new")  # the overlay mount itself, not its submounts
    lines.append(f'exec {q(sys.executable)} -I -S -c {q(PIVOT)} $new "$@"')
    return "\n".join(lines)


def capability_argv(container: dict) -> list[str]:
    """setpriv as the runtime sets a root container: the added set bounds it, nothing inherited,
    no_new_privs for allowPrivilegeEscalation: false (root gets the bounding set on exec)."""
    caps = container["securityContext"]["capabilities"]
    if caps.get("drop") != ["ALL"]:
        fail("the DaemonSet does not drop ALL capabilities: this runner only models that")
    added = ",".join(f"+{c.lower()}" for c in caps["add"])
    argv = [
        "/usr/bin/setpriv",
        "--reuid=0",
        "--regid=0",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        f"--bounding-set=-all,{added}",
    ]
    if container["securityContext"].get("allowPrivilegeEscalation") is False:
        argv.append("--no-new-privs")
    return argv


def container_env(image: dict, container: dict, pod_ip: str) -> dict[str, str]:
    env = dict(e.split("=", 1) for e in image["Config"].get("Env") or [])
    env["HOSTNAME"] = socket.gethostname()  # hostNetwork: the node's
    fields = {"status.podIP": pod_ip, "spec.nodeName": socket.gethostname()}
    for e in container.get("env", []):
        env[e["name"]] = (
            e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        )
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it in args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def capabilities_of(pid: int) -> dict[str, str]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        k: v.strip() for k, v in re.findall(r"^(Cap\w+|NoNewPrivs|Seccomp):\s*(\S+)", status, re.M)
    }


def decode_caps(mask: str) -> list[str]:
    """A /proc status capability mask as the DaemonSet names capabilities (BPF, not CAP_BPF)."""
    names = {bit: name.removeprefix("CAP_") for name, bit in CAPABILITY_BITS.items()}
    value = int(mask, 16)
    return sorted(names.get(bit, f"cap{bit}") for bit in range(64) if value >> bit & 1)


class Run:
    """One container start: the agent in its namespace, until stopped."""

    def __init__(self, args, pod, container, configmaps, image) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="gpuguard-rootfs-", dir=args.scratch_parent))
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
        self.port = args.metrics_port or port
        self.env = container_env(image, container, args.pod_ip)
        argv = [
            expand(a, self.env)
            for a in (args.args or container.get("args") or image["Config"]["Cmd"])
        ]
        argv = [
            a.replace(f":{port}", f":{self.port}") if a.endswith(f":{port}") else a for a in argv
        ]
        entry = container.get("command") or image["Config"]["Entrypoint"]
        self.caps = capability_argv(container)
        script = mount_script(args, pod, container, configmaps, self.scratch)
        self.ready_url = (
            f"http://{args.pod_ip}:{self.port}{container['readinessProbe']['httpGet']['path']}"
        )
        self.started = time.monotonic()
        self.stderr = (self.scratch / "stderr").open("wb")
        self.proc = subprocess.Popen(
            [
                "/usr/bin/unshare",
                "--mount",
                "--propagation",
                "private",
                "/bin/bash",
                "-c",
                script,
                "gg-container",
                *self.caps,
                "--",
                *entry,
                *argv,
            ],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.stderr,
            stderr=self.stderr,
        )

    def wait_ready(self, timeout: float) -> float:
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"the agent exited with {self.proc.returncode} before ready: {self.tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=1) as answer:
                    if answer.status == 200:
                        return time.monotonic() - self.started
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        fail(f"{self.ready_url} did not answer 200 within {timeout:.0f} s: {self.tail()}")

    def exec(
        self, *argv: str, pod_caps: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """`kubectl exec`: a process in the container's mount namespace and root, with its
        capabilities; without ``pod_caps``, root's (a debugging container of the sysadmin profile)."""
        enter = ["/usr/bin/nsenter", f"--target={self.proc.pid}", "--mount", "--root", "--wd"]
        caps = [*self.caps, "--"] if pod_caps else []
        return subprocess.run(
            [*enter, *caps, *argv], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def facts(self) -> dict:
        status = capabilities_of(self.proc.pid)
        mounts = Path(f"/proc/{self.proc.pid}/mountinfo").read_text().splitlines()
        root = next(m.split() for m in reversed(mounts) if m.split()[4] == "/")  # the top one
        return {
            "pid": self.proc.pid,
            "bounding": decode_caps(status["CapBnd"]),
            "effective": decode_caps(status["CapEff"]),
            "no_new_privs": status.get("NoNewPrivs") == "1",
            "root_read_only": "ro" in root[5].split(","),
        }

    def stop(self) -> int:
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.stderr.close()
        return code

    def tail(self) -> str:
        return (self.scratch / "stderr").read_text(errors="replace")[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--image-dir",
        type=Path,
        default=IMAGE_DIR,
        help=f"build-image.sh's export (default {IMAGE_DIR})",
    )
    parser.add_argument("--daemonset", type=Path, default=KUBE / "base" / "daemonset.yaml")
    parser.add_argument("--overlay", choices=["enforce"], help="apply this overlay's patch")
    parser.add_argument(
        "--node-dirs",
        type=Path,
        help="take the DirectoryOrCreate hostPaths from here, not the node's",
    )
    parser.add_argument(
        "--hide-host-headers",
        action="store_true",
        help="empty /lib/modules and /usr/src, as on a managed GPU node",
    )
    parser.add_argument("--pod-ip", default="127.0.0.1", help="status.podIP (default 127.0.0.1)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="instead of the DaemonSet's port (a shared host's may be taken)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="start to ready this many times (the median is reported)",
    )
    parser.add_argument(
        "--doctor",
        action="store_true",
        help="then `gpuguard doctor` in the container, with its capabilities (as kubectl exec)",
    )
    parser.add_argument(
        "--selftest",
        action="store_true",
        help="then `gpuguard selftest` in the container (as kubectl exec)",
    )
    parser.add_argument("--ready-timeout", type=float, default=120)
    parser.add_argument(
        "--scratch-parent",
        type=Path,
        default=None,
        help="where each run's scratch goes (default $TMPDIR)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep each run's scratch directory (its log and stderr)"
    )
    parser.add_argument("args", nargs="*", help="instead of the DaemonSet's args (after --)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        fail("must run as root: it mounts in a private namespace (fix: sudo)")
    if not (args.image_dir / "rootfs" / "opt" / "gpuguard").is_dir():
        fail(f"no rootfs in {args.image_dir} (fix: sudo bash packaging/build-image.sh)")
    image = json.loads((args.image_dir / "image.json").read_text())[0]
    pod, container, configmaps = load_pod(args.daemonset, args.overlay)
    if not (pod.get("hostPID") and pod.get("hostNetwork")):
        fail("the DaemonSet is not hostPID and hostNetwork: this runner only models that")
    summary: dict = {"ready_s": []}
    for n in range(args.runs):
        run = Run(args, pod, container, configmaps, image)
        try:
            ready = run.wait_ready(args.ready_timeout)
            summary["ready_s"].append(round(ready, 3))
            print(
                f"run-image-rootfs: run {n + 1}: ready in {ready:.2f} s ({run.ready_url})",
                file=sys.stderr,
            )
            if n == 0:
                summary.update(run.facts())
                state = run.exec("/bin/cat", "/run/gpuguard/status.json")
                status = json.loads(state.stdout) if state.returncode == 0 else {}
                summary["sensor"] = status.get("sensor")
                summary["headers"] = (status.get("headers") or {}).get("source")
                if args.doctor:  # `kubectl exec ds/gpuguard -- gpuguard doctor`: the pod's own view
                    doctor = run.exec("/opt/gpuguard/bin/gpuguard", "doctor")
                    summary["doctor"] = {"rc": doctor.returncode, "out": doctor.stdout.strip()}
                    print(doctor.stdout.strip(), file=sys.stderr)
                if args.selftest:
                    # The simulator makes its own namespaces, GPU device nodes and loopback
                    # (CAP_MKNOD, CAP_NET_ADMIN), which the monitor pod does not hold: the image's
                    # selftest runs as from a debugging container, against the pod's agent.
                    test = run.exec("/opt/gpuguard/bin/gpuguard", "selftest", pod_caps=False)
                    summary["selftest"] = {
                        "rc": test.returncode,
                        "out": (test.stdout + test.stderr).strip()[-600:],
                    }
                    print(
                        f"run-image-rootfs: selftest: {summary['selftest']['out']}", file=sys.stderr
                    )
        finally:
            summary["exit"] = run.stop()
            summary.setdefault("stderr_tail", run.tail()[-800:])
            if args.keep:
                print(f"run-image-rootfs: kept {run.scratch}", file=sys.stderr)
            else:
                shutil.rmtree(run.scratch, ignore_errors=True)
    summary["ready_median_s"] = statistics.median(summary["ready_s"])
    print(json.dumps(summary))
    checks = [summary.get(k, {}).get("rc", 0) for k in ("doctor", "selftest")]
    return 0 if summary["exit"] == 0 and not any(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
