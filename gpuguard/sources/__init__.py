"""Sources: where facts come from: the eBPF sensor, GPU samplers, /proc, host files, recordings.

Owns every read of the outside world that produces events or facts, one
sub-package per place read: ``ebpf`` (the probes: text, loading, decoding,
maps), ``proc`` (process facts, identity, CPU, huge pages, configs), ``net``
(connections, tcp_info, payload reassembly), ``gpu`` (holders and samplers)
and ``host`` (host-wide facts for ``scan``).

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events`` and
itself; never correlate, detect, respond, outputs or commands (tests/test_layers.py).
"""
