"""Correlation: per-process state built from events, snapshots and /proc facts.

``state`` holds what is known about one process (keyed so pid reuse never
merges two processes), ``windows`` the bounded time series it keeps,
``config_files`` the pool settings a miner hides in its config, and
``correlator`` the feed that routes every item to the right process.
"""
