"""Correlation: per-process state built from events, snapshots and /proc facts.

``state`` holds what is known about one process (keyed so pid reuse never
merges two processes), ``windows`` the bounded time series it keeps,
``network`` and ``endpoints`` what its connections, payloads and arguments
reveal, ``config_files`` the pool settings a miner hides in its config (parsed
from text that ``sources`` read), and ``correlator`` the feed that routes
every item to the right process.  It knows nothing of rules or verdicts: the
detect layer hands it a ``RescorePolicy`` and an ``on_new_facts`` hook.

May import: ``gpuguard.errors``, ``gpuguard.escape``, ``gpuguard.events``,
``gpuguard.sources`` and itself; never detect, respond, outputs or commands
(tests/test_layers.py).
"""
