"""Real programs that use huge pages the way RandomX does, yet are not miners: `gpuguard scan`
leaves them clean.  A JVM with large pages computing with a connection open, and PostgreSQL
with huge_pages=on answering a long CPU-bound query over TCP (real java and postgres).  The
rules' windows are shortened six-fold (tests/support/short_windows.py): a minute of spinning
is 10 s, so a short run meets every window the shipped rules set."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gpuguard.sources.proc.process import collect_process_facts
from tests.support.hugepages import reserved_huge_pages
from tests.support.load import join_load_group
from tests.support.randomx import stop
from tests.support.scan import findings_for_pid, scan_json
from tests.support.short_windows import rules_args, short_window_rules, shortened

pytestmark = [pytest.mark.root, pytest.mark.host_mutator]

SPIN_JAVA = """
import java.io.*; import java.net.*;
public class Spin {
  public static void main(String[] a) throws Exception {
    Socket s = new Socket("127.0.0.1", Integer.parseInt(a[0]));
    long[] heap = new long[32 << 20];  // 256 MiB of the large-page heap, touched
    for (int i = 0; i < heap.length; i += 512) heap[i] = i;
    System.out.println("ready"); System.out.flush();
    double x = 1; long n = 0;
    OutputStream o = s.getOutputStream();
    while (true) {
      x = Math.sin(x) * 1.0000001 + heap[(int) (n++ & ((32 << 20) - 1))];
      if ((n & ((1L << 28) - 1)) == 0) { o.write(("beat " + x + "\\n").getBytes()); o.flush(); }
    }
  }
}
"""
LONG_QUERY = "select count(*) from generate_series(1, 20000000000)"


def _program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is part of this machine's image (platform.md)")
    return path


def _start_postgres(workdir: Path, port: int) -> Path:
    """A throwaway cluster owned by the postgres user, huge_pages=on, 300 MB of shared buffers."""
    data = workdir / "pg"
    data.mkdir()
    shutil.chown(workdir, "postgres")
    shutil.chown(data, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_postgres, _program("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    options = (
        f"-c huge_pages=on -c shared_buffers=300MB -c port={port} "
        f"-c listen_addresses=127.0.0.1 -c unix_socket_directories={workdir}"
    )
    subprocess.run(
        [*as_postgres, _program("pg_ctl"), "-D", str(data), "-w", "-o", options]
        + ["-l", str(workdir / "pg.log"), "start"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # the server (its backends are forked later, there too) in the load group
    join_load_group(int((data / "postmaster.pid").read_text().split()[0]))
    return data


def _stop_postgres(data: Path) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", _program("pg_ctl"), "-D", str(data)]
        + ["-m", "immediate", "stop"],
        capture_output=True,
        timeout=60,
    )


def _backend_running(postmaster: int) -> psutil.Process | None:
    for child in psutil.Process(postmaster).children():
        if "127.0.0.1" in " ".join(child.cmdline()):
            return child
    return None


def test_a_jvm_and_postgresql_with_huge_pages_at_full_cpu_stay_clean():
    java, psql = _program("java"), _program("psql")
    procs: list[subprocess.Popen] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    with tempfile.TemporaryDirectory(prefix="gg-hp-live-") as tmp:
        workdir = Path(tmp)
        (workdir / "Spin.java").write_text(SPIN_JAVA)
        data = None
        try:
            with reserved_huge_pages(1400 + 200):
                try:
                    # its start (the source launcher compiles Spin.java: seconds of CPU) at an
                    # ordinary weight; only its busy loop goes to the load group: at the group's
                    # low weight a busy suite stretched that compile to over a minute
                    jvm = subprocess.Popen(
                        [java, "-XX:+UseLargePages", "-Xms1g", "-Xmx1g", "Spin.java"]
                        + [str(listener.getsockname()[1])],
                        cwd=workdir,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                    )
                    procs.append(jvm)
                    peer, _ = listener.accept()
                    assert jvm.stdout.readline() == b"ready\n"
                    join_load_group(jvm.pid)
                    port_sock = socket.socket()
                    port_sock.bind(("127.0.0.1", 0))
                    pg_port = port_sock.getsockname()[1]
                    port_sock.close()
                    data = _start_postgres(workdir, pg_port)
                    postmaster = int((data / "postmaster.pid").read_text().split()[0])
                    client = subprocess.Popen(
                        [psql, "-h", "127.0.0.1", "-p", str(pg_port), "-U", "postgres"]
                        + ["-c", LONG_QUERY],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    procs.append(client)
                    time.sleep(5)
                    backend = _backend_running(postmaster)
                    assert backend is not None, "the query's backend did not start"
                    # past the huge-page rules' minute of spinning (shortened six-fold)
                    time.sleep(shortened(60) + 5)
                    status = Path(f"/proc/{jvm.pid}/status").read_text()
                    jvm_hugetlb = int(status.split("HugetlbPages:")[1].split()[0]) << 10
                    pg_facts = collect_process_facts(postmaster)
                    _, doc, _ = scan_json("--no-yara", *rules_args(short_window_rules(workdir)))
                    peer.close()
                finally:
                    if data is not None:
                        _stop_postgres(data)
                    for proc in procs:
                        stop(proc)
        finally:
            listener.close()
    # the shapes RandomX also has: >= 256 MiB in huge pages, a spinning thread, a connection
    assert jvm_hugetlb >= 256 << 20, jvm_hugetlb
    # the postmaster maps its ~330 MiB of shared memory in huge pages (touching a part of it)
    assert pg_facts.hugetlb_bytes > 0, pg_facts
    assert max(size for size, _page in pg_facts.hugetlb_mappings) >= 256 << 20, pg_facts
    for pid in (jvm.pid, postmaster, backend.pid):
        found = findings_for_pid(doc, pid)
        assert all(f["gpuguard"]["verdict"] == "clean" for f in found), found
        assert not any("cpu-hugepages-miner" in f["gpuguard"]["rule_ids"] for f in found)
