"""Shared test set-up.

Tests marked ``root`` need root, a real kernel with eBPF and bcc.  Without
``--require-root-tests`` they skip when those are missing (a laptop run); with
it (CI and the README's test command) a missing prerequisite fails the test,
so a CI run can never go green with the kernel tests silently skipped.

Every root test says how it shares the host, with exactly one of three markers
(ROOT_CLASSES below; an unclassified root test stops the run with a message
naming it and the choices):

* ``host_mutator``: changes state every process on the host shares (vm.nr_hugepages
  and huge-page reservations, miner-shaped processes with CPU hogs beside them);
* ``host_observer``: asserts about such host-wide state (the huge-page pool,
  host findings, every client of a device);
* ``self_contained``: asserts only about the processes, cgroups, namespaces,
  pins and files it made itself, so anything may run beside it.

The classes are kept by a lock every run on the host shares (a file lock under
/run, so two workers or two checkouts alike): a mutator holds it shared, an
observer exclusively, for the whole test (set-up to teardown).  So mutators run
beside each other and beside anything self-contained, but never beside an
observer.  Mutators that change the same state compose: huge pages are reserved
by count (tests/support/hugepages.py), stand-ins are installed under a path of
their own process, and they assert only about the processes they started.

Every test is in exactly one tier (TIERS below), a marker this file gives it at collection
(``pytest -m unit`` runs the fast tier; README.md, "Tests"):

* ``e2e``: its file starts gpuguard as a program (``python -m gpuguard``, the CLI helpers of
  tests/support/cli.py and scan.py, an agent from tests/support/agent_run.py; E2E_SIGNS) or
  it takes a fixture named ``*agent``;
* ``kernel``: any other root test (eBPF, cgroups, namespaces, nftables in this process);
* ``unit``: the rest: no root, no live agent, no gpuguard process.

A test that carries one tier marker itself keeps it (the rule is for the common case).

Under pytest-xdist (``--dist loadgroup``, as packaging/setup-host.sh runs the
suite) the root tests form one group per file (its module fixtures are made
once), spread over the workers beside the tests that are not root.  The workers
take the work in the order this file sorts it (:func:`schedule`; xdist's own
reorder, largest group first by test count, is off: it handed out the one-test
files holding the longest live tests last, and three of them ran one after
another at the end): the groups holding host mutators alternate with the other
root groups (largest first), so the minute-long windows start early but about
half the workers at most run busy stand-ins and hogs at once (all of them at
once starved a nice-19 stand-in of the load group's CPU), then the tests that
are not root, thousands of short ones that even out the end.
"""

from __future__ import annotations

import compileall
import fcntl
import functools
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.sources.ebpf.probe_cache import ENV as PROBE_CACHE_ENV  # noqa: E402
from gpuguard.sources.host.yara_verdict_cache import ENV as YARA_CACHE_ENV  # noqa: E402
from tests.support.locks import host_lock  # noqa: E402 - the path above first


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-root-tests",
        action="store_true",
        help="fail (instead of skip) tests marked root when root/BPF/bcc are missing",
    )
    parser.addoption(
        "--image-dir",
        type=Path,
        nargs="?",
        const=Path("/var/cache/gpuguard-image"),
        default=None,
        help="run the tests marked image against the rootfs packaging/build-image.sh exported "
        "there (alone: /var/cache/gpuguard-image, build-image.sh's default); without it they "
        "are deselected",
    )
    parser.addoption(
        "--device-check",
        action="store_true",
        help="run the tests marked device_check (benchmarks/device_check.sh --dry-run, minutes): "
        ".ci/run runs them as a step of their own; without it they are deselected",
    )


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", None) == "loadgroup":
        config.option.loadscopereorder = False  # the order: schedule()
    # The tests start gpuguard hundreds of times; with PYTHONDONTWRITEBYTECODE set (as on the
    # project's machines) each start would compile every module again.  Once per run, not per worker.
    for name, what in ROOT_CLASSES.items():
        config.addinivalue_line("markers", f"{name}: a root test that {what}")
    config.addinivalue_line(
        "markers",
        "gpu: takes the fake NVML, or with GPUGUARD_REAL_NVML=1 on a GPU host the real one "
        "(tests/support/nvml_choice.py; benchmarks/device_check.sh)",
    )
    config.addinivalue_line(
        "markers",
        "slow: waits out a shipped rule window live (a minute or more); the other live tests "
        "layer tests/support/short_windows.py instead.  Run in CI like every test; "
        "-m 'not slow' leaves them out of a quick run",
    )
    config.addinivalue_line(
        "markers",
        "device_check: runs benchmarks/device_check.sh --dry-run (pytest --device-check, .ci/run's "
        "own step; deselected without it)",
    )
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: tier: {what}")
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(str(REPO / "gpuguard"), quiet=1)
        _own_caches(config)


def _own_caches(config: pytest.Config) -> None:
    """One probe cache and one YARA cache for this run, shared by its workers and every
    gpuguard they start, and gone after it: each run compiles each probe variant once, from
    cold, and the host's own caches (/var/cache/gpuguard) are neither used nor changed.  A run
    given GPUGUARD_PROBE_CACHE or GPUGUARD_YARA_CACHE (a directory, or "off") keeps that one."""
    if os.geteuid() != 0:
        return
    folder = tempfile.mkdtemp(prefix="gpuguard-test-caches-")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    for env in (PROBE_CACHE_ENV, YARA_CACHE_ENV):
        os.environ.setdefault(env, folder)  # the workers start after this, and inherit it


# How a root test shares the host (the module docstring); each one carries exactly one.
ROOT_CLASSES = {
    "host_mutator": "changes state the whole host shares (sysctls, huge pages, miner-shaped "
    "processes and CPU hogs, fixed paths): never beside a host_observer or another mutator",
    "host_observer": "asserts about state the whole host shares (huge pages, host findings, "
    "every client of a device): never beside a host_mutator",
    "self_contained": "asserts only about what it made (its processes, cgroups, namespaces, "
    "pins, files): may run beside anything",
}
# The tiers (the module docstring); each collected test carries exactly one.
TIERS = {
    "unit": "no root, no live agent, no gpuguard process (pytest -m unit: the fast tier)",
    "kernel": "a root test of the kernel side in this process: eBPF, cgroups, namespaces, nftables",
    "e2e": "its file starts gpuguard as a program (the CLI, an agent) or it takes an agent fixture",
}
# What in a test file's text says it starts gpuguard as a program.
E2E_SIGNS = re.compile(
    r'"-m",\s*"gpuguard"'  # python -m gpuguard
    r"|bin/gpuguard\b"  # the venv's or an image's entry point
    r"|from tests\.support\.(?:agent_run|cli) import"  # an agent; the CLI helpers
    r"|\b(?:run_scan|scan_json)\b"  # gpuguard scan (tests/support/scan.py)
)


@functools.cache
def _starts_gpuguard(path: Path) -> bool:
    return E2E_SIGNS.search(path.read_text()) is not None


def tier(item: pytest.Item) -> str | None:
    """The tier of a test by the rule above, or None when it carries several tier markers."""
    own = [name for name in TIERS if item.get_closest_marker(name) is not None]
    if own:
        return own[0] if len(own) == 1 else None
    if _starts_gpuguard(Path(str(item.path))) or any(
        f.endswith("agent") for f in getattr(item, "fixturenames", ())
    ):
        return "e2e"
    return "kernel" if item.get_closest_marker("root") is not None else "unit"


# mutators shared, observers exclusive (the variable: tests of the lock use one of their own)
HOST_LOCK = Path(os.environ.get("GPUGUARD_TEST_HOST_LOCK", "/run/gpuguard-test-host.lock"))
LOCK_MODES = {"host_mutator": fcntl.LOCK_SH, "host_observer": fcntl.LOCK_EX}


def root_class(item: pytest.Item) -> str | None:
    """The class of a root test, or None when it is not classified exactly once."""
    classes = [name for name in ROOT_CLASSES if item.get_closest_marker(name) is not None]
    return classes[0] if len(classes) == 1 else None


def root_group(item: pytest.Item) -> str | None:
    """The xdist group of a root test (one per file), or None when it is not classified exactly once."""
    if root_class(item) is None:
        return None
    return f"root-{Path(str(item.path)).stem}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A host mutator holds the host lock shared, an observer exclusively, set-up to teardown."""
    mode = LOCK_MODES.get(root_class(item)) if item.get_closest_marker("root") else None
    if mode is None or os.geteuid() != 0:  # (without root the test is skipped in its set-up)
        yield
        return
    with host_lock(HOST_LOCK, mode):
        yield


_unclassified: list[str] = []
_several_tiers: list[str] = []


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, before any collection_modifyitems hook (xdist's reads the groups there,
    # -m the tiers).
    level = tier(item)
    if level is None:
        _several_tiers.append(item.nodeid)
    elif item.get_closest_marker(level) is None:
        item.add_marker(getattr(pytest.mark, level))
    if item.get_closest_marker("root") is None:
        return
    group = root_group(item)
    if group is None:
        _unclassified.append(item.nodeid)  # the run stops below, before any test
        return
    item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Building the image takes minutes: its tests run where one was built and --image-dir says so.
    if config.getoption("--image-dir") is None:
        image = [i for i in items if i.get_closest_marker("image") is not None]
        if image:
            config.hook.pytest_deselected(items=image)
            items[:] = [i for i in items if i.get_closest_marker("image") is None]
    # The device check's dry run has its own step and time budget in .ci/run.
    if not config.getoption("--device-check"):
        check = [i for i in items if i.get_closest_marker("device_check") is not None]
        if check:
            config.hook.pytest_deselected(items=check)
            items[:] = [i for i in items if i.get_closest_marker("device_check") is None]
    if _several_tiers:
        raise pytest.UsageError(
            f"{len(_several_tiers)} tests carry more than one tier marker ({_several_tiers[0]} ...) "
            f"(fix: keep one of {', '.join(TIERS)}, or none to let tests/conftest.py choose)"
        )
    if _unclassified:
        choices = "; ".join(f"@pytest.mark.{name}: {what}" for name, what in ROOT_CLASSES.items())
        raise pytest.UsageError(
            f"{len(_unclassified)} root tests do not say how they share the host "
            f"({', '.join(_unclassified[:5])}{' ...' if len(_unclassified) > 5 else ''}) "
            f"(fix: mark each with exactly one of: {choices}; see tests/conftest.py)"
        )
    schedule(items)
    # xdist marks a grouped test by its node id; where that silently stops working
    # (pytest-dev/pytest-xdist#1386) root tests would run side by side: refuse instead.
    if getattr(config.option, "loadgroup", False):
        loose = [i.nodeid for i in items if i.get_closest_marker("root") and "@" not in i.nodeid]
        if loose:
            raise pytest.UsageError(
                f"pytest-xdist did not group the root tests ({loose[0]} ...): this pytest and "
                "pytest-xdist disagree (fix: bash packaging/setup-host.sh setup, or pass -n 0)"
            )


def schedule(items: list[pytest.Item]) -> None:
    """Sort ``items`` in the order the workers take them (the module docstring): groups with a
    host mutator alternating with the other root groups (largest first), then the rest, each
    part otherwise in collection order."""
    sizes: dict[str, int] = {}
    mutating: set[str] = set()
    for item in items:
        group = root_group(item)
        if group is not None:
            sizes[group] = sizes.get(group, 0) + 1
            if root_class(item) == "host_mutator":
                mutating.add(group)
    others = sorted((g for g in sizes if g not in mutating), key=lambda g: -sizes[g])
    place = {group: 2 * i for i, group in enumerate(g for g in sizes if g in mutating)}
    place |= {group: 2 * i + 1 for i, group in enumerate(others)}
    last = 2 * len(sizes)
    items.sort(key=lambda item: place.get(root_group(item) or "", last))


def _root_test_blocker() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable (apt-get install python3-bpfcc; use a venv with --system-site-packages)"
    if not Path(f"/lib/modules/{os.uname().release}/build/include").exists():
        return "kernel headers missing (bash packaging/setup-host.sh setup)"
    if shutil.which("unshare") is None:
        return "unshare(1) missing (apt-get install util-linux)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is None:
        return
    blocker = _root_test_blocker()
    if blocker is None:
        return
    if item.config.getoption("--require-root-tests"):
        pytest.fail(f"root test cannot run here: {blocker}", pytrace=False)
    pytest.skip(f"root test: {blocker}")


_skipped_root_tests: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "root" in report.keywords:
        _skipped_root_tests.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.getoption("--require-root-tests") and _skipped_root_tests:
        print(
            f"\nERROR: {len(_skipped_root_tests)} root tests were skipped: {_skipped_root_tests[:5]}"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_agent():
    """The live eBPF agent this test process shares, started at its first use
    (tests/support/shared_agent.py): a test that takes it asserts only about its own pids."""
    from tests.support.shared_agent import shared_agent_running

    with shared_agent_running() as agent:
        yield agent


@pytest.fixture(scope="module")
def miner_finding():
    """The golden stratum miner's malicious finding (the output tests render it in every format)."""
    from tests.support.findings import replayed_miner_finding

    return replayed_miner_finding()


@pytest.fixture
def covert_host(tmp_path, monkeypatch):
    """A covert miner beside an HTTPS client, the fake H100 it drives (tests/support/covert_host.py)."""
    from tests.support.covert_host import covert_host_running

    with covert_host_running(tmp_path, monkeypatch) as host:
        yield host
