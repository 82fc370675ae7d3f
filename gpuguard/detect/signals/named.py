"""The named signals rule conditions test, each computed here by the name it has in the rules file.

A signal has a type (``bool``, ``number``, ``text``, ``texts`` — a set of
texts, ``numbers`` — a set of numbers), a group, a description, the state
fields it reads and the function computing it from a :class:`ProcessState`;
each row below defines one, by the name rules use, and
:mod:`gpuguard.detect.signals.table` lists them.  Reading them lazily for one
evaluation is :mod:`gpuguard.detect.signals.reader`; what follows from the
declared inputs (how long a value stays valid, which changes rescore a
process) is :mod:`gpuguard.detect.signals.rescore`.  Costly derivations (parsing the command line,
config files) are kept in detect's memo (:mod:`.memo`) until its facts change.

``None`` means "not available" (no facts, no GPU samples...): a condition on
an unavailable signal never matches.
"""

from __future__ import annotations

import os
import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.correlate.config_files import parse_config_files
from gpuguard.correlate.endpoints import Endpoint, endpoints_in_argv
from gpuguard.correlate.state import ProcessState
from gpuguard.detect.signals.memo import entries_of, keep, kept
from gpuguard.sources.proc.late_evidence import deleted_config_paths

SIGNAL_TYPES = ("bool", "number", "text", "texts", "numbers")
_CMDLINE_MAX = 4096
_ALGO_OPTIONS = ("-a", "--algo", "--algorithm", "-algo", "--coin")


RATE_PERIOD_S = 10.0  # a rate over the last minute falls within 10 s of a process going quiet


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    type: str
    group: str
    description: str
    compute: Callable[..., Any]  # (state, now), or (state, now, argument) with a parameter
    parameter: str | None = None  # a condition key naming what to measure, e.g. ``command``
    # What it reads: ProcessState fields (``network.<field>`` for the NetworkView's) and "now"
    # (the clock); gpuguard.detect.signals.rescore derives caching and rescoring from these, and
    # tests/test_signal_inputs.py fails on a read that is not declared.
    reads: frozenset[str] = frozenset()
    period_s: float | None = None  # reads "now": how often the engine looks at it again


def _signal(
    name: str,
    type_: str,
    group: str,
    description: str,
    parameter: str | None = None,
    *,
    reads: tuple[str, ...],
    period_s: float | None = None,
):
    """Mark a function as the rule signal ``name`` reading ``reads``; it counts once listed in
    detect.signals.table."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        assert type_ in SIGNAL_TYPES
        assert ("now" in reads) == (period_s is not None), f"{name}: the clock needs a period"
        fn.signal = Signal(
            name, type_, group, description, fn, parameter, frozenset(reads), period_s
        )
        return fn

    return mark


# -- derived views (kept in the memo) ----------------------------------------


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if path else ""


@dataclass(slots=True)
class _Cmdline:
    text: str
    endpoints: list[Endpoint]
    flags: set[str]
    algorithms: set[str]


def _cmdline(state: ProcessState) -> _Cmdline:
    entries = entries_of(state)
    cached = kept(entries, state, "cmdline")
    if cached is None:
        argv = state.cmdline[:256]
        flags: set[str] = set()
        algorithms: set[str] = set()
        for i, arg in enumerate(argv):
            if arg.startswith("-") and len(arg) > 1:
                option, has_value, inline = arg.partition("=")
                flags.add(option[:64])
                if option in _ALGO_OPTIONS:
                    value = inline if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
                    if value:
                        algorithms.add(value.lower()[:64])
        cached = keep(
            entries,
            state,
            "cmdline",
            _Cmdline(" ".join(argv)[:_CMDLINE_MAX], endpoints_in_argv(argv), flags, algorithms),
        )
    return cached


def _config(state: ProcessState):
    entries = entries_of(state)
    cached = kept(entries, state, "config")
    if cached is None:
        files = state.facts.config_files if state.facts is not None else {}
        cached = keep(entries, state, "config", parse_config_files(files or {}))
    return cached


# -- identity -----------------------------------------------------------------


@_signal(
    "comm",
    "text",
    "identity",
    "kernel process name (15 characters, settable by the process)",
    reads=("comm",),
)
def _comm(s: ProcessState, now: float) -> str | None:
    return s.comm or None


@_signal("exe", "text", "identity", "resolved executable path", reads=("exe",))
def _exe(s: ProcessState, now: float) -> str | None:
    return s.exe or None


@_signal("exe_name", "text", "identity", "executable file name, lower-case", reads=("exe",))
def _exe_name(s: ProcessState, now: float) -> str | None:
    return _basename(s.exe).lower() or None


@_signal("exe_dir", "text", "identity", "directory of the executable", reads=("exe",))
def _exe_dir(s: ProcessState, now: float) -> str | None:
    return os.path.dirname(s.exe) or None if s.exe else None


@_signal(
    "process_names",
    "texts",
    "identity",
    "comm, executable name and argv[0] name, lower-case",
    reads=("cmdline", "comm", "exe"),
)
def _process_names(s: ProcessState, now: float) -> set[str]:
    names = {s.comm.lower(), _basename(s.exe).lower()}
    if s.cmdline:
        names.add(_basename(s.cmdline[0].split(" ", 1)[0]).lower())
    names.discard("")
    return names


@_signal(
    "comm_differs_from_exe",
    "bool",
    "identity",
    "comm is not the executable's name, nor argv[0]/argv[1] (a script) — masquerading",
    reads=("cmdline", "comm", "exe"),
)
def _comm_differs(s: ProcessState, now: float) -> bool | None:
    if not s.comm or not s.exe:
        return None
    comm = s.comm[:15]
    candidates = [_basename(s.exe)] + [_basename(a.split(" ", 1)[0]) for a in s.cmdline[:2]]
    if s.exe.startswith("/memfd:"):
        candidates.append(s.exe[len("/memfd:") :])
    for name in candidates:
        short = name[:15]
        # "python3" runs python3.11: a prefix ending before a letter is the same program.
        if short == comm or (short.startswith(comm) and not short[len(comm)].isalpha()):
            return False
    return True


@_signal(
    "kernel_thread",
    "bool",
    "identity",
    "a real kernel thread (no executable, child of kthreadd)",
    reads=("facts.kernel_thread",),
)
def _kernel_thread(s: ProcessState, now: float) -> bool | None:
    return s.facts.kernel_thread if s.facts is not None else None


@_signal(
    "has_executable", "bool", "identity", "the process runs a user-space executable", reads=("exe",)
)
def _has_executable(s: ProcessState, now: float) -> bool:
    return bool(s.exe)


@_signal(
    "cmdline_bracketed",
    "bool",
    "identity",
    "command line is one '[name]' word like a kernel thread's, yet it has an executable",
    reads=("cmdline", "exe"),
)
def _cmdline_bracketed(s: ProcessState, now: float) -> bool:
    text = " ".join(s.cmdline).strip()
    return bool(s.exe) and text.startswith("[") and text.endswith("]")


@_signal(
    "exe_deleted",
    "bool",
    "identity",
    "the executable file was deleted after start",
    reads=("facts.exe_deleted",),
)
def _exe_deleted(s: ProcessState, now: float) -> bool | None:
    return s.facts.exe_deleted if s.facts is not None else None


@_signal(
    "exe_memfd",
    "bool",
    "identity",
    "the executable is an anonymous memfd (fileless)",
    reads=("exe", "facts.exe_memfd"),
)
def _exe_memfd(s: ProcessState, now: float) -> bool:
    return (s.facts.exe_memfd if s.facts is not None else False) or s.exe.startswith("/memfd:")


@_signal(
    "exe_memfd_name",
    "text",
    "identity",
    "name the memfd executable was created with (runc_cloned:/proc/self/exe, sealed-...)",
    reads=("exe",),
)
def _exe_memfd_name(s: ProcessState, now: float) -> str | None:
    return s.exe[len("/memfd:") :] or None if s.exe.startswith("/memfd:") else None


@_signal("user", "text", "identity", "user name of the real uid", reads=("facts.username",))
def _user(s: ProcessState, now: float) -> str | None:
    return (s.facts.username or None) if s.facts is not None else None


@_signal("uid", "number", "identity", "real uid", reads=("facts.uid",))
def _uid(s: ProcessState, now: float) -> int | None:
    return s.facts.uid if s.facts is not None and s.facts.uid >= 0 else None


@_signal("cgroup", "text", "identity", "cgroup path", reads=("facts.cgroup",))
def _cgroup(s: ProcessState, now: float) -> str | None:
    return (s.facts.cgroup or None) if s.facts is not None else None


@_signal(
    "container_id",
    "text",
    "identity",
    "container id from the cgroup, if in a container",
    reads=("facts.container_id",),
)
def _container_id(s: ProcessState, now: float) -> str | None:
    return s.facts.container_id if s.facts is not None else None


@_signal(
    "in_container",
    "bool",
    "identity",
    "the process runs in a container",
    reads=("facts.container_id",),
)
def _in_container(s: ProcessState, now: float) -> bool | None:
    return s.facts.container_id is not None if s.facts is not None else None


@_signal("ld_preload", "text", "identity", "LD_PRELOAD value", reads=("facts.ld_preload",))
def _ld_preload(s: ProcessState, now: float) -> str | None:
    return s.facts.ld_preload if s.facts is not None else None


@_signal(
    "ld_preload_set",
    "bool",
    "identity",
    "LD_PRELOAD is set (library injection, /proc hiding)",
    reads=("facts.environ_readable", "facts.ld_preload"),
)
def _ld_preload_set(s: ProcessState, now: float) -> bool | None:
    if s.facts is None or not s.facts.environ_readable:
        return None
    return bool(s.facts.ld_preload)


@_signal(
    "age_s",
    "number",
    "time",
    "seconds since the process started",
    reads=("key", "now"),
    period_s=60.0,
)
def _age(s: ProcessState, now: float) -> float:
    return max(0.0, now - s.key.start_time)


@_signal(
    "hour_of_day",
    "number",
    "time",
    "hour (0-23, UTC) at evaluation time",
    reads=("now",),
    period_s=3600.0,
)
def _hour(s: ProcessState, now: float) -> int | None:
    try:
        return _time.gmtime(now).tm_hour
    except (OverflowError, ValueError, OSError):  # a replayed clock can hold any number
        return None


@_signal("exited", "bool", "time", "the process has exited", reads=("exited_at",))
def _exited(s: ProcessState, now: float) -> bool:
    return s.exited_at is not None


# -- command line and config files --------------------------------------------


@_signal(
    "cmdline",
    "text",
    "cmdline",
    "command line, arguments joined by spaces (first 4096 characters)",
    reads=("cmdline",),
)
def _cmdline_text(s: ProcessState, now: float) -> str | None:
    return _cmdline(s).text or None


@_signal(
    "cmdline_flags",
    "texts",
    "cmdline",
    "option names on the command line (--donate-level=1 gives --donate-level)",
    reads=("cmdline",),
)
def _cmdline_flags(s: ProcessState, now: float) -> set[str]:
    return _cmdline(s).flags


@_signal(
    "cmdline_algorithm",
    "texts",
    "cmdline",
    "values of -a/--algo/--algorithm/--coin, lower-case",
    reads=("cmdline",),
)
def _cmdline_algorithm(s: ProcessState, now: float) -> set[str]:
    return _cmdline(s).algorithms


def _schemes(endpoints: list[Endpoint]) -> set[str]:
    return {e.scheme for e in endpoints if e.scheme}


def _hosts(endpoints: list[Endpoint]) -> set[str]:
    return {e.host for e in endpoints}


def _ports(endpoints: list[Endpoint]) -> set[int]:
    return {e.port for e in endpoints if e.port}


@_signal(
    "cmdline_url_schemes",
    "texts",
    "cmdline",
    "URL schemes on the command line (stratum+tcp...)",
    reads=("cmdline",),
)
def _cmdline_schemes(s: ProcessState, now: float) -> set[str]:
    return _schemes(_cmdline(s).endpoints)


@_signal(
    "cmdline_endpoints",
    "texts",
    "cmdline",
    "URLs and pool-option host:port values on the command line",
    reads=("cmdline",),
)
def _cmdline_endpoints(s: ProcessState, now: float) -> set[str]:
    return {str(e) for e in _cmdline(s).endpoints}


@_signal(
    "cmdline_hosts",
    "texts",
    "cmdline",
    "host names/addresses in command-line URLs and pool options",
    reads=("cmdline",),
)
def _cmdline_hosts(s: ProcessState, now: float) -> set[str]:
    return _hosts(_cmdline(s).endpoints)


@_signal(
    "cmdline_ports",
    "numbers",
    "cmdline",
    "ports in command-line URLs and pool options",
    reads=("cmdline",),
)
def _cmdline_ports(s: ProcessState, now: float) -> set[int]:
    return _ports(_cmdline(s).endpoints)


@_signal(
    "config_keys",
    "texts",
    "config",
    "setting names in config files beside/named by the process, lower-case",
    reads=("facts.config_files",),
)
def _config_keys(s: ProcessState, now: float) -> set[str]:
    return _config(s).keys


@_signal(
    "config_deleted",
    "texts",
    "config",
    "config files it named on its command line or held open that were deleted after start",
    reads=("facts.config_files",),
)
def _config_deleted(s: ProcessState, now: float) -> set[str]:
    files = s.facts.config_files if s.facts is not None else {}
    return deleted_config_paths(files or {})


@_signal(
    "config_url_schemes",
    "texts",
    "config",
    "URL schemes in its config files",
    reads=("facts.config_files",),
)
def _config_schemes(s: ProcessState, now: float) -> set[str]:
    return _schemes(_config(s).endpoints)


@_signal(
    "config_endpoints",
    "texts",
    "config",
    "URLs and host:port values in its config files",
    reads=("facts.config_files",),
)
def _config_endpoints(s: ProcessState, now: float) -> set[str]:
    return {str(e) for e in _config(s).endpoints}


@_signal(
    "config_hosts",
    "texts",
    "config",
    "host names in its config files",
    reads=("facts.config_files",),
)
def _config_hosts(s: ProcessState, now: float) -> set[str]:
    return _hosts(_config(s).endpoints)


@_signal(
    "config_ports", "numbers", "config", "ports in its config files", reads=("facts.config_files",)
)
def _config_ports(s: ProcessState, now: float) -> set[int]:
    return _ports(_config(s).endpoints)


# -- network ------------------------------------------------------------------


@_signal(
    "connect_ports", "numbers", "network", "remote ports it connected to", reads=("network.ports",)
)
def _connect_ports(s: ProcessState, now: float) -> set[int]:
    return s.network.ports


@_signal(
    "connect_addresses",
    "texts",
    "network",
    "remote addresses it connected to",
    reads=("network.addresses",),
)
def _connect_addresses(s: ProcessState, now: float) -> set[str]:
    return s.network.addresses


@_signal("connect_count", "number", "network", "connect attempts", reads=("connect_total",))
def _connect_count(s: ProcessState, now: float) -> int:
    return s.connect_total


@_signal(
    "connected_to_revealed_port",
    "bool",
    "network",
    "it connected to a port named in its own command line or config (the pool it was told to use)",
    reads=("cmdline", "facts.config_files", "network.ports"),
)
def _connected_revealed(s: ProcessState, now: float) -> bool:
    ports = s.network.ports
    if not ports:
        return False
    revealed = _ports(_cmdline(s).endpoints) | _ports(_config(s).endpoints)
    return bool(ports & revealed)


@_signal(
    "payload_protocols",
    "texts",
    "network",
    "protocols recognised in its first payload bytes (stratum, cryptonote, ethproxy, socks5, tls...)",
    reads=("payload_protocols",),
)
def _payload_protocols(s: ProcessState, now: float) -> set[str]:
    return s.payload_protocols


@_signal(
    "payload_agents",
    "texts",
    "network",
    "client agent strings in payloads (cryptonote login agent)",
    reads=("network.agents",),
)
def _payload_agents(s: ProcessState, now: float) -> set[str]:
    return s.network.agents


@_signal(
    "payload_methods",
    "texts",
    "network",
    "JSON-RPC/HTTP methods in payloads",
    reads=("network.methods",),
)
def _payload_methods(s: ProcessState, now: float) -> set[str]:
    return s.network.methods


@_signal(
    "payload_logins",
    "texts",
    "network",
    "login/user values in payloads (a wallet, for pool logins)",
    reads=("network.logins",),
)
def _payload_logins(s: ProcessState, now: float) -> set[str]:
    return s.network.logins


@_signal(
    "payload_hosts",
    "texts",
    "network",
    "host names it revealed on the wire: TLS SNI, HTTP Host/CONNECT, SOCKS target",
    reads=("network.payload_hosts",),
)
def _payload_hosts(s: ProcessState, now: float) -> set[str]:
    return s.network.payload_hosts


@_signal(
    "tls_ja4",
    "texts",
    "network",
    "JA4 fingerprints of the TLS ClientHellos it sent (its TLS library and settings, e.g. "
    "'t13i310900_e8f1e7e78f70_1f22a2ca17c4': TLS 1.3, no SNI, 31 suites, 9 extensions, no ALPN)",
    reads=("payloads",),
)
def _tls_ja4(s: ProcessState, now: float) -> set[str]:
    return {
        p.detail["ja4"]
        for p in s.payloads
        if p.protocol == "tls" and isinstance(p.detail.get("ja4"), str)
    }


@_signal(
    "proxy_target_hosts",
    "texts",
    "network",
    "hosts it asked a SOCKS/HTTP proxy to reach",
    reads=("network.proxy_hosts",),
)
def _proxy_hosts(s: ProcessState, now: float) -> set[str]:
    return s.network.proxy_hosts


@_signal(
    "proxy_target_ports",
    "numbers",
    "network",
    "ports it asked a SOCKS/HTTP proxy to reach",
    reads=("network.proxy_ports",),
)
def _proxy_ports(s: ProcessState, now: float) -> set[int]:
    return s.network.proxy_ports


@_signal(
    "revealed_hosts",
    "texts",
    "network",
    "every host it named: command line, config files and payloads",
    reads=("cmdline", "facts.config_files", "network.payload_hosts"),
)
def _revealed_hosts(s: ProcessState, now: float) -> set[str]:
    return _hosts(_cmdline(s).endpoints) | _hosts(_config(s).endpoints) | s.network.payload_hosts


# -- GPU ----------------------------------------------------------------------


@_signal(
    "gpu_device_classes",
    "texts",
    "gpu",
    "GPU device classes opened (nvidia, nvidia-ctl, nvidia-uvm, kfd, drm-render, pci-bar, mem...)",
    reads=("gpu_device_classes",),
)
def _gpu_classes(s: ProcessState, now: float) -> set[str]:
    return s.gpu_device_classes


@_signal(
    "device_classes_written",
    "texts",
    "gpu",
    "device classes it opened for writing (msr, msr-config, hugepages-config: CPU miners tuning the host)",
    reads=("device_classes_written",),
)
def _device_classes_written(s: ProcessState, now: float) -> set[str]:
    return s.device_classes_written


@_signal("gpu_paths", "texts", "gpu", "GPU device paths opened", reads=("gpu_paths",))
def _gpu_paths(s: ProcessState, now: float) -> set[str]:
    return s.gpu_paths


@_signal(
    "ioctl_names", "texts", "gpu", "decoded GPU ioctl command names issued", reads=("ioctl_counts",)
)
def _ioctl_names(s: ProcessState, now: float) -> set[str]:
    return set(s.ioctl_counts)


@_signal(
    "ioctl_categories",
    "texts",
    "gpu",
    "GPU ioctl categories issued (submit, memory, query, setup, other)",
    reads=("ioctl_categories",),
)
def _ioctl_categories(s: ProcessState, now: float) -> set[str]:
    return s.ioctl_categories


@_signal("ioctl_total", "number", "gpu", "GPU ioctls issued in total", reads=("ioctl_total",))
def _ioctl_total(s: ProcessState, now: float) -> int:
    return s.ioctl_total


@_signal(
    "ioctl_query_only",
    "bool",
    "gpu",
    "every GPU ioctl was a query or set-up (a monitor, not a compute job)",
    reads=("ioctl_categories",),
)
def _ioctl_query_only(s: ProcessState, now: float) -> bool | None:
    if not s.ioctl_categories:
        return None
    return s.ioctl_categories <= {"query", "setup"}


def _category_rate(s: ProcessState, now: float, category: str) -> float:
    window = s.ioctl_rates.get(category)
    return window.rate(now) if window is not None else 0.0


@_signal(
    "ioctl_rate_submit",
    "number",
    "gpu",
    "'submit' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_rate_submit(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "submit")


@_signal(
    "ioctl_rate_memory",
    "number",
    "gpu",
    "'memory' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_rate_memory(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "memory")


@_signal(
    "ioctl_rate_query",
    "number",
    "gpu",
    "'query' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_rate_query(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "query")


@_signal(
    "ioctl_rate_setup",
    "number",
    "gpu",
    "'setup' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_rate_setup(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "setup")


@_signal(
    "ioctl_rate_other",
    "number",
    "gpu",
    "'other' GPU ioctls per second over the last minute",
    reads=("ioctl_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_rate_other(s: ProcessState, now: float) -> float:
    return _category_rate(s, now, "other")


@_signal(
    "ioctl_command_rate",
    "number",
    "gpu",
    "GPU ioctls per second over the last minute of one decoded command, "
    "named by the condition's `command:` (e.g. UVM_REGISTER_CHANNEL)",
    parameter="command",
    reads=("ioctl_command_rates", "now"),
    period_s=RATE_PERIOD_S,
)
def _ioctl_command_rate(s: ProcessState, now: float, command: str | None = None) -> float | None:
    if command is None:
        return None
    window = s.ioctl_command_rates.get(command)
    return window.rate(now) if window is not None else 0.0


@_signal(
    "gpu_util_mean",
    "number",
    "gpu",
    "mean per-process GPU (SM) utilisation %, last 5 minutes",
    reads=("gpu_util",),
)
def _gpu_util_mean(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.mean


@_signal(
    "gpu_util_variance",
    "number",
    "gpu",
    "variance of per-process GPU utilisation, last 5 minutes (miners: very low)",
    reads=("gpu_util",),
)
def _gpu_util_variance(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.variance


@_signal(
    "gpu_util_min",
    "number",
    "gpu",
    "lowest per-process GPU utilisation %, last 5 minutes",
    reads=("gpu_util",),
)
def _gpu_util_min(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.minimum


@_signal(
    "gpu_util_latest", "number", "gpu", "latest per-process GPU utilisation %", reads=("gpu_util",)
)
def _gpu_util_latest(s: ProcessState, now: float) -> float | None:
    return s.gpu_util.latest


@_signal(
    "gpu_util_samples",
    "number",
    "gpu",
    "GPU utilisation samples in the window",
    reads=("gpu_util",),
)
def _gpu_util_samples(s: ProcessState, now: float) -> int:
    return len(s.gpu_util)


@_signal(
    "gpu_util_window_s",
    "number",
    "gpu",
    "seconds covered by the GPU utilisation window",
    reads=("gpu_util",),
)
def _gpu_util_window(s: ProcessState, now: float) -> float:
    return s.gpu_util.duration_s


@_signal("gpu_memory_bytes", "number", "gpu", "GPU memory used now, bytes", reads=("gpu_memory",))
def _gpu_memory(s: ProcessState, now: float) -> float | None:
    return s.gpu_memory.latest


@_signal(
    "gpu_memory_fraction",
    "number",
    "gpu",
    "GPU memory used / total of its GPUs (0-1)",
    reads=("gpu_memory", "gpu_memory_total"),
)
def _gpu_memory_fraction(s: ProcessState, now: float) -> float | None:
    used = s.gpu_memory.latest
    if used is None or not s.gpu_memory_total:
        return None
    return used / s.gpu_memory_total


@_signal(
    "cpu_percent_mean",
    "number",
    "cpu",
    "mean CPU % (100 = one core), last 5 minutes",
    reads=("cpu",),
)
def _cpu_mean(s: ProcessState, now: float) -> float | None:
    return s.cpu.mean


@_signal("cpu_window_s", "number", "cpu", "seconds covered by the CPU window", reads=("cpu",))
def _cpu_window(s: ProcessState, now: float) -> float:
    return s.cpu.duration_s


# Runnable threads (schedstat), from the latest CpuActivity: the agent's look every housekeeping
# period, or scan's one lifetime read (its SSE rounding modes: detect.signals.rounding).


def _activity(s: ProcessState):
    return s.cpu_activity


@_signal(
    "cpu_spinning_threads",
    "number",
    "cpu",
    "threads runnable (on a CPU or queued for one) >= 90 % of their life or of the latest "
    "sampling interval; nice 19, a thread cap or a busy host do not lower it",
    reads=("cpu_activity",),
)
def _cpu_spinning_threads(s: ProcessState, now: float) -> int | None:
    a = _activity(s)
    return a.spinning_threads if a is not None else None


@_signal(
    "cpu_spin_s",
    "number",
    "cpu",
    "seconds over which a thread was measured spinning (its lifetime, or the sampling interval)",
    reads=("cpu_activity",),
)
def _cpu_spin_s(s: ProcessState, now: float) -> float | None:
    a = _activity(s)
    return a.spin_span_s if a is not None and a.spinning_threads else None


@_signal(
    "cpu_runnable_max",
    "number",
    "cpu",
    "highest runnable fraction of one thread (0-1)",
    reads=("cpu_activity",),
)
def _cpu_runnable_max(s: ProcessState, now: float) -> float | None:
    a = _activity(s)
    return a.runnable_max if a is not None else None


@_signal(
    "cpu_ran_share",
    "number",
    "cpu",
    "of its spinning threads' runnable time, the share they ran (1: had the CPUs; low: "
    "niced or crowded out, yet never sleeping)",
    reads=("cpu_activity",),
)
def _cpu_ran_share(s: ProcessState, now: float) -> float | None:
    a = _activity(s)
    return a.ran_share if a is not None else None


# -- huge pages ------------------------------------------------------------------
# The sensor's requests (mmap MAP_HUGETLB / shmget SHM_HUGETLB) and what /proc shows it
# maps (hugetlb only: transparent huge pages are no sign of anything).


@_signal(
    "huge_alloc_bytes",
    "number",
    "memory",
    "largest hugetlb allocation: one request the sensor saw, or all it maps now (/proc); RandomX: 256 MiB, ~2 GiB",
    reads=("facts.hugetlb_bytes", "huge_alloc_bytes"),
)
def _huge_alloc_bytes(s: ProcessState, now: float) -> int | None:
    mapped = s.facts.hugetlb_bytes if s.facts is not None else None
    largest = max(s.huge_alloc_bytes, mapped or 0)
    return largest or None


@_signal(
    "huge_page_size",
    "number",
    "memory",
    "largest huge page size (bytes) it asked for or maps (1 GiB: RandomX 1gb-pages)",
    reads=("facts.hugetlb_page_size", "huge_page_size"),
)
def _huge_page_size(s: ProcessState, now: float) -> int | None:
    mapped = s.facts.hugetlb_page_size if s.facts is not None else None
    largest = max(s.huge_page_size, mapped or 0)
    return largest or None


# RandomX's own allocations: the 256 MiB cache and the dataset (2 GiB + 33554368 bytes),
# as asked for or rounded up to 2 MiB pages; with 1 GiB pages the cache takes one page and
# the dataset three.  A JVM heap or database buffers in huge pages have the size they were
# configured with, a round 256 MiB being the one that collides.
RANDOMX_LENGTHS = frozenset({256 << 20, 2181038016, 2080 << 20})
RANDOMX_GIB_PAGE_LENGTHS = frozenset({1 << 30, 3 << 30})


def _randomx_length(length: int, page_size: int) -> bool:
    return length in RANDOMX_LENGTHS or (
        page_size >= 1 << 30 and length in RANDOMX_GIB_PAGE_LENGTHS
    )


@_signal(
    "huge_alloc_randomx_shape",
    "bool",
    "memory",
    "a huge-page request or mapping of exactly RandomX's size: the 256 MiB cache or the "
    "2080 MiB dataset (1 GiB pages: one or three of them)",
    reads=("facts.hugetlb_mappings", "huge_requests"),
)
def _huge_alloc_randomx_shape(s: ProcessState, now: float) -> bool:
    if any(_randomx_length(length, page) for length, page in s.huge_requests):
        return True
    mappings = s.facts.hugetlb_mappings if s.facts is not None else []
    return any(_randomx_length(length, page) for length, page in mappings)


# -- scanning and ancestry ----------------------------------------------------


@_signal(
    "yara_rules",
    "texts",
    "yara",
    "YARA rules that matched its executable, command line, environment or memory",
    reads=("yara_matches",),
)
def _yara_rules(s: ProcessState, now: float) -> set[str]:
    return s.yara_matches


@_signal("yara_tags", "texts", "yara", "tags of the YARA rules that matched", reads=("yara_tags",))
def _yara_tags(s: ProcessState, now: float) -> set[str]:
    return s.yara_tags


def _ancestors(s: ProcessState) -> list:
    return s.facts.ancestors if s.facts is not None else []


@_signal("parent_name", "text", "ancestry", "parent's comm, lower-case", reads=("facts.ancestors",))
def _parent_name(s: ProcessState, now: float) -> str | None:
    a = _ancestors(s)
    return a[0].comm.lower() if a else None


@_signal("parent_exe", "text", "ancestry", "parent's executable", reads=("facts.ancestors",))
def _parent_exe(s: ProcessState, now: float) -> str | None:
    a = _ancestors(s)
    return (a[0].exe or None) if a else None


@_signal(
    "ancestor_names",
    "texts",
    "ancestry",
    "comm and executable names of all ancestors (up to 8), lower-case",
    reads=("facts.ancestors",),
)
def _ancestor_names(s: ProcessState, now: float) -> set[str]:
    names = {a.comm.lower() for a in _ancestors(s)} | {
        _basename(a.exe).lower() for a in _ancestors(s)
    }
    names.discard("")
    return names


@_signal(
    "ancestor_exes", "texts", "ancestry", "executables of all ancestors", reads=("facts.ancestors",)
)
def _ancestor_exes(s: ProcessState, now: float) -> set[str]:
    return {a.exe for a in _ancestors(s) if a.exe}


@_signal(
    "parent_verdict",
    "text",
    "ancestry",
    "the parent's current verdict (clean, suspicious, malicious)",
    reads=("parent_verdict",),
)
def _parent_verdict(s: ProcessState, now: float) -> str | None:
    return s.parent_verdict.verdict if s.parent_verdict is not None else None


@_signal(
    "parent_score", "number", "ancestry", "the parent's current score", reads=("parent_verdict",)
)
def _parent_score(s: ProcessState, now: float) -> int | None:
    return s.parent_verdict.score if s.parent_verdict is not None else None
