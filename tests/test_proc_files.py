"""Files a process names are read inside its own filesystem view: no symlink or '..' leads to a host file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from gpuguard.sources.proc import files as proc_files
from gpuguard.sources.proc.config_files import read_config_files
from gpuguard.sources.proc.files import read_process_file

PID = 4242


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Both ways of opening: openat2 (kernel >= 5.6) and the component walk used without it."""
    monkeypatch.setattr(proc_files, "_openat2_works", None if request.param == "openat2" else False)
    return request.param


@pytest.fixture
def world(tmp_path):
    """A host secret, and a 'container' whose root and cwd a fake /proc/PID points at."""
    secret = tmp_path / "host" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"pools": [{"url": "host-only.example:1"}]}')
    root = tmp_path / "container"
    (root / "etc").mkdir(parents=True)
    (root / "app" / "sub").mkdir(parents=True)
    (root / "etc" / "miner.json").write_text('{"url": "stratum+tcp://pool.example:3333"}')
    (root / "app" / "config.json").write_text('{"url": "pool.example:4444"}')
    (root / "app" / "sub" / "pools.txt").write_text("pool1 = pool.example:5555\n")
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    os.symlink(root, proc / str(PID) / "root")
    os.symlink(root / "app", proc / str(PID) / "cwd")
    return {"secret": secret, "root": root, "proc": str(proc)}


def read(world, path, max_bytes=65536):
    return read_process_file(PID, path, max_bytes, world["proc"])


def test_paths_resolve_in_the_process_view(world, resolver):
    assert "pool.example:3333" in read(world, "/etc/miner.json")
    assert "pool.example:4444" in read(world, "config.json")
    assert "pool.example:5555" in read(world, "sub/pools.txt")
    assert read(world, "/app/config.json") == read(world, "config.json")


def test_an_absolute_symlink_never_reaches_the_host(world, resolver):
    os.symlink(world["secret"], world["root"] / "app" / "evil.json")
    os.symlink(world["secret"], world["root"] / "etc" / "evil.json")
    assert read(world, "evil.json") is None
    assert read(world, "/etc/evil.json") is None
    # The same path inside the container is what an absolute link means there.
    inside = world["root"] / str(world["secret"]).lstrip("/")
    inside.parent.mkdir(parents=True)
    inside.write_text('{"url": "container.example:2"}')
    assert read(world, "/etc/evil.json") == (
        '{"url": "container.example:2"}' if resolver == "openat2" else None
    )


def test_dot_dot_never_climbs_out(world, resolver):
    climb = "../" * 12 + str(world["secret"]).lstrip("/")
    assert read(world, climb) is None
    assert read(world, "/" + climb) is None
    os.symlink(
        "../../../../../../../../../../" + str(world["secret"]).lstrip("/"),
        world["root"] / "app" / "up.json",
    )
    assert read(world, "up.json") is None


def test_relative_links_inside_the_directory_work_only_with_openat2(world, resolver):
    os.symlink("sub/pools.txt", world["root"] / "app" / "linked.txt")
    expected = "pool1 = pool.example:5555\n" if resolver == "openat2" else None
    assert read(world, "linked.txt") == expected


def test_only_small_regular_files_are_read(world, resolver):
    os.mkfifo(world["root"] / "app" / "fifo.json")  # would block a plain open
    os.mknod(world["root"] / "app" / "null.json", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (world["root"] / "app" / "big.json").write_text("x" * 100)
    assert read(world, "fifo.json") is None
    assert read(world, "null.json") is None
    assert read(world, "big.json", max_bytes=99) is None
    assert read(world, "big.json", max_bytes=100) == "x" * 100
    assert read(world, "sub") is None and read(world, "") is None and read(world, "a\x00b") is None


def test_a_missing_process_reads_nothing(world, resolver):
    assert read_process_file(PID + 1, "config.json", 65536, world["proc"]) is None


def test_config_files_of_a_hostile_process(world, resolver):
    os.symlink(world["secret"], world["root"] / "app" / "config.ini")
    argv = [
        "./x",
        "-c",
        "/etc/miner.json",
        "--config=" + "../" * 9 + str(world["secret"]).lstrip("/"),
    ]
    files = read_config_files(PID, argv, world["proc"])
    assert sorted(files) == ["/etc/miner.json", "config.json"]
    assert "host-only" not in "".join(files.values())


def test_a_real_process_by_its_absolute_and_relative_paths(tmp_path):
    (tmp_path / "config.json").write_text('{"url": "pool.example:6666"}')
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path)
    try:
        assert "6666" in read_process_file(child.pid, "config.json", 65536)
        assert "6666" in read_process_file(child.pid, str(tmp_path / "config.json"), 65536)
    finally:
        child.kill()
        child.wait()


def test_a_working_directory_without_configs_is_looked_up_once_per_run(tmp_path, resolver):
    """Scan's memory of empty working directories: a process in the same directory skips the
    look-ups, one in another directory does not, and a config written there afterwards (the
    directory's mtime moves) is read."""
    from gpuguard.sources.proc.config_files import CwdWithoutConfigs

    shared, other = tmp_path / "shared", tmp_path / "other"
    shared.mkdir()
    other.mkdir()
    (other / "config.json").write_text('{"url": "pool.example:7777"}')
    proc = tmp_path / "proc"
    for pid, cwd in ((1001, shared), (1002, shared), (1003, other), (1004, shared)):
        (proc / str(pid)).mkdir(parents=True)
        os.symlink(cwd, proc / str(pid) / "cwd")
        os.symlink(tmp_path, proc / str(pid) / "root")
    empty = CwdWithoutConfigs()
    assert read_config_files(1001, ["./x"], str(proc), empty) == {}
    assert read_config_files(1002, ["./x"], str(proc), empty) == {}
    assert empty.hits == 1
    assert "7777" in read_config_files(1003, ["./x"], str(proc), empty)["config.json"]
    os.utime(shared, ns=(0, 1))  # any mtime other than the one remembered
    (shared / "pools.txt").write_text("pool = pool.example:8888\n")
    os.utime(shared, ns=(0, 2))
    assert "8888" in read_config_files(1004, ["./x"], str(proc), empty)["pools.txt"]
    assert empty.hits == 1


def test_a_name_that_is_there_but_unreadable_is_not_remembered_as_absent(tmp_path, resolver):
    """Only names the directory lacks are remembered: a FIFO or a symlink out of it may be
    replaced by a file without the directory's mtime moving, so it is looked up every time."""
    from gpuguard.sources.proc.config_files import CwdWithoutConfigs

    os.mkfifo(tmp_path / "config.json")
    proc = tmp_path / "proc"
    (proc / "1001").mkdir(parents=True)
    os.symlink(tmp_path, proc / "1001" / "cwd")
    empty = CwdWithoutConfigs()
    assert read_config_files(1001, ["./x"], str(proc), empty) == {}
    assert read_config_files(1001, ["./x"], str(proc), empty) == {}
    assert empty.hits == 0


def test_exe_hashes_keep_a_digest_per_image_but_never_a_failed_read(tmp_path):
    from gpuguard.sources.proc.files import ExeHashes

    hashes = ExeHashes(proc_root=str(tmp_path))
    identity = (1, 2, 3, 4)
    assert hashes.of(4242, identity) is None  # no such process here: nothing to read
    (tmp_path / "4243").mkdir()
    (tmp_path / "4243" / "exe").write_bytes(b"image")
    digest = hashes.of(4243, identity)  # a later process of the same image is hashed
    assert digest is not None and len(digest) == 64
    assert hashes.of(4244, identity) == digest  # and the digest is kept for the image
