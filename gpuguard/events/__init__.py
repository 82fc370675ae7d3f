"""Events: the typed data every stage passes on, and its wire format.

Owns the event model (``model``: GpuOpen, GpuIoctl, Connect, NetPayload, Exec,
Exit, Lost), the facts and samples that travel with it (``process_facts``,
``gpu_snapshot``), the agent's own events shared by respond and outputs
(``agent_events``), decoding of ioctl numbers and payload first bytes, and the
recording format (``wire``).

May import: ``gpuguard.errors``, ``gpuguard.escape`` (layer 0) and itself; never
sources, correlate, detect, respond, outputs or commands (tests/test_layers.py).
"""
