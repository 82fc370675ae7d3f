"""The sensor keeps decode failures (bad kernel records) and its own routing failures apart."""

from __future__ import annotations

from gpuguard.events.model import Exit
from gpuguard.sources.ebpf.bpf_decode import MalformedEvent
from gpuguard.sources.ebpf.sensor import Sensor


class _Decoder:
    def __init__(self, result):
        self.result = result

    def decode(self, data, size):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_routing_failures_are_not_counted_as_malformed_records():
    sensor = Sensor()
    sensor._decoder = _Decoder(Exit(time=1.0, pid=4242, exit_code=0))

    def broken_route(event):
        raise RuntimeError("a bug in routing")

    sensor._route = broken_route
    sensor._handle(b"", 0)
    assert (sensor.stats.routing_errors, sensor.stats.malformed) == (1, 0)
    sensor._decoder = _Decoder(MalformedEvent("short record"))
    sensor._handle(b"", 0)
    assert (sensor.stats.routing_errors, sensor.stats.malformed) == (1, 1)
