"""PCIe traffic of one NVIDIA GPU without paying 41 ms a sample for it.

Measured on an H100 (driver 580): ``nvmlDeviceGetPcieThroughput`` samples the
link for 20 ms inside every call, so TX + RX cost 41 of the 44 ms one
``NvmlSampler.sample()`` took per GPU; this module reads it more cheaply.

Details: docs/internals.md, "nvml_pcie".
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

SLOW_EVERY_S = 30.0
COUNTERS, THROUGHPUT = "counters", "throughput"


class PcieReader:
    """PCIe TX/RX KB/s for one device handle; ``read`` raises only NVMLError for the caller to classify."""

    __slots__ = ("_nvml", "mode", "_previous", "_last_slow", "slow_every_s")

    def __init__(self, nvml: ModuleType, slow_every_s: float = SLOW_EVERY_S) -> None:
        self._nvml = nvml
        self.slow_every_s = slow_every_s
        has_counters = (
            hasattr(nvml, "nvmlDeviceGetFieldValues")
            and hasattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES")
            and hasattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
        )
        self.mode = COUNTERS if has_counters else THROUGHPUT
        self._previous: tuple[int, int, int, int] | None = (
            None  # (tx bytes, tx µs, rx bytes, rx µs)
        )
        self._last_slow: float | None = None

    def read(self, handle: Any, now: float) -> tuple[int | None, int | None]:
        if self.mode == COUNTERS:
            counters = self._counters(handle)
            if counters is not None:
                return self._rates(counters)
            self.mode = THROUGHPUT  # this driver/GPU has no byte counters: fall back for good
        if self._last_slow is not None and now - self._last_slow < self.slow_every_s:
            return None, None
        self._last_slow = now
        nvml = self._nvml
        return (
            nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES),
            nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES),
        )

    def _counters(self, handle: Any) -> tuple[int, int, int, int] | None:
        nvml = self._nvml
        try:
            tx, rx = nvml.nvmlDeviceGetFieldValues(
                handle, [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
            )
        except nvml.NVMLError as exc:
            if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise
        if tx.nvmlReturn != nvml.NVML_SUCCESS or rx.nvmlReturn != nvml.NVML_SUCCESS:
            return None
        return int(tx.value.ullVal), int(tx.timestamp), int(rx.value.ullVal), int(rx.timestamp)

    def _rates(self, now: tuple[int, int, int, int]) -> tuple[int | None, int | None]:
        previous, self._previous = self._previous, now
        if previous is None:
            return None, None
        return _rate(previous[0], previous[1], now[0], now[1]), _rate(
            previous[2], previous[3], now[2], now[3]
        )


def _rate(bytes_before: int, us_before: int, bytes_now: int, us_now: int) -> int | None:
    if us_now <= us_before or bytes_now < bytes_before:  # same reading, or the counter was reset
        return None
    return int((bytes_now - bytes_before) * 1_000_000 / (us_now - us_before) / 1024)
