"""The host readers' short cuts answer as the full work does.

``LD_PRELOAD`` is looked for only in environments holding the bytes ``LD_PRELOAD=``; a cgroup
file's text is parsed once per distinct text; ``-c``/``--config`` paths are looked for only
in arguments starting like one of the options; an autostart link under the root ``/`` is
followed by the kernel, not resolved component by component first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.sources.host.persistence import _Reader
from gpuguard.sources.proc.config_files import CONFIG_OPTIONS, config_paths_from_argv
from gpuguard.sources.proc.containers import read_cgroup_path
from gpuguard.sources.proc.process import _ld_preload_of

ENVIRONS = [
    b"",
    b"HOME=/root\x00PATH=/usr/bin\x00",
    b"LD_PRELOAD=/tmp/h.so\x00HOME=/root\x00",
    b"HOME=/root\x00LD_PRELOAD=/tmp/a.so\x00LD_PRELOAD=/tmp/b.so\x00",  # the last one wins
    b"LD_PRELOAD=\x00",  # set, empty
    b"FOO=xLD_PRELOAD=/tmp/h.so\x00",  # the bytes, inside another variable
    b"HOME=/root\x00LD_PRELOAD=/tmp/\xff.so",  # no final NUL, not UTF-8
    b"ld_preload=/tmp/h.so\x00",
]


def _every_entry(raw: bytes) -> str | None:
    """What the reader gave before the short cut: every entry split and looked at."""
    value = None
    for entry in raw.decode("utf-8", "surrogateescape").split("\x00"):
        if entry.startswith("LD_PRELOAD="):
            value = entry[len("LD_PRELOAD=") :]
    return value


@pytest.mark.parametrize("raw", ENVIRONS)
def test_ld_preload_is_what_every_entry_gives(tmp_path: Path, raw: bytes):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "environ").write_bytes(raw)
    sink: dict = {}
    assert _ld_preload_of(42, str(tmp_path), sink, (42, 1.0)) == (_every_entry(raw), True)
    assert sink == {(42, 1.0): raw}


CGROUPS = {
    "v2": b"0::/user.slice/user-1000.slice/session-3.scope\n",
    "v1 docker": (
        b"12:memory:/docker/" + b"a" * 64 + b"\n11:cpu:/docker/" + b"a" * 64 + b"\n0::/\n"
    ),
    "v1 plain": b"4:memory:/process_api/b02b\n1:cpu:/\n0::/\n",
    "empty": b"",
}


def test_one_cgroup_text_read_by_many_processes_gives_each_its_path(tmp_path: Path):
    expected = {
        "v2": "/user.slice/user-1000.slice/session-3.scope",
        "v1 docker": "/docker/" + "a" * 64,
        "v1 plain": "/process_api/b02b",  # no container: the first v1 path
        "empty": "",
    }
    for round_ in range(2):  # the second round answers from what the first parsed
        for pid, (name, text) in enumerate(CGROUPS.items(), start=100 + 10 * round_):
            (tmp_path / str(pid)).mkdir()
            (tmp_path / str(pid) / "cgroup").write_bytes(text)
            assert read_cgroup_path(pid, str(tmp_path)) == expected[name], name


@pytest.mark.parametrize(
    "argv, paths",
    [
        (["xmrig", "-c", "x.json"], ["x.json"]),
        (["xmrig", "--config=a.json", "--config", "b.json"], ["a.json", "b.json"]),
        (["m", "-config", "c.ini", "--config-file=d.txt"], ["c.ini", "d.txt"]),
        (["m", "-cx", "--configure", "-c"], []),  # neither an option nor its value
        (["sleep", "3600"], []),
        (["sh", "-c", "echo hi"], ["echo hi"]),  # named: late_evidence decides what counts
    ],
)
def test_config_paths_from_argv(argv: list[str], paths: list[str]):
    assert config_paths_from_argv(argv) == paths
    assert all(option.startswith(("-c", "--c")) for option in CONFIG_OPTIONS)


def test_autostart_links_under_the_root_slash_read_what_a_resolved_link_reads(tmp_path: Path):
    unit = tmp_path / "lib" / "x.service"
    unit.parent.mkdir()
    unit.write_text("[Service]\nExecStart=/usr/bin/xmrig -o stratum+tcp://p:3333\n")
    wants = tmp_path / "etc" / "multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "x.service").symlink_to("../../lib/x.service")  # relative, through ..
    (wants / "again.service").symlink_to(unit)  # the same file: read once
    (wants / "dangling.service").symlink_to(tmp_path / "nowhere")
    (wants / "loop.service").symlink_to(wants / "loop.service")
    read = {}
    for root in ("/", str(tmp_path.parent)):  # the short cut, and the resolving path
        reader = _Reader(root)
        reader.read_dir(str(wants), "systemd-unit")
        read[root] = [(f.path.rsplit("/", 1)[-1], f.lines) for f in reader.scan.files]
    assert read["/"] == read[str(tmp_path.parent)]
    assert read["/"] == [
        (
            "again.service",
            [(1, "[Service]"), (2, "ExecStart=/usr/bin/xmrig -o stratum+tcp://p:3333")],
        )
    ]
