"""Every slot of a bcc array map, as the sensor's batch reader returns them."""

from __future__ import annotations

from gpuguard.sources.ebpf.kernel_maps import lookup_batch


def array_items(table, batch: int = 0) -> list[tuple]:
    """Every (key, value) of the array map, read by :func:`lookup_batch` ``batch`` at a time."""
    keys, values, total = lookup_batch(table, batch)
    return [(keys[i], values[i]) for i in range(total)]
