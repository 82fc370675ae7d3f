"""A benign busy worker in Python: one core of real work beside a long, quiet session to a server.

    python3 busy_worker.py memcached PORT [S]  zlib and lzma compression; pymemcache, a
                                            heartbeat key set every S s (60) on the one connection
    python3 busy_worker.py postgres PORT    SHA-256 and PBKDF2 (hashlib); psycopg2, LISTEN jobs,
                                            each NOTIFY taken between chunks of work
    python3 busy_worker.py redis PORT       numeric code (a Mandelbrot tile in floats); redis-py,
                                            a pub/sub subscription to "jobs"

Run with Debian's python3 and its client packages (python3-pymemcache, python3-psycopg2,
python3-redis).  Prints "ready" once its session is open, then works until killed.
"""

import hashlib
import lzma
import sys
import time
import zlib


def compress_work() -> None:
    text = b"".join(
        b"order %d shipped to customer %d total %d\n" % (i, i * 7, i * 13) for i in range(4000)
    )
    zlib.compress(text, 6)
    lzma.compress(text[:20000], preset=1)


def hash_work() -> None:
    hashlib.pbkdf2_hmac("sha256", b"report", b"salt", 2000)
    hashlib.sha256(b"x" * 200_000).digest()


def numeric_work() -> None:
    inside = 0
    for i in range(60):
        for j in range(60):
            c = complex(-2 + 2.5 * i / 60, -1.25 + 2.5 * j / 60)
            z = 0j
            for _ in range(50):
                z = z * z + c
                if abs(z) > 2:
                    break
            else:
                inside += 1


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "memcached":
        from pymemcache.client.base import Client

        client = Client(("127.0.0.1", port))
        client.set("worker:heartbeat", str(time.time()))
        work = compress_work

        def tick() -> None:
            client.set("worker:heartbeat", str(time.time()))

        every = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    elif kind == "postgres":
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user="nobody", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("LISTEN jobs")
        work = hash_work

        def tick() -> None:
            conn.poll()
            while conn.notifies:
                conn.notifies.pop(0)
                hash_work()

        every = 0.5
    elif kind == "redis":
        import redis

        pubsub = redis.Redis(host="127.0.0.1", port=port).pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe("jobs")
        work = numeric_work

        def tick() -> None:
            while pubsub.get_message(timeout=0) is not None:
                numeric_work()

        every = 0.5
    else:
        raise SystemExit(f"unknown kind {kind}")
    print("ready", flush=True)
    next_tick = time.monotonic() + every
    while True:
        work()
        if time.monotonic() >= next_tick:
            tick()
            next_tick += every


if __name__ == "__main__":
    main()
