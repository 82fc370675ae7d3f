"""Detection: rules, signals, YARA and scoring into an explainable verdict per process.

One sub-package per job, in the order a process meets them:

- ``ruleset``: rule files read (through ``gpuguard.config``), merged, compiled
  and reloaded;
- ``signals``: the named values rule conditions test, listed once in
  ``signals.table``, read lazily, with what each depends on (``rescore``);
- ``yara``: executables, command lines and memory against the YARA rules;
- ``scoring``: matched rules into a verdict, the engine, the allowlist;
- ``host``: host-wide findings and their rule rows;
- ``guard_policies`` (per-user GPU limits) and ``cases`` (golden cases).

Registries are explicit lists: nothing registers itself on import.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources``, ``gpuguard.correlate`` and itself; never respond, outputs
or commands (tests/test_layers.py).
"""
