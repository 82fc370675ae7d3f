"""What the inbound side of a session costs: one tcp_info read of a GPU holder's sockets (run as root).

    .venv/bin/python benchmarks/bench_tcp_sessions.py [--sockets 2000] [--repeat 7] [--json]

The agent reads the TCP stack's counters of its GPU holders' connections once per
activity interval (10 s), scan once a second during its window
(``gpuguard.sources.net.tcp_sessions.TcpSessionReader``: the holder's fd table, then
a sock_diag dump of its namespace the first time, one lookup per known socket later).  The host gets ``--sockets``
established loopback connection pairs held by this process; the "holder" is a
child holding 4 connections.  Baselines measured in the same run, interleaved:
``psutil.net_connections("tcp")`` (scan's connection table: /proc/net/tcp* and
every fd table) and a read of /proc/PID/net/tcp and tcp6 (the agent's seeding).
The netns case times the same read of a holder in another network namespace
(a setns thread opens the netlink socket there).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from gpuguard.sources.net.conn_activity import established_socket_inodes  # noqa: E402
from gpuguard.sources.net.tcp_sessions import TcpSessionReader, read_sessions  # noqa: E402

HOLDER = """
import socket, time
server = socket.create_server(("127.0.0.1", 0))
pairs = [(socket.create_connection(server.getsockname()), server.accept()[0]) for _ in range(4)]
print("ready", flush=True)
time.sleep(600)
"""


def _timed(fn, loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - start) / loops * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.sockets * 2 + 256,) * 2)
    server = socket.create_server(("127.0.0.1", 0), backlog=4096)
    pairs = []
    for _ in range(args.sockets):
        pairs.append((socket.create_connection(server.getsockname()), server.accept()[0]))
    netns = f"gg-bench-tcp-{os.getpid()}"
    holders = []
    try:
        holders.append(
            subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
        )
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        holders.append(
            subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-c", HOLDER],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        for proc in holders:
            assert proc.stdout.readline().strip() == "ready"
        here, there = holders[0].pid, holders[1].pid
        assert (
            len(read_sessions([here]).sessions) == 8 and len(read_sessions([there]).sessions) == 8
        )
        steady, steady_there = TcpSessionReader(), TcpSessionReader()
        steady.read([here]), steady_there.read([there])
        cases = {
            "first read (dump)": lambda: read_sessions([here]),
            "first read, another netns (dump)": lambda: read_sessions([there]),
            "later reads (lookups)": lambda: steady.read([here]),
            "later reads, another netns (lookups)": lambda: steady_there.read([there]),
            "baseline: psutil.net_connections(tcp)": lambda: psutil.net_connections("tcp"),
            "baseline: /proc/PID/net/tcp{,6}": lambda: established_socket_inodes(here),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, fn in cases.items():
                times[name].append(_timed(fn, 5))
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "netns", "del", netns], check=False)
        for a, b in pairs:
            a.close(), b.close()
    medians = {name: statistics.median(v) for name, v in times.items()}
    base = medians["baseline: psutil.net_connections(tcp)"]
    if args.json:
        print(
            json.dumps(
                {
                    "sockets": args.sockets * 2,
                    "ms": medians,
                    "ratio_to_net_connections": {k: v / base for k, v in medians.items()},
                }
            )
        )
    else:
        print(
            f"{args.sockets * 2} TCP sockets on the host (medians of {args.repeat} rounds); "
            f"dumps in the steady readers: {steady.dumps + steady_there.dumps - 2}"
        )
        for name, ms in medians.items():
            print(f"  {name:42s} {ms:8.2f} ms  {ms / base:6.3f} x net_connections")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
