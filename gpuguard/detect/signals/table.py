"""The rule signals, listed once: every function a rule condition can name, in one explicit table.

A signal is defined where it is computed (``@_signal(name, type, group, description,
reads=...)`` in :mod:`.named`, :mod:`.rounding` or :mod:`.behaviour`, declaring the inputs it reads)
and counts once it is listed here; nothing registers itself when its module is imported.
Adding a signal is its definition plus one line below (tests/test_layers.py fails on a
defined signal missing from this list, tests/test_signal_inputs.py on an undeclared read).

The order is the order the signals are documented in (``gpuguard rules signals`` sorts by group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuguard.detect.signals import behaviour, rounding
from gpuguard.detect.signals import named as process
from gpuguard.detect.signals.named import Signal

SIGNAL_FUNCTIONS: tuple[Callable[..., Any], ...] = (
    process._comm,
    process._exe,
    process._exe_name,
    process._exe_dir,
    process._process_names,
    process._comm_differs,
    process._kernel_thread,
    process._has_executable,
    process._cmdline_bracketed,
    process._exe_deleted,
    process._exe_memfd,
    process._exe_memfd_name,
    process._user,
    process._uid,
    process._cgroup,
    process._container_id,
    process._in_container,
    process._ld_preload,
    process._ld_preload_set,
    process._age,
    process._hour,
    process._exited,
    process._cmdline_text,
    process._cmdline_flags,
    process._cmdline_algorithm,
    process._cmdline_schemes,
    process._cmdline_endpoints,
    process._cmdline_hosts,
    process._cmdline_ports,
    process._config_keys,
    process._config_deleted,
    process._config_schemes,
    process._config_endpoints,
    process._config_hosts,
    process._config_ports,
    process._connect_ports,
    process._connect_addresses,
    process._connect_count,
    process._connected_revealed,
    process._payload_protocols,
    process._payload_agents,
    process._payload_methods,
    process._payload_logins,
    process._payload_hosts,
    process._tls_ja4,
    process._proxy_hosts,
    process._proxy_ports,
    process._revealed_hosts,
    process._gpu_classes,
    process._device_classes_written,
    process._gpu_paths,
    process._ioctl_names,
    process._ioctl_categories,
    process._ioctl_total,
    process._ioctl_query_only,
    process._ioctl_rate_submit,
    process._ioctl_rate_memory,
    process._ioctl_rate_query,
    process._ioctl_rate_setup,
    process._ioctl_rate_other,
    process._ioctl_command_rate,
    process._gpu_util_mean,
    process._gpu_util_variance,
    process._gpu_util_min,
    process._gpu_util_latest,
    process._gpu_util_samples,
    process._gpu_util_window,
    process._gpu_memory,
    process._gpu_memory_fraction,
    process._cpu_mean,
    process._cpu_window,
    process._cpu_spinning_threads,
    process._cpu_spin_s,
    process._cpu_runnable_max,
    process._cpu_ran_share,
    rounding._fpu_watched,
    rounding._fpu_rounding_changes,
    rounding._fpu_rounding_nondefault,
    rounding._fpu_rounding_s,
    rounding._fpu_rounding_looks,
    rounding._fpu_rounding_modes,
    rounding._fpu_rounding_min_share,
    rounding._fpu_rounding_uniform_p,
    rounding._fpu_rounding_uniform_distance,
    rounding._fpu_rounding_independent_p,
    rounding._fpu_rounding_dependence,
    rounding._fpu_rounding_random,
    rounding._fpu_rounding_sleepless_threads,
    process._huge_alloc_bytes,
    process._huge_page_size,
    process._huge_alloc_randomx_shape,
    process._yara_rules,
    process._yara_tags,
    process._parent_name,
    process._parent_exe,
    process._ancestor_names,
    process._ancestor_exes,
    process._parent_verdict,
    process._parent_score,
    behaviour._gpu_profile,
    behaviour._memctl_mean,
    behaviour._power_variation,
    behaviour._pcie,
    behaviour._allocation_stable,
    behaviour._memory_growth,
    behaviour._device_shared,
    behaviour._duty_cycle,
    behaviour._pauses_when_watched,
    behaviour._night_only,
    behaviour._lifetime_util,
    behaviour._lifetime_s,
    behaviour._session_cadence,
    behaviour._session_age,
    behaviour._session_rate,
    behaviour._session_segments_out,
    behaviour._session_bytes_in_per_write,
    behaviour._session_summary,
    behaviour._quiet_session_age,
    behaviour._quiet_session_summary,
    behaviour._quiet_session_pushes,
    behaviour._quiet_session_push_s,
    behaviour._quiet_session_by_address,
    behaviour._quiet_session_bytes_per_cpu_s,
)


def signal_table(functions: tuple[Callable[..., Any], ...]) -> dict[str, Signal]:
    """``{name: Signal}`` of the listed signal functions; a name listed twice is a programming error."""
    table: dict[str, Signal] = {}
    for fn in functions:
        signal = fn.signal
        assert signal.name not in table, f"signal {signal.name} listed twice"
        table[signal.name] = signal
    return table


SIGNALS: dict[str, Signal] = signal_table(SIGNAL_FUNCTIONS)
