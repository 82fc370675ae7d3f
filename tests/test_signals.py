"""Signals, table-driven: each named signal computed from a known process state."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuguard.config.yaml_marks import Position
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.ruleset.conditions import CompileContext, ListDef, compile_condition
from gpuguard.detect.signals.reader import SignalReader
from gpuguard.detect.signals.table import SIGNALS
from gpuguard.events.model import ConnActivity, CpuActivity
from gpuguard.events.process_facts import Ancestor, ProcessFacts

T = 1_700_000_000.0
WALLET = "4" + "A" * 94
JA4 = "t13i310900_e8f1e7e78f70_1f22a2ca17c4"  # OpenSSL 3's client, no SNI, no ALPN


def signals_listed_in(test_file: str) -> set[str]:
    """The TESTED_SIGNALS a test file lists beside its tests, read from its text (test files
    import no other test file)."""
    tree = ast.parse((Path(__file__).parent / test_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "TESTED_SIGNALS"
        ]:
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{test_file} lists no TESTED_SIGNALS")


def make(comm="app", exe="/usr/bin/app", cmdline=None, **facts_kwargs) -> ProcessState:
    facts = ProcessFacts(
        pid=100,
        start_time=T,
        comm=comm,
        exe=exe,
        cmdline=cmdline if cmdline is not None else [exe],
        **facts_kwargs,
    )
    state = ProcessState(ProcessKey(100, T), first_seen=T, last_seen=T)
    state.set_facts(facts)
    return state


def with_(state: ProcessState, fn) -> ProcessState:
    fn(state)
    return state


def gpu_series(values, step=5.0, memory=None):
    def apply(s):
        for i, v in enumerate(values):
            s.add_gpu_sample(T + i * step, v, memory)

    return apply


def payload(protocol, detail):
    return lambda s: s.add_payload(T + 1, protocol, detail)


def _cpu_look(s: ProcessState) -> None:
    s.cpu_activity = CpuActivity(
        time=T + 100,
        pid=100,
        threads=2,
        spinning_threads=1,
        spin_span_s=95.0,
        runnable_max=0.97,
        ran_share=0.02,
        fpu_samples=80,
        fpu_round_nondefault=55,
        fpu_round_changes=40,
        fpu_span_s=90.0,
    )


# 80 looks of one thread: 20 per mode, each followed by every mode 5 times (independent) but
# for the thread's last look; 4 of its switch-outs were sleeps
_EVEN = [20, 20, 20, 20]
_INDEPENDENT = [5] * 15 + [4]
# interval arithmetic: nearest, down, up in turn, never toward zero
_INTERVAL = [40, 20, 20, 0]
_CYCLE = [0, 20, 0, 0, 0, 0, 20, 0, 19, 0, 0, 0, 0, 0, 0, 0]  # nearest -> down -> up -> nearest


def _rounding(modes, transitions, sleeps=4):
    def apply(s: ProcessState) -> None:
        _cpu_look(s)
        s.cpu_activity.fpu_modes = list(modes)
        s.cpu_activity.fpu_transitions = list(transitions)
        s.cpu_activity.fpu_samples = sum(modes)
        s.cpu_activity.fpu_sleeps = sleeps
        s.cpu_activity.fpu_sleepless_threads = int(sleeps <= 0.05 * sum(modes))

    return apply


def _quiet(bytes_in: int):
    def apply(s: ProcessState) -> None:
        s.add_session(
            ConnActivity(
                time=T + 300,
                pid=100,
                fd=3,
                age_s=300.0,
                bytes_out=1548,
                writes_out=12,
                small_writes=12,
                remote="127.0.0.1:443",
                bytes_in=bytes_in,
                data_segs_in=20,
            )
        )

    return apply


SIGNAL_CASES = [
    # identity
    ("comm", make(comm="kworker/0:1"), "comm", "kworker/0:1"),
    ("exe_name lower", make(exe="/opt/X/XMRig"), "exe_name", "xmrig"),
    ("exe_dir", make(exe="/dev/shm/.x/kw"), "exe_dir", "/dev/shm/.x"),
    (
        "process_names",
        make(comm="Foo", exe="/opt/bar", cmdline=["/tmp/baz", "-x"]),
        "process_names",
        {"foo", "bar", "baz"},
    ),
    (
        "mismatch masquerade",
        make(comm="kworker/0:1", exe="/dev/shm/x", cmdline=["x"]),
        "comm_differs_from_exe",
        True,
    ),
    (
        "no mismatch python3 vs python3.11",
        make(comm="python3", exe="/usr/bin/python3.11", cmdline=["python3", "t.py"]),
        "comm_differs_from_exe",
        False,
    ),
    (
        "no mismatch script",
        make(comm="run.sh", exe="/usr/bin/bash", cmdline=["/bin/bash", "/opt/run.sh"]),
        "comm_differs_from_exe",
        False,
    ),
    (
        "mismatch prefix then letter",
        make(comm="x", exe="/tmp/xmrig", cmdline=["y"]),
        "comm_differs_from_exe",
        True,
    ),
    (
        "comm truncated to 15",
        make(comm="very-long-progra", exe="/usr/bin/very-long-program-name", cmdline=[]),
        "comm_differs_from_exe",
        False,
    ),
    (
        "memfd name",
        make(comm="x", exe="/memfd:x", cmdline=["x"], exe_memfd=True),
        "comm_differs_from_exe",
        False,
    ),
    (
        "kernel thread",
        make(comm="kworker/1:0", exe="", cmdline=[], kernel_thread=True),
        "kernel_thread",
        True,
    ),
    ("has executable", make(exe=""), "has_executable", False),
    (
        "bracketed cmdline",
        make(exe="/dev/shm/x", cmdline=["[kworker/0:1]"]),
        "cmdline_bracketed",
        True,
    ),
    (
        "bracketed, real kthread",
        make(exe="", cmdline=["[kworker/0:1]"]),
        "cmdline_bracketed",
        False,
    ),
    ("exe deleted", make(exe_deleted=True), "exe_deleted", True),
    ("exe memfd", make(exe="/memfd:payload", exe_memfd=True), "exe_memfd", True),
    (
        "exe memfd name",
        make(exe="/memfd:runc_cloned:/proc/self/exe", exe_memfd=True),
        "exe_memfd_name",
        "runc_cloned:/proc/self/exe",
    ),
    ("exe not memfd, no name", make(), "exe_memfd_name", None),
    ("user", make(username="www-data", uid=33), "user", "www-data"),
    ("uid", make(uid=33), "uid", 33),
    ("uid unknown", make(), "uid", None),
    ("container", make(container_id="ab" * 32), "in_container", True),
    ("no container", make(), "in_container", False),
    (
        "ld_preload set",
        make(ld_preload="/lib/libhide.so", environ_readable=True),
        "ld_preload_set",
        True,
    ),
    ("ld_preload unreadable env", make(environ_readable=False), "ld_preload_set", None),
    ("age", make(), "age_s", 0.0),
    # command line
    (
        "cmdline schemes",
        make(cmdline=["xmrig", "-o", "stratum+ssl://u.w@pool.x.com:443"]),
        "cmdline_url_schemes",
        {"stratum+ssl"},
    ),
    (
        "cmdline hosts from -o host:port",
        make(cmdline=["m", "-o", "Pool.SupportXMR.com:3333"]),
        "cmdline_hosts",
        {"pool.supportxmr.com"},
    ),
    (
        "cmdline ports",
        make(cmdline=["m", "--url=gulf.moneroocean.stream:10128", "stratum+tcp://a.b:4444"]),
        "cmdline_ports",
        {10128, 4444},
    ),
    (
        "cmdline endpoints",
        make(cmdline=["ethminer", "-P", "stratum1+tcp://0xabc.w@eth.2miners.com:2020"]),
        "cmdline_endpoints",
        {"stratum1+tcp://eth.2miners.com:2020"},
    ),
    (
        "-o file is not an endpoint",
        make(cmdline=["gcc", "-o", "out.o", "a.c"]),
        "cmdline_endpoints",
        set(),
    ),
    (
        "cmdline flags",
        make(cmdline=["x", "--donate-level=1", "-a", "rx/0", "file"]),
        "cmdline_flags",
        {"--donate-level", "-a"},
    ),
    (
        "algorithm",
        make(cmdline=["x", "-a", "RX/0", "--algo=kawpow", "--coin", "XMR"]),
        "cmdline_algorithm",
        {"rx/0", "kawpow", "xmr"},
    ),
    ("cmdline text", make(cmdline=["a", "b c"]), "cmdline", "a b c"),
    # config files
    (
        "config endpoints json",
        make(
            config_files={
                "config.json": '{"pools": [{"url": "stratum+tcp://pool.minexmr.com:4444"}]}'
            }
        ),
        "config_endpoints",
        {"stratum+tcp://pool.minexmr.com:4444"},
    ),
    (
        "config keys",
        make(config_files={"config.json": '{"donate-level": 1, "pools": [{"url": "a.b:1"}]}'}),
        "config_keys",
        {"donate-level", "pools", "url"},
    ),
    (
        "config ini",
        make(
            config_files={"config.ini": "[Ethash]\nwallet = 0xabc\npool1 = eth.2miners.com:2020\n"}
        ),
        "config_hosts",
        {"eth.2miners.com"},
    ),
    (
        "config ports",
        make(config_files={"config.ini": "pool1 = eth.2miners.com:2020\n"}),
        "config_ports",
        {2020},
    ),
    ("config not json nor ini", make(config_files={"x": "\x00\x01garbage"}), "config_keys", set()),
    # network
    (
        "connect ports",
        with_(
            make(), lambda s: (s.add_connection("1.2.3.4", 3333), s.add_connection("1.2.3.4", 3333))
        ),
        "connect_ports",
        {3333},
    ),
    (
        "connect count",
        with_(
            make(), lambda s: (s.add_connection("1.2.3.4", 3333), s.add_connection("1.2.3.4", 3333))
        ),
        "connect_count",
        2,
    ),
    (
        "connect addresses",
        with_(make(), lambda s: s.add_connection("10.0.0.1", 80)),
        "connect_addresses",
        {"10.0.0.1"},
    ),
    (
        "connected to revealed",
        with_(
            make(cmdline=["x", "-o", "pool.x.com:5555"]),
            lambda s: s.add_connection("9.9.9.9", 5555),
        ),
        "connected_to_revealed_port",
        True,
    ),
    (
        "not connected to revealed",
        with_(
            make(cmdline=["x", "-o", "pool.x.com:5555"]), lambda s: s.add_connection("9.9.9.9", 443)
        ),
        "connected_to_revealed_port",
        False,
    ),
    (
        "payload protocols",
        with_(make(), payload("stratum", {"method": "mining.subscribe"})),
        "payload_protocols",
        {"stratum"},
    ),
    (
        "payload agent",
        with_(
            make(),
            payload("cryptonote", {"method": "login", "agent": "XMRig/6.21.0", "login": WALLET}),
        ),
        "payload_agents",
        {"XMRig/6.21.0"},
    ),
    (
        "payload login",
        with_(make(), payload("cryptonote", {"login": WALLET})),
        "payload_logins",
        {WALLET},
    ),
    (
        "payload methods",
        with_(make(), payload("stratum", {"method": "mining.subscribe"})),
        "payload_methods",
        {"mining.subscribe"},
    ),
    (
        "sni host",
        with_(make(), payload("tls", {"sni": "Gulf.MoneroOcean.Stream."})),
        "payload_hosts",
        {"gulf.moneroocean.stream"},
    ),
    (
        "http connect target",
        with_(make(), payload("http", {"method": "CONNECT", "target": "pool.supportxmr.com:443"})),
        "proxy_target_hosts",
        {"pool.supportxmr.com"},
    ),
    (
        "http connect port",
        with_(make(), payload("http", {"method": "CONNECT", "target": "pool.supportxmr.com:443"})),
        "proxy_target_ports",
        {443},
    ),
    (
        "socks target",
        with_(make(), payload("socks5", {"target_host": "xmr.2miners.com", "target_port": 2222})),
        "proxy_target_ports",
        {2222},
    ),
    (
        "revealed hosts",
        with_(make(cmdline=["m", "-o", "a.example:1"]), payload("tls", {"sni": "b.example"})),
        "revealed_hosts",
        {"a.example", "b.example"},
    ),
    # gpu
    (
        "device classes",
        with_(make(), lambda s: s.gpu_device_classes.update({"nvidia-uvm", "nvidia"})),
        "gpu_device_classes",
        {"nvidia", "nvidia-uvm"},
    ),
    (
        "ioctl categories",
        with_(make(), lambda s: s.add_ioctl(T, "NV_ESC_RM_CONTROL", "query", 5)),
        "ioctl_categories",
        {"query"},
    ),
    (
        "ioctl query only",
        with_(make(), lambda s: (s.add_ioctl(T, "A", "query", 5), s.add_ioctl(T, "B", "setup", 1))),
        "ioctl_query_only",
        True,
    ),
    (
        "ioctl not query only",
        with_(
            make(), lambda s: (s.add_ioctl(T, "A", "query", 5), s.add_ioctl(T, "B", "submit", 1))
        ),
        "ioctl_query_only",
        False,
    ),
    ("ioctl none", make(), "ioctl_query_only", None),
    (
        "written classes",
        with_(
            make(),
            lambda s: (
                s.add_gpu_device("msr", "/dev/cpu/0/msr", written=True),
                s.add_gpu_device("hugepages-config", "/proc/sys/vm/nr_hugepages"),
            ),
        ),
        "device_classes_written",
        {"msr"},
    ),
    # huge pages: the sensor's largest request, or what /proc says it maps, whichever is larger
    (
        "huge request (sensor)",
        with_(make(), lambda s: s.add_huge_alloc(2181038080, 1 << 30)),
        "huge_alloc_bytes",
        2181038080,
    ),
    (
        "huge mapped (/proc)",
        make(hugetlb_bytes=256 << 20, hugetlb_page_size=2 << 20),
        "huge_alloc_bytes",
        256 << 20,
    ),
    ("no huge pages", make(hugetlb_bytes=0), "huge_alloc_bytes", None),
    (
        "RandomX's cache mapped (/proc)",
        make(hugetlb_bytes=256 << 20, hugetlb_mappings=[[256 << 20, 2 << 20]]),
        "huge_alloc_randomx_shape",
        True,
    ),
    (
        "a JVM's large-page heap (measured: 290 MiB of a 1 GiB heap)",
        make(hugetlb_bytes=290 << 20, hugetlb_mappings=[[1 << 30, 2 << 20]]),
        "huge_alloc_randomx_shape",
        False,
    ),
    (
        "RandomX's dataset asked for",
        with_(make(), lambda s: s.add_huge_alloc(2181038016, 2 << 20)),
        "huge_alloc_randomx_shape",
        True,
    ),
    (
        "the dataset in three 1 GiB pages",
        with_(make(), lambda s: s.add_huge_alloc(3 << 30, 1 << 30)),
        "huge_alloc_randomx_shape",
        True,
    ),
    (
        "3 GiB in 2 MiB pages",
        with_(make(), lambda s: s.add_huge_alloc(3 << 30, 2 << 20)),
        "huge_alloc_randomx_shape",
        False,
    ),
    # runnable threads and rounding modes: the latest CpuActivity (tests/test_randomx_*.py)
    ("spinning", with_(make(), _cpu_look), "cpu_spinning_threads", 1),
    ("spin span", with_(make(), _cpu_look), "cpu_spin_s", 95.0),
    ("runnable max", with_(make(), _cpu_look), "cpu_runnable_max", 0.97),
    ("ran share", with_(make(), _cpu_look), "cpu_ran_share", 0.02),
    ("fpu watched", with_(make(), _cpu_look), "fpu_watched", True),
    ("fpu changes", with_(make(), _cpu_look), "fpu_rounding_changes", 40),
    ("fpu nondefault", with_(make(), _cpu_look), "fpu_rounding_nondefault", 55),
    ("fpu span", with_(make(), _cpu_look), "fpu_rounding_s", 90.0),
    ("fpu looks", with_(make(), _rounding(_EVEN, _INDEPENDENT)), "fpu_rounding_looks", 80),
    ("fpu modes", with_(make(), _rounding(_INTERVAL, _CYCLE)), "fpu_rounding_modes", 3),
    ("even shares", with_(make(), _rounding(_EVEN, _INDEPENDENT)), "fpu_rounding_min_share", 0.25),
    ("no toward zero", with_(make(), _rounding(_INTERVAL, _CYCLE)), "fpu_rounding_min_share", 0.0),
    ("even: p 1", with_(make(), _rounding(_EVEN, _INDEPENDENT)), "fpu_rounding_uniform_p", 1.0),
    (
        "even: w 0",
        with_(make(), _rounding(_EVEN, _INDEPENDENT)),
        "fpu_rounding_uniform_distance",
        0.0,
    ),
    # (40-20)^2/20 + 2 * 0 + 20 = 40; sqrt(40 / 80)
    (
        "interval: w",
        with_(make(), _rounding(_INTERVAL, _CYCLE)),
        "fpu_rounding_uniform_distance",
        0.707,
    ),
    (
        "independent",
        with_(make(), _rounding(_EVEN, _INDEPENDENT)),
        "fpu_rounding_dependence",
        0.023,
    ),
    (
        "independent: p",
        with_(make(), _rounding(_EVEN, _INDEPENDENT)),
        "fpu_rounding_independent_p",
        1.0,
    ),
    # every pair follows the 3-cycle: p ~1e-24
    ("a cycle: p", with_(make(), _rounding(_INTERVAL, _CYCLE)), "fpu_rounding_independent_p", 0.0),
    ("a cycle", with_(make(), _rounding(_INTERVAL, _CYCLE)), "fpu_rounding_dependence", 1.0),
    # x2 0 over 80 looks: a program 0.55 from even never shows that
    ("benign p", with_(make(), _rounding(_EVEN, _INDEPENDENT)), "fpu_rounding_benign_p", 0.0),
    (
        "benign p: ruled out",
        with_(make(), _rounding(_INTERVAL, _CYCLE)),
        "fpu_rounding_benign_p",
        None,
    ),
    ("random", with_(make(), _rounding(_EVEN, _INDEPENDENT)), "fpu_rounding_random", True),
    ("not random", with_(make(), _rounding(_INTERVAL, _CYCLE)), "fpu_rounding_random", False),
    (
        "sleepless",
        with_(make(), _rounding(_EVEN, _INDEPENDENT)),
        "fpu_rounding_sleepless_threads",
        1,
    ),
    # 40 looks: too few to judge
    (
        "few looks",
        with_(make(), _rounding([10, 10, 10, 10], [3] * 13)),
        "fpu_rounding_random",
        None,
    ),
    (
        "not watched",
        with_(make(), lambda s: setattr(s, "cpu_activity", CpuActivity(time=T, pid=100))),
        "fpu_rounding_sleepless_threads",
        None,
    ),
    ("no cpu look", make(), "cpu_spinning_threads", None),
    ("quiet session", with_(make(), _quiet(3600)), "quiet_session_age_s", 300.0),
    (
        "quiet session words",
        with_(make(), _quiet(3600)),
        "quiet_session_summary",
        "quiet session to 127.0.0.1:443 (fd 3): 12 small writes out / 20 segments in, "
        "1.5 KiB out / 3.5 KiB in over 300 s (5.2 B/s out)",
    ),
    ("a download is not quiet", with_(make(), _quiet(30_000_000)), "quiet_session_age_s", None),
    # slow (100 B/s over its age) but in full segments: a trickling download, not a pool
    ("full segments in are not quiet", with_(make(), _quiet(30_000)), "quiet_session_age_s", None),
    ("peer pushes", with_(make(), _quiet(3600)), "quiet_session_pushes", 8),  # 20 in, 12 out
    ("push interval", with_(make(), _quiet(3600)), "quiet_session_push_s", 37.5),
    ("ja4", with_(make(), payload("tls", {"ja4": JA4})), "tls_ja4", {JA4}),
    (
        "reached by address",
        with_(with_(make(), _quiet(3600)), payload("tls", {"ja4": JA4})),
        "quiet_session_by_address",
        True,
    ),
    (
        "named by its SNI",
        with_(with_(make(), _quiet(3600)), payload("tls", {"sni": "pool.example", "ja4": JA4})),
        "quiet_session_by_address",
        False,
    ),
    (
        "named in its command line",
        with_(
            with_(make(cmdline=["app", "-o", "pool.example:443"]), _quiet(3600)),
            payload("tls", {"ja4": JA4}),
        ),
        "quiet_session_by_address",
        False,
    ),
    ("no payload seen: cannot tell", with_(make(), _quiet(3600)), "quiet_session_by_address", None),
    (
        "bytes per CPU second",  # 5148 bytes over 95 s of one thread that ran 2 % of it
        with_(with_(make(), _quiet(3600)), _cpu_look),
        "quiet_session_bytes_per_cpu_s",
        2709.47,
    ),
    (
        "config deleted",
        make(config_files={"/etc/a/s.json (deleted after start)": "", "/etc/b.json": "{}"}),
        "config_deleted",
        {"/etc/a/s.json"},
    ),
    (
        "1 GiB pages (sensor)",
        with_(make(hugetlb_bytes=0), lambda s: s.add_huge_alloc(1 << 30, 1 << 30)),
        "huge_page_size",
        1 << 30,
    ),
    (
        "2 MiB pages (/proc)",
        make(hugetlb_bytes=8 << 30, hugetlb_page_size=2 << 20),
        "huge_page_size",
        2 << 20,
    ),
    (
        "ioctl total",
        with_(
            make(), lambda s: (s.add_ioctl(T, "A", "query", 5), s.add_ioctl(T, "B", "submit", 7))
        ),
        "ioctl_total",
        12,
    ),
    (
        "ioctl names",
        with_(make(), lambda s: s.add_ioctl(T, "UVM_REGISTER_CHANNEL", "submit", 1)),
        "ioctl_names",
        {"UVM_REGISTER_CHANNEL"},
    ),
    ("gpu mean", with_(make(), gpu_series([90, 100, 95])), "gpu_util_mean", 95.0),
    ("gpu variance", with_(make(), gpu_series([90, 100])), "gpu_util_variance", 25.0),
    ("gpu variance one sample", with_(make(), gpu_series([90])), "gpu_util_variance", None),
    ("gpu min", with_(make(), gpu_series([90, 10, 95])), "gpu_util_min", 10.0),
    ("gpu window", with_(make(), gpu_series([1, 2, 3, 4])), "gpu_util_window_s", 15.0),
    ("gpu samples", with_(make(), gpu_series([1, 2, 3, 4])), "gpu_util_samples", 4),
    (
        "gpu memory",
        with_(make(), gpu_series([1], memory=3 << 30)),
        "gpu_memory_bytes",
        float(3 << 30),
    ),
    (
        "gpu memory fraction",
        with_(
            make(),
            lambda s: (
                gpu_series([1], memory=40 << 30)(s),
                setattr(s, "gpu_memory_total", 80 << 30),
            ),
        ),
        "gpu_memory_fraction",
        0.5,
    ),
    (
        "gpu memory unknown total",
        with_(make(), gpu_series([1], memory=40 << 30)),
        "gpu_memory_fraction",
        None,
    ),
    ("no gpu samples", make(), "gpu_util_mean", None),
    # scanning and ancestry
    (
        "yara",
        with_(make(), lambda s: s.yara_matches.add("xmrig_strings")),
        "yara_rules",
        {"xmrig_strings"},
    ),
    (
        "parent name",
        make(
            ancestors=[
                Ancestor(9, "PHP-FPM", "/usr/sbin/php-fpm8.2"),
                Ancestor(1, "systemd", "/sbin/init"),
            ]
        ),
        "parent_name",
        "php-fpm",
    ),
    (
        "ancestor names",
        make(ancestors=[Ancestor(9, "sh", "/usr/bin/dash"), Ancestor(8, "cron", "/usr/sbin/cron")]),
        "ancestor_names",
        {"sh", "dash", "cron"},
    ),
    (
        "ancestor exes",
        make(ancestors=[Ancestor(9, "sh", "/usr/bin/dash")]),
        "ancestor_exes",
        {"/usr/bin/dash"},
    ),
    ("no parent verdict", make(), "parent_verdict", None),
]


@pytest.mark.parametrize(
    "name,state,signal,expected", SIGNAL_CASES, ids=[c[0] for c in SIGNAL_CASES]
)
def test_signal(name, state, signal, expected):
    value = SignalReader(state, T).get(signal)
    if isinstance(expected, set):
        assert set(value) == expected
    else:
        assert value == expected


def test_every_signal_is_exercised_or_computable():
    tested = {c[2] for c in SIGNAL_CASES}
    state = make()
    for name, signal in SIGNALS.items():
        SignalReader(state, T).get(name)  # computes without error on a plain state
        assert signal.type in ("bool", "number", "text", "texts", "numbers")
        assert signal.description
    untested = (
        set(SIGNALS)
        - tested
        - {f"ioctl_rate_{c}" for c in ("submit", "memory", "query", "setup", "other")}
    )
    untested -= {"ioctl_command_rate"}  # test_ioctl_rate_over_the_last_minute
    untested -= signals_listed_in("test_gpu_behaviour.py") | signals_listed_in("test_sessions.py")
    assert untested <= {
        "exe",
        "cgroup",
        "container_id",
        "ld_preload",
        "hour_of_day",
        "exited",
        "cmdline_hosts",
        "config_url_schemes",
        "gpu_paths",
        "gpu_util_latest",
        "cpu_percent_mean",
        "cpu_window_s",
        "yara_tags",
        "parent_exe",
        "parent_score",
        "proxy_target_hosts",
        "payload_hosts",
        # the pod's names and image, as the node gives them (tests/test_kubernetes_names.py,
        # test_agent_kubernetes_identity.py)
        "k8s_namespace",
        "k8s_pod",
        "k8s_container",
        "container_image",
    }, untested


def test_ioctl_rate_over_the_last_minute():
    state = make()
    for i in range(120):  # 10 submits per second for two minutes
        state.add_ioctl(T + i, "UVM_REGISTER_CHANNEL", "submit", 10)
    reader = SignalReader(state, T + 119)
    assert reader.get("ioctl_rate_submit") == pytest.approx(10.0, rel=0.05)
    assert reader.get("ioctl_rate_query") == 0.0
    assert SignalReader(state, T + 119 + 3600).get("ioctl_rate_submit") == 0.0
    assert reader[("ioctl_command_rate", "UVM_REGISTER_CHANNEL")] == pytest.approx(10.0, rel=0.05)
    assert reader[("ioctl_command_rate", "NV_ESC_RM_CONTROL")] == 0.0
    assert reader["ioctl_command_rate"] is None  # without a command: nothing to measure


def test_rate_of_one_decoded_command_in_a_condition():
    state = make()
    for i in range(60):
        state.add_ioctl(T + i, "UVM_REGISTER_CHANNEL", "submit", 50)
        state.add_ioctl(T + i, "UVM_MAP_EXTERNAL_ALLOCATION", "submit", 1)
    busy = compile_({"signal": "ioctl_command_rate", "command": "UVM_REGISTER_CHANNEL", "gte": 40})
    reader = SignalReader(state, T + 59)
    assert reader[("ioctl_command_rate", "UVM_REGISTER_CHANNEL")] == pytest.approx(50.0, rel=0.03)
    assert busy(reader) == [f"ioctl_command_rate[UVM_REGISTER_CHANNEL]={3000 / 59:.4g} (>= 40)"]
    other = compile_(
        {"signal": "ioctl_command_rate", "command": "UVM_MAP_EXTERNAL_ALLOCATION", "gte": 40}
    )
    assert other(SignalReader(state, T + 59)) is None


def test_hour_of_day_is_utc():
    assert SignalReader(make(), 1_700_000_000.0).get("hour_of_day") == 22  # 2023-11-14 22:13 UTC


def test_wallet_patterns_from_shipped_rules():
    import re

    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.ruleset.shipped import shipped_rules_file

    patterns = [
        re.compile(p) for p in load_ruleset([shipped_rules_file()]).lists["wallet_patterns"]
    ]
    hit = lambda text: any(p.search(text) for p in patterns)  # noqa: E731
    assert hit(f"xmrig -u {WALLET} -p x")
    assert hit("xmrig -u 8" + "B" * 105 + " -p x")  # integrated address (106)
    assert not hit("sha256 " + "4" + "a" * 93)  # 94 characters
    assert not hit("token 4" + "0" * 94)  # 0 is not base58
    assert hit("t-rex -u 0x" + "ab" * 20 + " -o x")
    assert not hit("git checkout 0x" + "ab" * 20)


# -- operators, table-driven ----------------------------------------------------

LISTS = {
    "ports": ["3333", 4444, "10001-18192"],
    "domains": ["supportxmr.com", "nanopool.org"],
    "globs": ["kworker*", "/tmp/*"],
    "regexes": ["^xmr", "miner$"],
    "nets": ["10.0.0.0/8", "2001:db8::/32"],
    "names": ["XMRig", "t-rex"],
}


def compile_(condition):
    lists = {
        name: ListDef(name, Position("t", 1, 1), [(v, Position("t", 1, 1)) for v in values])
        for name, values in LISTS.items()
    }
    ctx = CompileContext(lists)
    pos = lambda path: Position("t", 1, 1)  # noqa: E731
    cond = compile_condition(condition, (), pos, pos, ctx)
    assert not ctx.problems, ctx.problems
    return cond


OPERATOR_CASES = [
    (
        {"signal": "connect_ports", "in_list": "ports"},
        lambda s: s.add_connection("1.1.1.1", 12000),
        ["connect_ports=12000 (in list ports)"],
    ),
    (
        {"signal": "connect_ports", "in_list": "ports"},
        lambda s: s.add_connection("1.1.1.1", 3333),
        ["connect_ports=3333 (in list ports)"],
    ),
    (
        {"signal": "connect_ports", "in_list": "ports"},
        lambda s: s.add_connection("1.1.1.1", 18193),
        None,
    ),
    (
        {"signal": "cmdline_hosts", "domain_in_list": "domains"},
        {"cmdline": ["m", "-o", "pool.supportxmr.com:3333"]},
        ["cmdline_hosts=pool.supportxmr.com (domain in list domains)"],
    ),
    (
        {"signal": "cmdline_hosts", "domain_in_list": "domains"},
        {"cmdline": ["m", "-o", "supportxmr.com.evil.net:3333"]},
        None,
    ),
    (
        {"signal": "cmdline_hosts", "domain_in_list": "domains"},
        {"cmdline": ["m", "-o", "notsupportxmr.com:3333"]},
        None,
    ),
    (
        {"signal": "comm", "glob_list": "globs"},
        {"comm": "kworker/0:1"},
        ["comm=kworker/0:1 (glob list globs)"],
    ),
    (
        {"signal": "exe", "glob_list": "globs"},
        {"exe": "/tmp/a/b"},
        ["exe=/tmp/a/b (glob list globs)"],
    ),
    ({"signal": "exe", "glob_list": "globs"}, {"exe": "/usr/tmp/a"}, None),
    (
        {"signal": "exe", "glob": "/opt/*"},
        {"exe": "/opt/x"},
        ["exe=/opt/x (glob /opt/x)".replace("/opt/x)", "/opt/*)")],
    ),
    (
        {"signal": "process_names", "matches_list": "regexes"},
        {"comm": "xmr-stak"},
        ["process_names=xmr-stak (matches list regexes)"],
    ),
    (
        {"signal": "connect_addresses", "cidr_in_list": "nets"},
        lambda s: s.add_connection("10.2.3.4", 1),
        ["connect_addresses=10.2.3.4 (cidr in list nets)"],
    ),
    (
        {"signal": "connect_addresses", "cidr_in_list": "nets"},
        lambda s: s.add_connection("::ffff:10.2.3.4", 1),
        ["connect_addresses=::ffff:10.2.3.4 (cidr in list nets)"],
    ),
    (
        {"signal": "connect_addresses", "cidr_in_list": "nets"},
        lambda s: s.add_connection("11.0.0.1", 1),
        None,
    ),
    (
        {"signal": "process_names", "in_list": "names"},
        {"comm": "xmrig"},
        ["process_names=xmrig (in list names)"],
    ),
    ({"signal": "comm", "is": "XMRIG"}, {"comm": "xmrig"}, ["comm=xmrig (is XMRIG)"]),
    ({"signal": "comm", "in": ["a", "b"]}, {"comm": "b"}, ["comm=b (in [a, b])"]),
    (
        {"signal": "cmdline", "contains": "DONATE"},
        {"cmdline": ["x", "--donate-level=1"]},
        ["cmdline=x --donate-level=1 (contains DONATE)"],
    ),
    (
        {"signal": "cmdline", "matches": r"rx/\d"},
        {"cmdline": ["x", "-a", "rx/0"]},
        ["cmdline=x -a rx/0 (matches rx/\\d)"],
    ),
    ({"signal": "gpu_util_mean", "gte": 85}, gpu_series([90, 80]), ["gpu_util_mean=85 (>= 85)"]),
    ({"signal": "gpu_util_mean", "gt": 85}, gpu_series([90, 80]), None),
    ({"signal": "gpu_util_mean", "lt": 85}, None, None),  # unavailable never matches
    (
        {"signal": "connect_ports", "contains": 22},
        lambda s: s.add_connection("1.1.1.1", 22),
        ["connect_ports contains 22"],
    ),
    (
        {"signal": "yara_rules", "empty": False},
        lambda s: s.yara_matches.add("r"),
        ["yara_rules not empty"],
    ),
    ({"signal": "yara_rules", "empty": True}, None, ["yara_rules empty"]),
    ({"signal": "exe_deleted", "is": True}, {"exe_deleted": True}, ["exe_deleted=true (is true)"]),
    ({"signal": "exe_deleted", "is": False}, {"exe_deleted": True}, None),
    (
        {"all": [{"signal": "comm", "is": "a"}, {"signal": "uid", "is": 0}]},
        {"comm": "a", "uid": 0},
        ["comm=a (is a)", "uid=0 (is 0)"],
    ),
    (
        {"all": [{"signal": "comm", "is": "a"}, {"signal": "uid", "is": 0}]},
        {"comm": "a", "uid": 1},
        None,
    ),
    (
        {"any": [{"signal": "comm", "is": "z"}, {"signal": "uid", "is": 0}]},
        {"comm": "a", "uid": 0},
        ["uid=0 (is 0)"],
    ),
    ({"not": {"signal": "comm", "is": "z"}}, {"comm": "a"}, []),
    ({"not": {"signal": "comm", "is": "a"}}, {"comm": "a"}, None),
    (
        {"signal": "connect_ports", "gte": 1},
        lambda s: [s.add_connection("1.1.1.1", p) for p in (5, 4, 3, 2, 1)],
        ["connect_ports=1,2,3,... (>= 1)"],
    ),
]


@pytest.mark.parametrize(
    "condition,setup,expected", OPERATOR_CASES, ids=[str(i) for i in range(len(OPERATOR_CASES))]
)
def test_operator(condition, setup, expected):
    if isinstance(setup, dict):
        state = make(**{"comm": "app", "exe": "/usr/bin/app", **setup})
    else:
        state = make()
        if setup:
            setup(state)
    assert compile_(condition)(SignalReader(state, T)) == expected
