"""Run ``gpuguard agent`` as a subprocess for tests, and read what it writes (log lines, state file)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuguard.proving.simulator import (
    DEFAULT_POOL_PORT,
    parse_ready,
    start_simulator,
    stop_simulator,
)
from tests.support.processes import terminate
from tests.support.schemas import log_errors

REPO = Path(__file__).resolve().parent.parent.parent


class AgentProcess:
    """One agent subprocess with its own state file and log under ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        log_to_stdout: bool = False,
        wrapper: tuple[str, ...] = (),
        log_path: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.state = workdir / "status.json"
        self.log = log_path or workdir / "agent.log"
        log = "-" if log_to_stdout else str(self.log)
        argv = [
            *wrapper,
            sys.executable,
            "-m",
            "gpuguard",
            "agent",
            "--state-file",
            str(self.state),
            "--log",
            log,
            *args,
        ]
        self.stderr_path = workdir / "agent.stderr"
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if log_to_stdout else subprocess.DEVNULL,
            stderr=open(self.stderr_path, "wb"),
        )
        self.started = time.time()
        self._checked = False
        self._log_id: tuple[int, int] | None = None
        self._log_offset = 0
        self._parsed: list[dict[str, Any]] = []

    def status(self) -> dict[str, Any]:
        try:
            return json.loads(self.state.read_text())
        except (OSError, ValueError):
            return {}

    def wait_ready(self, timeout: float = 90) -> dict[str, Any]:
        doc = self.wait_status(
            lambda d: d.get("running") and d.get("pid") == self.proc.pid, timeout
        )
        return doc

    def wait_status(self, predicate: Callable[[dict], Any], timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.status()
            if doc and predicate(doc):
                return doc
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}: {self.stderr()}")
            time.sleep(0.05)
        raise AssertionError(
            f"state file never matched; last: {json.dumps(self.status())[:2000]}\n{self.stderr()}"
        )

    def records(self) -> list[dict[str, Any]]:
        """Every record in the log so far.  Lines already read are kept, only new bytes parsed:
        a shared agent's log grows all session, and tests poll it every 50 ms."""
        try:
            with open(self.log, "rb") as f:
                stat = os.fstat(f.fileno())
                if (stat.st_ino, stat.st_dev) != self._log_id or stat.st_size < self._log_offset:
                    self._log_id, self._log_offset, self._parsed = (stat.st_ino, stat.st_dev), 0, []
                f.seek(self._log_offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its newline
        self._log_offset += end
        self._parsed += [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
        return list(self._parsed)

    def wait_record(self, predicate: Callable[[dict], Any], timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records():
                if predicate(record):
                    return record
            time.sleep(0.05)
        raise AssertionError(f"no matching log record; stderr: {self.stderr()}")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait, and check every record the agent wrote to its log file against the
        schema of its format (tests/support/schemas.py): a test that ends well also proves that
        its records validate."""
        if self.proc.poll() is None:
            terminate(self.proc, timeout)
        if sys.exc_info()[0] is None and not self._checked and isinstance(self.log, Path):
            self._checked = True
            problems = log_errors(self.log)
            assert not problems, f"{self.log}: records that do not validate: {problems}"
        return self.proc.returncode


@contextlib.contextmanager
def running_agent(workdir: Path, *args: str, **kwargs: Any) -> Iterator[AgentProcess]:
    agent = AgentProcess(workdir, *args, **kwargs)
    try:
        agent.wait_ready()
        yield agent
    finally:
        agent.stop()


def simulator_rules(workdir: Path, *pool_ports: int) -> tuple[Path, Path]:
    """The shipped rules (and their YARA files) copied to ``workdir/rules``, root-only as the agent
    demands, and a site file that lists the simulator's pool port and ``pool_ports``:
    (miner-rules.yaml, site.yaml)."""
    rules_dir = workdir / "rules"
    rules_dir.mkdir(mode=0o700)
    shutil.copytree(REPO / "rules", rules_dir, dirs_exist_ok=True)
    site = rules_dir / "site.yaml"
    ports = [DEFAULT_POOL_PORT, *pool_ports]
    site.write_text(f"version: 1\nlists: {{pool_ports: {{extend: {ports}}}}}\n")
    return rules_dir / "miner-rules.yaml", site


@contextlib.contextmanager
def miner_simulator() -> Iterator[dict[str, Any]]:
    """The shipped selftest simulator; yields {"pid", "start", "pool"}."""
    sim = start_simulator()
    try:
        line = sim.stdout.readline().decode()
        ready = parse_ready(line)
        yield {"pid": int(ready["pid"]), "start": ready["start"], "pool": int(ready["pool"])}
    finally:
        stop_simulator(sim)


def finding_for(pid: int) -> Callable[[dict], bool]:
    """A predicate: an ECS finding about ``pid``."""
    return lambda r: (
        r.get("gpuguard", {}).get("kind") == "process" and r.get("process", {}).get("pid") == pid
    )


def actions_on(records: list[dict], pid: int) -> list[dict]:
    """The action records about ``pid`` among ``records`` (in log order)."""
    return [
        r
        for r in records
        if r.get("gpuguard", {}).get("kind") == "action" and r.get("process", {}).get("pid") == pid
    ]


def lifecycle(action: str) -> Callable[[dict], bool]:
    return lambda r: (
        r.get("gpuguard", {}).get("kind") == "lifecycle" and r["event"]["action"] == action
    )


def log_records(log: Path) -> list[dict]:
    """Every JSON line an in-process agent wrote to ``log`` so far (none before the file exists)."""
    return (
        [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if log.exists()
        else []
    )


def until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition never became true")


@contextlib.contextmanager
def agent_running(agent: Any, start_s: float = 120.0) -> Iterator[threading.Thread]:
    """``agent.run()`` (an in-process :class:`~gpuguard.agent.pipeline.Agent`) in a thread,
    ready before the block, stopped after it.  A start that fails ends the thread: that is
    reported at once, not at the timeout."""
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_s
        while not agent.ready.wait(0.05) and thread.is_alive() and time.monotonic() < deadline:
            pass
        assert agent.ready.is_set(), "the agent did not start"
        yield thread
    finally:
        agent.request_stop()
        thread.join(30)
    assert not thread.is_alive(), "the agent did not stop within 30 s"
