"""The loopback servers the device check's workloads talk to: a stratum pool and a c10d-like rank 0.

StratumPool speaks stratum v1 (newline-delimited JSON-RPC): it answers subscribe and
authorize, pushes a job at once and then every ``notify_s`` (jittered), and accepts every
share.  C10dPeer is rank 0 of a two-rank job: a TCPStore-like store (set/get/add/check on one
connection) and an all-reduce channel that sends back as many bytes as it gets.  Both keep
counts of what passed, for the summary.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading

POOL_PORT = 3333  # XMRig's default, in the shipped rules' pool_ports
C10D_PORT = 29500  # PyTorch's default MASTER_PORT


def _listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port, or on a free port when that one is taken."""
    for candidate in (port, 0):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", candidate))
        except OSError:
            sock.close()
            continue
        sock.listen(8)
        return sock
    raise OSError(f"cannot listen on 127.0.0.1:{port} or any free port")


class _Server:
    def __init__(self, port: int) -> None:
        self.sock = _listen(port)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._guarded, args=(conn,), daemon=True).start()

    def _guarded(self, conn: socket.socket) -> None:
        try:
            self.session(conn)
        except (OSError, ValueError, struct.error):
            pass
        finally:
            conn.close()

    def session(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class StratumPool(_Server):
    def __init__(self, port: int = POOL_PORT, notify_s: float = 30.0) -> None:
        self.notify_s = notify_s
        self.counts = {"sessions": 0, "lines_in": 0, "shares": 0, "jobs_pushed": 0}
        self.methods: list[str] = []
        self._rng = random.Random(3)
        super().__init__(port)

    def session(self, conn: socket.socket) -> None:
        self.counts["sessions"] += 1
        lock = threading.Lock()

        def send(message: dict) -> None:
            with lock:
                conn.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

        def push_jobs() -> None:
            job = 0
            while not self.stop.is_set():
                job += 1
                self.counts["jobs_pushed"] += 1
                header = f"{self._rng.getrandbits(256):064x}"
                send({"id": None, "method": "mining.notify", "params": [f"{job:x}", header, True]})
                if self.stop.wait(self.notify_s * self._rng.uniform(0.7, 1.3)):
                    return

        for line in conn.makefile("rb"):
            message = json.loads(line)
            self.counts["lines_in"] += 1
            method = str(message.get("method"))
            if len(self.methods) < 20:
                self.methods.append(method)
            if method == "mining.subscribe":
                send({"id": message["id"], "result": [[], "08000002", 4], "error": None})
            elif method == "mining.authorize":
                send({"id": message["id"], "result": True, "error": None})
                send({"id": None, "method": "mining.set_difficulty", "params": [1]})
                threading.Thread(target=push_jobs, daemon=True).start()
            elif method == "mining.submit":
                self.counts["shares"] += 1
                send({"id": message["id"], "result": True, "error": None})


class C10dPeer(_Server):
    def __init__(self, port: int = C10D_PORT) -> None:
        self.store: dict[bytes, bytes] = {b"master/addr": b"127.0.0.1"}
        self.counts = {"store_ops": 0, "all_reduces": 0, "bytes_in": 0, "bytes_out": 0}
        super().__init__(port)

    def session(self, conn: socket.socket) -> None:
        role = conn.recv(1)
        if role == b"S":
            self._store(conn)
        elif role == b"D":
            self._reduce(conn)

    def _store(self, conn: socket.socket) -> None:
        while True:
            op, key_len = struct.unpack("!BH", recv_exact(conn, 3))
            key = recv_exact(conn, key_len)
            (value_len,) = struct.unpack("!I", recv_exact(conn, 4))
            value = recv_exact(conn, value_len)
            self.counts["store_ops"] += 1
            if op == 0:  # set
                self.store[key] = value
            elif op == 2:  # add
                total = int(self.store.get(key, b"0")) + int(value or b"0")
                self.store[key] = str(total).encode()
            reply = self.store.get(key, b"") if op != 3 else (b"1" if key in self.store else b"0")
            conn.sendall(struct.pack("!I", len(reply)) + reply)

    def _reduce(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            (size,) = struct.unpack("!Q", recv_exact(conn, 8))
            data = recv_exact(conn, size)
            self.counts["all_reduces"] += 1
            self.counts["bytes_in"] += size
            conn.sendall(struct.pack("!Q", size) + data)
            self.counts["bytes_out"] += size


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
