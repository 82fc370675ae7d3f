"""Process facts name a process's ancestors as psutil's parent() walk does (read from /proc
directly: psutil's objects cost ~7x as much, paid for every exec the agent sees)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import psutil

from gpuguard.events.process_facts import MAX_ANCESTORS, Ancestor
from gpuguard.sources.proc.process import collect_process_facts


def psutil_ancestors(pid: int) -> list[Ancestor]:
    out: list[Ancestor] = []
    parent = psutil.Process(pid).parent()
    while parent is not None and len(out) < MAX_ANCESTORS:
        try:
            exe = os.readlink(f"/proc/{parent.pid}/exe").removesuffix(" (deleted)")
        except OSError:
            exe = ""
        out.append(Ancestor(parent.pid, parent.name(), exe))
        if parent.pid <= 1:
            break
        parent = parent.parent()
    return out


def test_ancestors_match_psutils_walk_long_names_included(tmp_path):
    # a parent whose name is longer than the kernel's 15-character comm
    long_sh = tmp_path / "a-shell-with-a-long-name"
    shutil.copy("/bin/sh", long_sh)
    proc = subprocess.Popen([str(long_sh), "-c", "sleep 30; true"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        (sleeper,) = psutil.Process(proc.pid).children()
        facts = collect_process_facts(sleeper.pid)
        expected = psutil_ancestors(sleeper.pid)
    finally:
        proc.kill()
        proc.wait()
    assert facts is not None
    assert facts.ancestors == expected
    assert facts.ancestors[0] == Ancestor(proc.pid, long_sh.name, str(long_sh))
    assert facts.ancestors[1].pid == os.getpid()
    assert collect_process_facts(os.getpid(), with_ancestors=False).ancestors == []


def test_the_ancestors_of_every_process_on_the_host_match_psutil():
    compared = 0
    for pid in psutil.pids():
        try:
            expected = psutil_ancestors(pid)
            facts = collect_process_facts(pid)
            again = psutil_ancestors(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if facts is None or expected != again:
            continue  # it or an ancestor changed while we looked
        assert facts.ancestors == expected, pid
        compared += 1
    assert compared > 10
