"""A GPU workload without a framework, in two shapes, for the device check (check.py).

  hash   a miner's shape: a hashing-loop kernel (~50 ms a launch, integer work only), tiny
         transfers (a job header in, the best result out), and with --pool a stratum session:
         subscribe, authorize, jobs pushed by the pool, a share about every --share-s seconds
  train  a training job's shape: large transfers (a batch in each step from page-locked memory,
         a checkpoint out every fourth burst), memory-bound kernels in bursts with pauses, and
         with --peer a c10d-like session: a store handshake, then an all-reduce each step

JSON lines on stdout: "ready" (with --wait-go it then waits for a line on stdin), "cuda" (what
the driver said, start-up times), "running" (the first kernel finished), "progress" every 5 s,
then "done" or "error".  It ends after --seconds, on SIGTERM, or when its parent dies.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import socket
import statistics
import struct
import sys
import threading
import time
import zlib

from cuda_driver import CudaDriver, CudaError
from peers import recv_exact

MIB = 1 << 20
HASH_GRID, HASH_BLOCK = 2112, 256  # the H100 hashing loop's launch (tests/traces/h100/README.md)
TARGET = 0x00100000  # about 1 in 4096 nonces "meets the target"
STOP = threading.Event()


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": round(time.time(), 3), **fields}) + "\n")
    sys.stdout.flush()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class PoolSession:
    """A stratum v1 client: newline-delimited JSON-RPC, jobs read on a thread of their own."""

    def __init__(self, pool: str) -> None:
        self.sock = socket.create_connection(address(pool), timeout=10)
        self.sock.settimeout(None)
        self.job, self.word = "0", 0
        self.jobs = self.accepted = self.submitted = 0
        self.next_id = 3
        self._send({"id": 1, "method": "mining.subscribe", "params": ["hashloop/1.0"]})
        self._send({"id": 2, "method": "mining.authorize", "params": ["worker.1", "x"]})
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def _read(self) -> None:
        for line in self.sock.makefile("rb"):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("method") == "mining.notify":
                self.job = str(message["params"][0])
                self.word = zlib.crc32(self.job.encode())
                self.jobs += 1
            elif message.get("result") is True and message.get("id", 0) >= 3:
                self.accepted += 1

    def submit(self, nonce: int) -> None:
        self.submitted += 1
        params = ["worker.1", self.job, "00000000", f"{int(time.time()):08x}", f"{nonce:08x}"]
        self._send({"id": self.next_id, "method": "mining.submit", "params": params})
        self.next_id += 1


def run_hash(drv: CudaDriver, args: argparse.Namespace, deadline: float) -> dict:
    fn = drv.function(drv.load(), "hash_rounds")
    out, header_dev = drv.alloc(8), drv.alloc(80)
    header, result = ctypes.create_string_buffer(80), (ctypes.c_uint32 * 2)()
    pool = PoolSession(args.pool) if args.pool else None
    rng = random.Random(7)
    base, launches, best, best_nonce, times = 0, 0, 0xFFFFFFFF, 0, []

    def launch(rounds: int) -> float:
        nonlocal base, launches
        started = time.perf_counter()
        word = pool.word if pool else 0
        header[:4] = struct.pack("<I", word)
        drv.fill32(out, 0xFFFFFFFF, 1)
        drv.to_device(header_dev, header, 80)  # the job in: 80 bytes
        drv.launch(
            fn,
            HASH_GRID,
            HASH_BLOCK,
            ctypes.c_uint64(out),
            ctypes.c_uint32(base),
            ctypes.c_uint32(rounds),
            ctypes.c_uint32(word),
            ctypes.c_uint32(TARGET),
        )
        drv.synchronize()
        drv.to_host(result, out, 8)  # the best result out: 8 bytes
        base = (base + HASH_GRID * HASH_BLOCK) & 0xFFFFFFFF
        launches += 1
        return time.perf_counter() - started

    rounds = 2048
    launch(rounds)  # the first launch also loads the module onto the GPU: not timed
    for _ in range(2):  # scale the rounds to --kernel-ms, then check once more
        took = max(launch(rounds), 1e-4)
        rounds = min(max(int(rounds * args.kernel_ms / 1000 / took), 256), 1 << 24)
    emit("running", rounds=rounds)
    next_share = time.monotonic() + args.share_s * rng.uniform(0.8, 1.2)
    next_report = time.monotonic() + 5
    while not STOP.is_set() and time.monotonic() < deadline:
        times.append(launch(rounds))
        if result[0] < best:
            best, best_nonce = result[0], result[1]
        if pool and time.monotonic() >= next_share:
            pool.submit(best_nonce if best != 0xFFFFFFFF else base)  # a share per pool period
            best = 0xFFFFFFFF
            next_share = time.monotonic() + args.share_s * rng.uniform(0.8, 1.2)
        if time.monotonic() >= next_report:
            next_report += 5
            emit("progress", launches=launches, launch_ms=_ms(times[-100:]), **_pool(pool))
    return {"launches": launches, "rounds": rounds, "launch_ms": _ms(times), **_pool(pool)}


def _pool(pool: PoolSession | None) -> dict:
    if pool is None:
        return {}
    return {"jobs": pool.jobs, "shares": pool.submitted, "accepted": pool.accepted}


def _ms(seconds: list[float]) -> dict:
    if not seconds:
        return {}
    ms = sorted(s * 1000 for s in seconds)
    return {"median": round(statistics.median(ms), 2), "max": round(ms[-1], 2)}


class PeerSession:
    """A c10d-like rank 1: a TCPStore-style handshake, then an all-reduce channel."""

    def __init__(self, peer: str) -> None:
        self.store = socket.create_connection(address(peer), timeout=10)
        self.store.sendall(b"S")
        self._store("set", b"rank_1/addr", b"127.0.0.1:0")
        self._store("add", b"world_size", b"1")
        self._store("get", b"master/addr", b"")
        self.data = socket.create_connection(address(peer), timeout=30)
        self.data.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.data.sendall(b"D")
        self.bytes = 0

    def _store(self, op: str, key: bytes, value: bytes) -> bytes:
        code = ("set", "get", "add", "check").index(op)
        self.store.sendall(struct.pack("!BH", code, len(key)) + key + struct.pack("!I", len(value)))
        self.store.sendall(value)
        (size,) = struct.unpack("!I", recv_exact(self.store, 4))
        return recv_exact(self.store, size)

    def barrier(self) -> None:
        self._store("add", b"barrier", b"1")

    def all_reduce(self, buffer: ctypes.Array) -> None:
        """Send our gradients, take the peer's back (a two-rank ring)."""
        self.data.sendall(struct.pack("!Q", len(buffer)) + bytes(buffer))
        (size,) = struct.unpack("!Q", recv_exact(self.data, 8))
        ctypes.memmove(buffer, recv_exact(self.data, size), min(size, len(buffer)))
        self.bytes += 2 * len(buffer)


def run_train(drv: CudaDriver, args: argparse.Namespace, deadline: float) -> dict:
    fn = drv.function(drv.load(), "axpy")
    weights = max(int(1024 * MIB * args.scale) // 4 * 4, 4096)
    batch = max(int(512 * MIB * args.scale) // 4 * 4, 4096)
    grads = max(int(8 * MIB * args.scale) // 4 * 4, 4096)
    x, y, batch_dev = drv.alloc(weights), drv.alloc(weights), drv.alloc(batch)
    pinned = drv.alloc_host(batch)
    grad_host = ctypes.create_string_buffer(grads)
    peer = PeerSession(args.peer) if args.peer else None
    n = weights // 4
    grid = min((n + 255) // 256, 132 * 16)
    steps, bursts, moved, step_times = 0, 0, 0, []

    def step() -> None:
        nonlocal steps, moved
        started = time.perf_counter()
        drv.to_device(batch_dev, pinned, batch)  # the batch in
        for _ in range(args.passes):
            drv.launch(
                fn,
                grid,
                256,
                ctypes.c_uint64(x),
                ctypes.c_uint64(y),
                ctypes.c_float(0.5),
                ctypes.c_uint64(n),
            )
        drv.synchronize()
        drv.to_host(grad_host, y, grads)  # gradients out
        if peer:
            peer.all_reduce(grad_host)
        drv.to_device(y, grad_host, grads)  # the reduced gradients back in
        moved += batch + 2 * grads
        steps += 1
        step_times.append(time.perf_counter() - started)

    step()
    emit("running", weights=weights, batch=batch, passes=args.passes)
    next_report = time.monotonic() + 5
    while not STOP.is_set() and time.monotonic() < deadline:
        burst_end = time.monotonic() + args.burst_s
        while not STOP.is_set() and time.monotonic() < min(burst_end, deadline):
            step()
        bursts += 1
        if peer:
            peer.barrier()
        if bursts % 4 == 0:  # a checkpoint: the weights out, a batch-sized chunk at a time
            for offset in range(0, weights, batch):
                drv.to_host(pinned, x + offset, min(batch, weights - offset))
                moved += min(batch, weights - offset)
        STOP.wait(args.pause_s)
        if time.monotonic() >= next_report:
            next_report += 5
            emit(
                "progress", steps=steps, bursts=bursts, step_ms=_ms(step_times[-100:]), moved=moved
            )
    return {
        "steps": steps,
        "bursts": bursts,
        "step_ms": _ms(step_times),
        "bytes_copied": moved,
        "peer_bytes": peer.bytes if peer else 0,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=("hash", "train"))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pool", help="HOST:PORT of a stratum pool (hash)")
    parser.add_argument("--peer", help="HOST:PORT of the c10d-like rank 0 (train)")
    parser.add_argument("--share-s", type=float, default=15.0)
    parser.add_argument("--kernel-ms", type=float, default=50.0)
    parser.add_argument("--scale", type=float, default=1.0, help="train: buffer sizes x SCALE")
    parser.add_argument("--passes", type=int, default=32)
    parser.add_argument("--burst-s", type=float, default=2.0)
    parser.add_argument("--pause-s", type=float, default=0.7)
    parser.add_argument("--wait-go", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: never outlive the check
    emit("ready", pid=os.getpid(), shape=args.shape)
    if args.wait_go:
        sys.stdin.readline()
    started = time.monotonic()
    drv, stage = None, "start"
    try:
        drv = CudaDriver()
        info = drv.start()
        emit("cuda", **info, **drv.times)
        stage = args.shape
        run = run_hash if args.shape == "hash" else run_train
        result = run(drv, args, started + args.seconds)
        emit("done", **result, **drv.times, wall_s=round(time.monotonic() - started, 2))
        return 0
    except (CudaError, OSError) as exc:
        emit("error", stage=stage, message=str(exc))
        return 3
    finally:
        if drv is not None:
            drv.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
