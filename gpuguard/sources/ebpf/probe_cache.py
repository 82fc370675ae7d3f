"""Compiled probes kept on disk, so a later start on the same kernel skips bcc's compile.

For one probe text, set of flags, kernel and bcc, bcc's compile (~2 s of CPU) always yields the
same programs and maps.  That result is kept under ``/var/cache/gpuguard/probes`` (root's alone);
a start with the same key makes the maps, writes their fds into the instructions and loads the
programs itself, and the kernel's verifier checks them as it checks bcc's.  Python gets bcc's
own table and attach objects either way.  A result holding anything not rebuilt here is not
kept.  ``GPUGUARD_PROBE_CACHE`` names another directory, or ``off``.  The key, the format and
the safety rules: docs/agent.md, "The probe cache".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuguard.config.cache_file import read_cache_file, write_cache_file
from gpuguard.sources.ebpf.image_bpf import loaded_image
from gpuguard.sources.ebpf.kernel_headers import HEADERS, HeaderSource, compile_with_headers
from gpuguard.sources.ebpf.probe_image import FORMAT, ProbeImage, capture

DEFAULT_DIR = Path("/var/cache/gpuguard/probes")
ENV = "GPUGUARD_PROBE_CACHE"  # a directory, or "off"
KEEP = 16  # entries kept; a store removes the oldest beyond these
MAX_BYTES = 16 << 20
SUFFIX = ".probes"


def cache_dir() -> Path | None:
    """Where images are kept (None: not kept, as when not root or ``GPUGUARD_PROBE_CACHE=off``)."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() == "off" or os.geteuid() != 0:
        return None
    return Path(chosen) if chosen else DEFAULT_DIR


def cache_key(bcc, text: str, cflags: list[str], offered: HeaderSource) -> str:
    """The name an image goes by: a digest of everything its instructions depend on."""
    uname = os.uname()
    parts = {
        "format": FORMAT,
        "bcc": [str(getattr(bcc, "__version__", "?")), _library_identity("libbcc.so")],
        "kernel": [uname.release, uname.version, uname.machine, _possible_cpus()],
        "headers": [offered.kind, offered.path, _file_identity(offered.path)],
        "cflags": list(cflags),
        "text": hashlib.sha256(text.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _possible_cpus() -> str:
    try:
        return Path("/sys/devices/system/cpu/possible").read_text().strip()
    except OSError:
        return str(os.cpu_count())


def _file_identity(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


def _library_identity(stem: str) -> str:
    """The loaded library file named ``stem…`` (path, size, mtime), from this process's maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and f"/{stem}" in f"/{path}":
                    return f"/{path}:{_file_identity('/' + path)}"
    except OSError:
        pass
    return ""


@dataclass(frozen=True, slots=True)
class Loaded:
    """Probes ready to attach, and how they came to be."""

    bpf: object
    headers: HeaderSource
    cached: bool  # loaded from an image (True) or compiled by bcc now (False)
    note: str | None = None  # a cache that could not be read or written, in one line


def load_probes(bcc, text: str, cflags: list[str]) -> Loaded:
    """The probes in ``text``, not yet attached (``attach_all()`` does that): an image from the
    cache when one matches, else compiled by bcc now, and that kept for next time."""

    def compile_now():
        deferred = deferred_attach_bpf(bcc)
        return compile_with_headers(lambda: deferred(text=text.encode(), cflags=cflags))

    folder = cache_dir()
    if folder is None:
        bpf = compile_now()
        return Loaded(bpf, HEADERS.source, False)
    offered = HEADERS.first_offered()
    name = cache_key(bcc, text, cflags, offered) + SUFFIX
    found = read_cache_file(folder, name, MAX_BYTES, "probe cache")
    note = found.note
    if found.content is not None:
        try:
            image = ProbeImage.unpack(found.content)
        except ValueError as exc:
            note = f"probe cache {folder / name} is unusable ({exc}); it will be rewritten"
        else:
            try:
                bpf = loaded_image(bcc, image)
            except Exception as exc:  # noqa: BLE001 - bcc-style bare Exception: compile instead
                note = f"probe cache {folder / name} did not load ({exc}); compiled instead"
            else:
                return Loaded(bpf, _from_cache(image, folder / name, offered), True, note)
    bpf = compile_now()
    headers = HEADERS.source
    if found.folder_usable:
        image = capture(bcc, bpf, headers)
        if image is not None:  # else that text is compiled at every start
            note = write_cache_file(folder, name, image.pack(), "probe cache") or note
            _prune(folder, keep=name)
    return Loaded(bpf, headers, False, note)


def deferred_attach_bpf(bcc):
    """bcc.BPF whose automatic attach of TRACEPOINT_PROBE/RAW_TRACEPOINT_PROBE
    programs waits for ``attach_all()``, so set-up can finish first."""

    class DeferredAttachBPF(bcc.BPF):
        def _trace_autoload(self) -> None:
            pass

        def attach_all(self) -> None:
            bcc.BPF._trace_autoload(self)

    return DeferredAttachBPF


def _from_cache(image: ProbeImage, path: Path, offered: HeaderSource) -> HeaderSource:
    """The header source an image was compiled with, as a start that loads it reports it: an
    archive's tree was unpacked for that compile and is gone, so the archive is named."""
    made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(image.made))
    why = f"{image.headers.why}; compiled {made}, loaded from the probe cache {path}"
    where = offered.path if offered.kind == image.headers.kind else image.headers.path
    return HeaderSource(image.headers.kind, where, why)


def _prune(folder: Path, keep: str) -> None:
    """Remove the oldest images beyond :data:`KEEP` (another kernel's, other flags')."""
    try:
        entries = [
            (entry.stat().st_mtime, entry)
            for entry in folder.iterdir()
            if entry.name.endswith(SUFFIX) and entry.name != keep and entry.is_file()
        ]
    except OSError:
        return
    for _, entry in sorted(entries, reverse=True)[KEEP - 1 :]:
        with contextlib.suppress(OSError):
            entry.unlink()
