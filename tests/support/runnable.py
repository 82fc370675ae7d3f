"""One process's spinning threads over their lifetime, read as scan reads them."""

from __future__ import annotations

from gpuguard.sources.proc.cpu_usage import (
    Runnable,
    process_start_after_boot,
    summarize,
    thread_totals,
)


def lifetime_runnable(
    pid: int,
    proc_root: str = "/proc",
    start_after_boot_s: float | None = None,
    single_thread: bool = False,
) -> Runnable | None:
    """Spinning threads over each thread's lifetime (one read, no window);
    ``start_after_boot_s``: the process's start when already known (else read);
    ``single_thread``: see :func:`~gpuguard.sources.proc.cpu_usage.thread_totals`."""
    start = start_after_boot_s
    if start is None:
        start = process_start_after_boot(pid, proc_root)
    if start is None:
        return None
    totals = thread_totals(pid, start, proc_root, single_thread)
    return summarize(totals) if totals is not None else None
