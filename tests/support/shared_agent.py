"""One live eBPF agent per test process (an xdist worker), which tests join by their own pids.

Each agent start compiles the probes (bcc, seconds of CPU): tests that only need *an* agent
watching the host share this one instead of starting their own.  It watches the whole host,
so a test that joins it asserts only about records of the processes it started
(:func:`tests.support.agent_run.finding_for` and the like) and about counters that only grow.
A test whose subject is the agent's own life (start, stop, reload of its config, a full disk,
a restart) starts a private agent (:func:`tests.support.agent_run.running_agent`).

The agent runs the shipped rules plus a site layer listing the simulator's pool port
(3333) and :data:`SHARED_POOL_PORTS`, ports tests bind their loopback pools on; it serves
finding updates at most every :data:`UPDATE_INTERVAL_S`; it serves
/metrics on a free loopback port (``agent.metrics_port``); ``agent.rules_dir`` holds its
rules (a test that changes them restores them and reloads, in a ``finally``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.agent_run import AgentProcess, running_agent, simulator_rules
from tests.support.ports import free_port

# Pool ports the shared agent's site layer lists beside the simulator's: a test binds its pool
# on one of them (tests/support/randomx.py's LoopbackPool takes a port).
SHARED_POOL_PORTS = (34441, 34442, 34443, 34444)
# findings.update_interval_s of the shared agent (the shipped 30 s would keep a finding's first
# update from a test for half a minute)
UPDATE_INTERVAL_S = 8.0


@contextlib.contextmanager
def shared_agent_running() -> Iterator[AgentProcess]:
    """The shared agent, ready; stopped (and its whole log validated) when the block ends."""
    with tempfile.TemporaryDirectory(prefix="gg-shared-agent-") as tmp:
        workdir = Path(tmp)
        rules, site = simulator_rules(workdir, *SHARED_POOL_PORTS)
        config = workdir / "agent.yaml"
        config.write_text(f"findings: {{update_interval_s: {UPDATE_INTERVAL_S:g}}}\n")
        config.chmod(0o600)
        port = free_port()
        with running_agent(
            workdir,
            "--config",
            str(config),
            "--sensor",
            "ebpf",
            "--rules",
            str(rules),
            "--rules",
            str(site),
            "--metrics-address",
            f"127.0.0.1:{port}",
        ) as agent:
            agent.rules_dir = rules.parent
            agent.metrics_port = port
            yield agent
