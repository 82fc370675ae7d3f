"""Detection: rules, signals, YARA and scoring into an explainable verdict per process.

One sub-package per job, in the order a process meets them: ``ruleset``, ``signals``,
``yara``, ``scoring`` and ``host``, plus ``guard_policies`` and ``cases``; what each holds
is in docs/internals.md ("detect").  Registries are explicit lists: nothing registers
itself on import.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate`` and itself; never respond, outputs
or commands (tests/test_layers.py).
"""
