"""The agent config file: defaults, file:line errors, untrusted files, overrides (no root needed)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.agent.config import AgentConfig, load_config, with_overrides
from gpuguard.errors import GpuguardError
from gpuguard.respond import ResponseSettings
from tests.support.agent_config import write

REPO = Path(__file__).resolve().parent.parent


def test_no_file_gives_every_default(tmp_path):
    config = load_config(None) if not Path("/etc/gpuguard/agent.yaml").exists() else AgentConfig()
    assert config.mode == "monitor" and config.sensor == "auto" and config.log_path == "-"
    assert (
        config.log_format == "ecs"
        and config.sample_interval_s == 1.0
        and config.response == ResponseSettings()
    )
    assert config.guard_policies == ()
    assert (config.log_max_bytes, config.log_keep) == (50 * 1024 * 1024, 5)
    assert (config.log_syslog_format, config.log_facility) == ("rfc5424", "daemon")


def test_full_file_is_read(tmp_path):
    path = write(
        tmp_path,
        """
mode: enforce
dry_run: true
sensor: proc
rules: [site.yaml, /etc/gpuguard/extra.yaml]
log: {path: /var/log/gpuguard/agent.log, format: ocsf, max_bytes: 1048576, keep: 3, syslog_format: rfc3164,
      facility: local4}
metrics: {address: "127.0.0.1:9108"}
sampling: {interval_s: 2, sources: [nvml]}
sweep: {interval_s: 5}
status: {path: /tmp/x.json, interval_s: 1}
queues: {intake: 1000, output: 100}
correlator: {max_processes: 500}
response:
  actions: {malicious: [kill, block-egress]}
  cgroups: [/gg-site]
guard_policies:
  - {id: night, allowed_hours: "08-20", action: alert}
""",
    )
    config = load_config(path)
    assert config.mode == "enforce" and config.dry_run and config.sensor == "proc"
    assert config.rules == [tmp_path / "site.yaml", Path("/etc/gpuguard/extra.yaml")]
    assert (config.log_path, config.log_format, config.metrics_address) == (
        "/var/log/gpuguard/agent.log",
        "ocsf",
        "127.0.0.1:9108",
    )
    assert (
        config.log_max_bytes,
        config.log_keep,
        config.log_syslog_format,
        config.log_facility,
    ) == (1048576, 3, "rfc3164", "local4")
    assert (
        config.sample_interval_s == 2
        and config.gpu_sources == ["nvml"]
        and config.sweep_interval_s == 5
    )
    assert (
        config.status_path == Path("/tmp/x.json")
        and config.intake_queue == 1000
        and config.max_processes == 500
    )
    # checked by the responder's and the guard policies' own parsers when the file is read
    assert config.response.actions["malicious"] == (
        "kill",
        "block-egress",
    ) and config.response.cgroups == ("/gg-site",)
    assert [p.id for p in config.guard_policies] == ["night"] and config.guard_policies[
        0
    ].allowed_hours == (8, 20)


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("mode: monitor\nlogg: {path: x}\n", ":2:1", "unknown key 'logg'"),
        ("log:\n  path: x\n  colour: red\n", ":3:3", "unknown key 'colour'"),
        ("mode: sometimes\n", ":1:7", "'sometimes' is not one of monitor, enforce"),
        ("sampling:\n  interval_s: fast\n", ":2:15", "sampling.interval_s must be a number"),
        ("sweep: {interval_s: 0}\n", ":1:21", "outside"),
        ("dry_run: 1\n", ":1:10", "true or false"),
        ("mode: monitor\nmode: enforce\n", ":2:1", "duplicate key"),
        ("log: [a\n", ":", "YAML syntax error"),
        ("- mode\n", ":1:1", "must be a mapping"),
        ("log:\n  keep: -1\n", ":2:9", "log.keep -1 is outside 0-1000"),
        ("log:\n  max_bytes: 10\n", ":2:14", "log.max_bytes 10 is outside"),
        ("log:\n  syslog_format: rfc9999\n", ":2:18", "'rfc9999' is not one of rfc5424, rfc3164"),
        (
            "log:\n  facility: mail2\n",
            ":2:13",
            "log.facility 'mail2' is not one of kern, user, daemon",
        ),
        ("log:\n  format: leef\n", ":2:11", "'leef' is not one of ecs, ocsf, cef"),
        (
            "metrics:\n  address: localhost\n",
            ":2:12",
            "bad metrics address 'localhost' (expected HOST:PORT",
        ),
        ("response:\n  kil: {grace_s: 1}\n", ":2:3: response.kil", "unknown key 'kil'"),
        (
            "response:\n  actions: {malicious: [explode]}\n",
            ":2:25: response.actions.malicious[0]",
            "unknown action 'explode'",
        ),
        ("response: [kill]\n", ":1:11", "response must be a mapping"),
        (
            "guard_policies:\n  - {id: x, allowed_hours: 8}\n",
            ":2:28: guard_policies[0].allowed_hours",
            "allowed_hours",
        ),
        (
            "guard_policies:\n  - {id: x, colour: red}\n",
            ":2:13: guard_policies[0].colour",
            "unknown key 'colour'",
        ),
    ],
)
def test_errors_name_file_line_and_column(tmp_path, text, where, words):
    path = write(tmp_path, text)
    with pytest.raises(GpuguardError) as info:
        load_config(path)
    line = info.value.one_line()
    assert f"{path}{where}" in line and words in line, line


def test_file_writable_by_others_is_refused(tmp_path):
    path = write(tmp_path, "mode: monitor\n", mode=0o666)
    with pytest.raises(GpuguardError, match="refusing agent config .* writable by group/others"):
        load_config(path)


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(GpuguardError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_command_line_overrides_the_file(tmp_path):
    config = load_config(write(tmp_path, "mode: enforce\nsensor: proc\n"))
    changed = with_overrides(config, mode="monitor", sensor=None, log_path="/tmp/l")
    assert (changed.mode, changed.sensor, changed.log_path) == ("monitor", "proc", "/tmp/l")


def test_cli_reports_a_bad_config_in_one_line_and_exits_2(tmp_path):
    path = write(tmp_path, "mode: monitor\nsensorr: proc\n")
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "agent", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and f"{path}:2:1: unknown key 'sensorr'" in run.stderr
    assert "Traceback" not in run.stderr


def test_cli_reports_a_bad_response_section_in_one_line_and_exits_2(tmp_path):
    path = write(tmp_path, "mode: enforce\nresponse:\n  kill: {grace_s: soon}\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuguard",
            "agent",
            "--config",
            str(path),
            "--sensor",
            "proc",
            "--state-file",
            str(tmp_path / "s.json"),
            "--log",
            str(tmp_path / "a.log"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "response.kill.grace_s: expected a number" in run.stderr
    assert str(path) in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "a.log").exists()  # refused before anything started


def test_cli_refuses_a_bad_log_destination_or_metrics_address_in_one_line(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    base = [
        sys.executable,
        "-m",
        "gpuguard",
        "agent",
        "--sensor",
        "proc",
        "--state-file",
        str(tmp_path / "s.json"),
    ]
    cases = [
        (["--log", "syslog:udp:127.0.0.1"], "bad syslog target 'udp:127.0.0.1'"),
        (
            ["--log", str(tmp_path / "a.log"), "--metrics-address", "nonsense"],
            "bad metrics address 'nonsense'",
        ),
        (
            ["--log", str(tmp_path / "a.log"), "--metrics-address", f"127.0.0.1:{port}"],
            f"cannot serve metrics on 127.0.0.1:{port}: Address already in use",
        ),
    ]
    try:
        for args, words in cases:
            run = subprocess.run(base + args, capture_output=True, text=True, cwd=REPO, timeout=60)
            assert run.returncode == 2 and run.stderr.count("\n") == 1 and words in run.stderr, (
                args,
                run.stderr,
            )
    finally:
        taken.close()


def test_a_reload_says_which_changed_log_and_metrics_keys_need_a_restart(tmp_path):
    """Every log.* and metrics.* key is read once at start; a SIGHUP that changes some keeps
    them and names each in the reload record (docs/agent.md, "Signals")."""
    import signal

    from tests.support.agent_run import AgentProcess, lifecycle

    before = "metrics:\n  health_stall_s: 30\n  max_pod_series: 100\n"
    path = write(tmp_path, before)
    agent = AgentProcess(tmp_path, "--sensor", "proc", "--config", str(path))
    try:
        agent.wait_ready()
        path.write_text(
            "metrics:\n  health_stall_s: 45\n  max_pod_series: 50\n  per_process_gpu: true\n"
            "sampling:\n  interval_s: 2\n"
        )
        agent.signal(signal.SIGHUP)
        said = agent.wait_record(lambda r: lifecycle("reload")(r) and "restart" in r["message"])
    finally:
        agent.stop()
    named = said["message"].split("need a restart to apply: ", 1)[1].split(", ")
    assert sorted(named) == ["health_stall_s", "max_pod_series", "per_process_gpu"], said
