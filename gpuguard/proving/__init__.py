"""Tools that prove the agent works: selftest, the harmless miner simulator and the enforce scope.

* :mod:`.selftest` — ``gpuguard selftest``: start the simulator and wait for the agent's finding;
* :mod:`.simulator` — a harmless miner simulator in private namespaces;
* :mod:`.enforce_scope` — the cgroup, pin root and block records that confine
  an enforce agent started for a test (selftest, tests, benchmarks).

None of it runs in the agent's flow.  May import: every layer below it, the
agent included; commands and cli may import it (tests/test_layers.py).
"""
