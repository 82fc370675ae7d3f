"""Debian's real Prometheus server for tests: started on a free loopback port, stopped after."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.exposition import generate_latest

from tests.support.ports import free_port
from tests.support.processes import terminate


class PrometheusServer:
    """A running ``prometheus`` with ``config`` (prometheus.yml text) in ``workdir``."""

    def __init__(self, workdir: Path, config: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, (
            "Debian's prometheus is not installed (fix: bash packaging/setup-host.sh setup)"
        )
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        self.log_path = workdir / "prometheus.log"
        (workdir / "prometheus.yml").write_text(config)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )

    def check_alive(self) -> None:
        assert self.proc.poll() is None, self.log_path.read_text()[-2000:]

    def stop(self) -> None:
        terminate(self.proc)
        self._log.close()


@contextlib.contextmanager
def prometheus(workdir: Path, config: str) -> Iterator[PrometheusServer]:
    server = PrometheusServer(workdir, config)
    try:
        yield server
    finally:
        server.stop()


def exposition(metrics: Any) -> bytes:
    """The text an :class:`~gpuguard.outputs.metrics.AgentMetrics` serves on /metrics (the same
    registry its HTTP endpoint renders)."""
    return generate_latest(metrics.registry)
