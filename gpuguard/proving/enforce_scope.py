"""A response scope made for one test run: an enforce agent that can act only on what runs inside it.

``gpuguard selftest --own-agent --mode enforce``, the enforce tests and the
end-to-end benchmark start a real enforce agent on a host where other
processes run.  :class:`EnforceScope` makes a cgroup v2 directory of its own
(``/<prefix>-<pid>-<n>``, the n-th of this process), a private BPF pin root and
block-record directory, and writes the ``response:`` section that confines the agent
to that cgroup (no host-wide nftables sets).  The simulator is started inside the cgroup
(:func:`gpuguard.proving.simulator.start_simulator` ``cgroup=``).  ``close()``
lifts every block the agent left, removes the pin root and the cgroups.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

from gpuguard.respond.blocks import BlockStore
from gpuguard.respond.cgroup_blocks import cgroup2_mount
from gpuguard.respond.lift import lift_all

RESPONSE_SECTION = """response:
  cgroups: [{scope}]
  pin_root: {pin_root}
  state_dir: {state_dir}
  block_egress: {{nftables: false}}
  quarantine: {{cgroup_parent: {quarantine_parent}}}
  kill: {{grace_s: {grace_s:g}}}
  max_actions_per_minute: 1000
"""


_MADE = itertools.count()  # scopes made by this process: one's leftover never blocks the next


class EnforceScope:
    """A cgroup, a pin root and a state directory for one enforce run; a context manager."""

    def __init__(self, workdir: Path, prefix: str = "gg-test", grace_s: float = 0.5) -> None:
        self.scope = f"/{prefix}-{os.getpid()}-{next(_MADE)}"
        self.cgroup = Path(cgroup2_mount() + self.scope)
        self.pin_root = Path(f"/sys/fs/bpf{self.scope}")
        self.state_dir = workdir / "blocks"
        self.grace_s = grace_s
        self.cgroup.mkdir()

    def response_section(self) -> str:
        """The agent config's ``response:`` section for this scope (YAML)."""
        return RESPONSE_SECTION.format(
            scope=self.scope,
            pin_root=self.pin_root,
            state_dir=self.state_dir,
            quarantine_parent=self.cgroup / "gpuguard",
            grace_s=self.grace_s,
        )

    def close(self) -> None:
        """Lift every block left, end what still runs in the cgroup, remove the pin root and the cgroups."""
        lift_all(BlockStore(str(self.state_dir)), self.pin_root)
        shutil.rmtree(self.pin_root, ignore_errors=True)
        if not self.cgroup.is_dir():
            return
        for top, _, _ in os.walk(self.cgroup, topdown=False):  # children first
            directory = Path(top)
            _empty(directory)
            try:
                directory.rmdir()
            except OSError:
                pass

    def __enter__(self) -> EnforceScope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty(cgroup: Path) -> None:
    """Kill what is left in a cgroup of ours (cgroup.kill), so it can be removed."""
    try:
        if (cgroup / "cgroup.procs").read_text().strip():
            (cgroup / "cgroup.kill").write_text("1")
            # a killed process still has to run to its exit: at a low CPU weight on a busy host
            # that was seen to take more than 10 s
            deadline = time.monotonic() + 30
            while (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
                time.sleep(0.05)
    except OSError:
        pass
