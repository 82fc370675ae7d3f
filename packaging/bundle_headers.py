"""Rebuild probes/headers/: the kernel header set gpuguard carries for nodes without headers.

    sudo .venv/bin/python packaging/bundle_headers.py [--abi 6.1.0-57 --version 6.1.192-3]

Reproducible: the set is cut from two pinned Debian packages (linux-headers-ABI-common and
linux-headers-ABI-amd64, fetched with apt-get download and checked against the hashes in
the manifest when they are already pinned there), and holds exactly the files clang opens
while bcc compiles every probe program gpuguard builds, in every flag variant (traced with
strace).  The tarball is written byte for byte the same from the same inputs: sorted names,
zero times and owners, xz preset 9e.  The manifest lists each file's sha256; the tests check
the tarball against it and compile every probe with it in a namespace with no host headers.
Run it again when a probe gains an #include or the pinned packages move (a new ABI in
Debian); then commit probes/headers/ whole.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "probes" / "headers"
MANIFEST = OUT / "manifest.json"
ARCH = "x86_64"
DEB_ARCH = "amd64"

# Run under strace by this script: every probe program, in every variant of its flags, compiled
# by the same calls as the agent's (BCC_KERNEL_SOURCE names the tree to trace).
COMPILE_ALL = r"""
import itertools, sys
from pathlib import Path
import bcc
from gpuguard.respond import bpf_pins
from gpuguard.sources.ebpf.fpu_probe import FpuProbe
from gpuguard.sources.ebpf.probe_load import compile_probes
from gpuguard.sources.ebpf.probe_source import ProbeSettings

for hook, perf, payload, filt in itertools.product(
    ("tracepoint", "raw"), (False, True), (False, True), (False, True)
):
    s = ProbeSettings(enter_hook=hook, perf_buffer=perf, payload_capture=payload, exec_filter=filt)
    compile_probes(bcc, s.cflags()).cleanup()
fpu = FpuProbe.open(bcc)
assert fpu.loaded, fpu.blind_spot
fpu.close()
for src in ("respond_cgroup.bpf.c", "respond_touch.bpf.c"):
    bpf_pins.compile_program(src, Path(sys.argv[1])).cleanup()
"""


def say(msg: str) -> None:
    print(f"bundle-headers: {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    say(msg)
    sys.exit(2)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_debs(abi: str, version: str, work: Path, pinned: dict[str, str]) -> dict[str, str]:
    """Download the two header packages at exactly ``version``; {package: sha256 of the .deb}."""
    names = [f"linux-headers-{abi}-common", f"linux-headers-{abi}-{DEB_ARCH}"]
    subprocess.run(["apt-get", "update", "-q"], check=False, stdout=subprocess.DEVNULL)
    got = {}
    for name in names:
        done = subprocess.run(
            ["apt-get", "download", "-q", f"{name}={version}"], cwd=work, capture_output=True
        )
        if done.returncode != 0:
            die(
                f"apt-get download {name}={version} failed: {done.stderr.decode().strip()[:200]} "
                "(fix: pick the ABI and version Debian serves now: apt-cache policy linux-headers-amd64)"
            )
        deb = next(work.glob(f"{name}_*.deb"))
        digest = sha256(deb.read_bytes())
        if name in pinned and pinned[name] != digest:
            die(f"{deb.name} does not match the pinned sha256 {pinned[name]} (fix: find out why)")
        got[name] = digest
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
    return got


def merged_tree(work: Path, abi: str) -> Path:
    """One kernel tree the way bcc reads BCC_KERNEL_SOURCE: -common with -amd64's generated files."""
    src = work / "root" / "usr" / "src"
    tree = work / "tree"
    for part in (f"linux-headers-{abi}-common", f"linux-headers-{abi}-{DEB_ARCH}"):
        for path in sorted((src / part).rglob("*")):
            if path.is_file() and not path.is_symlink():
                dest = tree / path.relative_to(src / part)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
    return tree


def traced_files(tree: Path) -> list[str]:
    """The tree's files that clang opened while bcc compiled every probe variant."""
    if shutil.which("strace") is None:
        die("strace is not installed (fix: apt-get install strace)")
    pins = Path(tempfile.mkdtemp(prefix="gg-bundle-", dir="/sys/fs/bpf"))
    (pins / "maps").mkdir()
    log = tree.parent / "strace.log"
    env = dict(os.environ, BCC_KERNEL_SOURCE=str(tree), PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=openat,open", "-e", "status=successful"]
            + ["-o", str(log), sys.executable, "-c", COMPILE_ALL, str(pins)],
            env=env,
            capture_output=True,
        )
    finally:
        shutil.rmtree(pins, ignore_errors=True)
    if done.returncode != 0:
        die(f"compiling the probes failed: {done.stderr.decode().strip()[-400:]}")
    found = set()
    for match in re.finditer(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]+)"', log.read_text()):
        path = match.group(1)
        rel = os.path.normpath(path[len(str(tree)) + 1 :] if path.startswith(f"{tree}/") else path)
        if not rel.startswith("/") and (tree / rel).is_file():
            found.add(rel)
    if "include/linux/kconfig.h" not in found:
        die(
            "the trace shows no include/linux/kconfig.h: bcc did not read the tree (fix: check bcc)"
        )
    return sorted(found)


def tarball(tree: Path, files: list[str]) -> bytes:
    """The files as a tar.xz that is the same bytes every time."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel in files:
            data = (tree / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    parser.add_argument("--abi", default=old.get("abi", "6.1.0-57"))
    parser.add_argument("--version", default=old.get("debian_version", "6.1.192-3"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        die(
            "compiling the probes needs root (fix: sudo .venv/bin/python packaging/bundle_headers.py)"
        )
    pinned = old.get("packages", {}) if old.get("debian_version") == args.version else {}
    with tempfile.TemporaryDirectory(prefix="gg-headers-") as tmp:
        work = Path(tmp)
        say(f"fetching linux-headers-{args.abi}-{{common,{DEB_ARCH}}} {args.version}")
        debs = fetch_debs(args.abi, args.version, work, pinned)
        tree = merged_tree(work, args.abi)
        say("tracing the compile of every probe program (about a minute)")
        files = traced_files(tree)
        blob = tarball(tree, files)
        hashes = {rel: sha256((tree / rel).read_bytes()) for rel in files}
    name = f"linux-{args.version.split('-')[0]}-{ARCH}.tar.xz"
    for stale in OUT.glob("*.tar.xz"):
        stale.unlink()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_bytes(blob)
    manifest = {
        "what": "the kernel headers bcc needs to compile gpuguard's probes (UAPI and what bcc's helpers include)",
        "license": "GPL-2.0 (include/uapi: GPL-2.0 WITH Linux-syscall-note), from the Linux kernel via Debian",
        "made_by": "packaging/bundle_headers.py",
        "arch": ARCH,
        "abi": args.abi,
        "debian_version": args.version,
        "packages": debs,
        "tarball": name,
        "tarball_sha256": sha256(blob),
        "files": hashes,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    say(f"wrote {OUT / name}: {len(files)} files, {len(blob)} bytes")


if __name__ == "__main__":
    main()
