"""A covert miner for the scan tests: a TLS stratum client named python3, the fake H100 it drives, its pool."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpuguard.commands import scan
from tests.fakes.fake_pynvml import FakeAccounting, FakeGpu, FakeNvml, FakeProcess

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "tests" / "workloads" / "tls_stratum_client.py"


class TlsPool:
    """A TLS listener on 127.0.0.1 (443 when free) that reads whatever its clients send.

    With ``reply`` it answers every line with those bytes (a pool's result for a
    share).  TLS runs over memory buffers, so every byte on the wire is counted:
    ``wire_in`` (what clients sent, TLS records included), ``wire_out`` and
    ``sends`` (one send per flight, with TCP_NODELAY: one segment each on loopback).
    """

    def __init__(self, workdir: Path, reply: bytes | None = None) -> None:
        cert, key = workdir / "pool.crt", workdir / "pool.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-subj",
                "/CN=pool.test",
                "-days",
                "1",
            ],
            check=True,
            capture_output=True,
        )
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.reply = reply
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("127.0.0.1", 443))
        except OSError:  # another suite holds 443: the port is incidental to this test
            self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.wire_in = self.wire_out = self.sends = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True)

        def flush() -> None:
            if data := outgoing.read():
                conn.sendall(data)
                self.wire_out += len(data)
                self.sends += 1

        def more() -> bool:
            flush()
            data = conn.recv(65536)
            self.wire_in += len(data)
            incoming.write(data) if data else incoming.write_eof()
            return bool(data)

        try:
            while True:
                try:
                    tls.do_handshake()
                    flush()
                    break
                except ssl.SSLWantReadError:
                    if not more():
                        return
            while True:
                try:
                    data = tls.read(4096)
                except ssl.SSLWantReadError:
                    if not more():
                        return
                    continue
                if not data:
                    return
                self.received.append(data)
                if self.reply is not None:
                    for _line in range(data.count(b"\n")):
                        tls.write(self.reply)
                    flush()
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def start_ready(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def hashing_gpu(pid: int, now_us: int) -> FakeGpu:
    """The H100 hashing-loop figures (shared/traces/h100/hashing-loop.gpus.jsonl).

    The accounting record claims the hour of GPU use a real covert miner would have
    behind it (lifetime average 99 %, as the trace's 20 s record read 57 % with start-up);
    its start time is the test process's own, as NVML's would be.
    """
    import psutil

    start_us = int(psutil.Process(pid).create_time() * 1e6) + 500_000
    rng = random.Random(1)
    history = {
        1: [(now_us - 14_000_000 + i * 200_000, 100) for i in range(70)],
        2: [(now_us - 14_000_000 + i * 200_000, 0) for i in range(70)],
        0: [(now_us - 14_000_000 + i * 200_000, int(rng.gauss(395_400, 3000))) for i in range(70)],
    }
    return FakeGpu(
        util_gpu=100,
        util_memory=0,
        memory_used=1_057_816_576,
        power_mw=395_322,
        sm_clock=1980,
        temperature=63,
        compute=[FakeProcess(pid, 545_259_520)],
        history=history,
        accounting_mode=1,
        accounting={
            pid: FakeAccounting(99, 0, 545_259_520, start_us, 3_600_000),
            # a GPU user that is gone: last night's run
            777_001: FakeAccounting(
                98, 0, 545_259_520, now_us - 40_000_000_000, 20_000_000, running=False
            ),
        },
    )


class FakeDriver(threading.Thread):
    """Moves the fake driver's figures on like the real one: per-process samples, power, PCIe counters."""

    def __init__(self, gpu: FakeGpu, pid: int) -> None:
        super().__init__(daemon=True)
        self.gpu, self.pid, self.stop = gpu, pid, threading.Event()
        self.rng = random.Random(2)

    def run(self) -> None:
        while not self.stop.wait(0.2):
            now_us = int(time.time() * 1e6)
            gpu = self.gpu
            gpu.util_samples = [(self.pid, now_us, 99, 0, 0, 0)]
            gpu.power_mw = int(self.rng.gauss(395_400, 3000))
            gpu.pcie_tx_bytes += 1527 * 1024 // 5
            gpu.pcie_rx_bytes += 1418 * 1024 // 5
            gpu.counters_time_us = now_us


@contextlib.contextmanager
def covert_host_running(tmp_path: Path, monkeypatch) -> Iterator[dict]:
    """The covert miner and an HTTPS client beside it on one TlsPool, the fake H100 moving on."""
    opt = Path(f"/opt/gg-covert-{os.getpid()}")
    (opt / "bin").mkdir(parents=True, exist_ok=True)
    interpreter = opt / "bin" / "python3"
    shutil.copy2(os.path.realpath(sys.executable), interpreter)
    pool = TlsPool(tmp_path)
    procs = []
    try:
        covert = start_ready(
            [str(interpreter), str(CLIENT), "127.0.0.1", str(pool.port), "stratum", "1"]
        )
        procs.append(covert)
        https = start_ready(
            [sys.executable, str(CLIENT), "127.0.0.1", str(pool.port), "https", "1"]
        )
        procs.append(https)
        gpu = hashing_gpu(covert.pid, int(time.time() * 1e6))
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]).module)
        driver = FakeDriver(gpu, covert.pid)
        driver.start()
        yield {"covert": covert, "https": https, "pool": pool, "exe": str(interpreter)}
        driver.stop.set()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        pool.close()
        shutil.rmtree(opt, ignore_errors=True)


def scan_in_process(capsys, *argv: str) -> tuple[int, dict]:
    parser = argparse.ArgumentParser()
    scan.add_arguments(parser)
    code = scan.run(
        parser.parse_args(
            ["--json", "--no-yara", "--rules", str(REPO / "rules" / "miner-rules.yaml"), *argv]
        )
    )
    return code, json.loads(capsys.readouterr().out)
