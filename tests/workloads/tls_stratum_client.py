"""A TLS client that keeps one long-lived connection: a stratum-like pool session or an HTTPS keepalive.

    python3 tls_stratum_client.py HOST PORT MODE INTERVAL_S [GPU_NODE]

MODE ``stratum``: after the handshake, a ``mining.subscribe`` then a small
``mining.submit`` every INTERVAL_S seconds (a share), all inside TLS.
MODE ``https``: a ``GET /`` with ``Connection: keep-alive`` every INTERVAL_S.
With GPU_NODE (e.g. /dev/nvidia0 in a private /dev) it opens that node first and
keeps it, as a GPU program holds its device.  Prints ``ready`` once connected;
runs until killed.  Test workload only.
"""

import json
import socket
import ssl
import sys
import time

host, port, mode, interval = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
gpu = open(sys.argv[5], "rb") if len(sys.argv) > 5 else None
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
conn = context.wrap_socket(
    socket.create_connection((host, port)), server_hostname="updates.example.net"
)
if mode == "stratum":
    conn.sendall(
        json.dumps({"id": 1, "method": "mining.subscribe", "params": ["miner/1.0"]}).encode()
        + b"\n"
    )
print("ready", flush=True)
n = 2
while True:
    if mode == "stratum":
        share = {
            "id": n,
            "method": "mining.submit",
            "params": ["w", "job", "00000000", "5f5e1000", f"{n:08x}"],
        }
        conn.sendall(json.dumps(share).encode() + b"\n")
    else:
        conn.sendall(
            b"GET / HTTP/1.1\r\nHost: updates.example.net\r\nConnection: keep-alive\r\n\r\n"
        )
    n += 1
    time.sleep(interval)
