"""The response: config section: defaults, validation, the plan a verdict gets."""

from __future__ import annotations

import pytest

from gpuguard.correlate.state import ProcessKey
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.errors import GpuguardError
from gpuguard.respond import Responder, ResponseSettings, parse_response_settings


def _verdict(
    verdict: str, action: str = "alert", rules: tuple[str, ...] = ("r1",), allowlisted: bool = False
) -> Verdict:
    return Verdict(
        ProcessKey(4242, 1.0),
        4242,
        "x",
        "/x",
        90,
        verdict,
        [Evidence(r, "s", "d", 10, "high") for r in rules],
        allowlisted=allowlisted,
        action=action,
    )


def test_defaults_without_a_section():
    settings = parse_response_settings(None, source="agent.yaml")
    assert settings == ResponseSettings()
    responder = Responder(settings, mode="enforce", dry_run=True)
    assert responder.plan(_verdict("malicious")) == [
        "alert",
        "kill-on-touch",
        "block-egress",
        "kill",
    ]
    assert responder.plan(_verdict("suspicious")) == ["alert"]
    assert responder.plan(_verdict("clean", action="none")) == []


def test_per_verdict_per_rule_and_rules_file_actions():
    settings = parse_response_settings(
        {
            "actions": {"malicious": ["suspend"], "suspicious": "none"},
            "rule_actions": {"gpu.foreign_user": ["quarantine"]},
            "kill": {"grace_s": 1, "target": "group"},
            "hooks": [
                {"argv": ["/usr/bin/logger", "-t", "gpuguard"], "on": ["suspicious", "malicious"]}
            ],
        },
        source="agent.yaml",
    )
    responder = Responder(settings, mode="enforce", dry_run=True)
    assert responder.plan(_verdict("malicious", action="none")) == ["suspend"]
    assert responder.plan(_verdict("suspicious", action="none")) == []
    # The rules file's actions: entry (alert by default) adds its action.
    assert responder.plan(_verdict("suspicious")) == ["alert"]
    assert responder.plan(_verdict("suspicious", action="none", rules=("gpu.foreign_user",))) == [
        "quarantine"
    ]
    assert responder.plan(_verdict("suspicious", action="kill")) == ["kill"]
    # An allowlisted process is at most alerted on.
    assert responder.plan(_verdict("malicious", allowlisted=True)) == ["alert"]
    assert settings.kill_grace_s == 1.0 and settings.kill_target == "group"
    assert settings.hooks[0].name == "logger" and settings.hooks[0].on == (
        "suspicious",
        "malicious",
    )


@pytest.mark.parametrize(
    "section, words",
    [
        ({"kil": {}}, "unknown key 'kil'"),
        ({"actions": {"evil": ["kill"]}}, "unknown key 'evil'"),
        ({"actions": {"malicious": ["explode"]}}, "unknown action 'explode'"),
        ({"kill": {"grace_s": -1}}, "kill.grace_s"),
        ({"kill": {"target": "host"}}, "kill.target"),
        ({"scope": "everything"}, "scope"),
        ({"hooks": [{"argv": "logger"}]}, "argv"),
        ({"hooks": [{"argv": ["logger"]}]}, "absolute path"),
        ({"block_egress": {"nftables": "yes"}}, "nftables"),
    ],
)
def test_bad_sections_name_the_key_and_the_file(section, words):
    with pytest.raises(GpuguardError) as caught:
        parse_response_settings(section, source="/etc/gpuguard/agent.yaml")
    assert words in caught.value.cause
    assert "/etc/gpuguard/agent.yaml" in caught.value.one_line()


def test_pool_endpoints_are_the_connections_the_evidence_names():
    from gpuguard.correlate.state import ProcessState
    from gpuguard.respond.pool_addresses import pool_endpoints

    state = ProcessState(key=ProcessKey(4242, 1.0))
    for endpoint in (("10.0.0.5", 443), ("203.0.113.9", 3333), ("198.51.100.1", 33)):
        state.add_connection(*endpoint)
    named = Verdict(
        ProcessKey(4242, 1.0),
        4242,
        "x",
        "/x",
        90,
        "malicious",
        [
            Evidence(
                "miner.pool_port",
                "connect_ports",
                "connect_ports=3333 (in_list pool_ports)",
                40,
                "high",
            )
        ],
    )
    assert pool_endpoints(named, state) == ["203.0.113.9"]  # port 33 is not named by "3333"
    unnamed = Verdict(
        ProcessKey(4242, 1.0),
        4242,
        "x",
        "/x",
        90,
        "malicious",
        [Evidence("miner.name", "comm", "comm=xmrig (in_list miner_names)", 60, "high")],
    )
    assert sorted(pool_endpoints(unnamed, state)) == ["10.0.0.5", "198.51.100.1", "203.0.113.9"]


def test_host_wide_block_never_takes_loopback_local_or_configured_networks():
    from gpuguard.respond.pool_addresses import split_host_wide

    settings = parse_response_settings(
        {"block_egress": {"never_block": ["10.0.0.0/8", "fd00::/8"]}}, source="a"
    )
    assert settings.never_block_host_wide == ("10.0.0.0/8", "fd00::/8")
    host, local = split_host_wide(
        [
            "203.0.113.9",
            "127.0.0.1",
            "10.1.2.3",
            "169.254.1.1",
            "::1",
            "fd00::5",
            "2001:db8::7",
            "0.0.0.0",
        ],
        settings.never_block_host_wide,
    )
    assert host == ["203.0.113.9", "2001:db8::7"]
    assert local == ["127.0.0.1", "10.1.2.3", "169.254.1.1", "::1", "fd00::5", "0.0.0.0"]
    with pytest.raises(GpuguardError):
        parse_response_settings({"block_egress": {"never_block": ["10.0.0.0/33"]}}, source="a")


def test_pool_addresses_named_on_the_command_line_are_blocked_before_any_connect():
    from gpuguard.correlate.state import ProcessState
    from gpuguard.respond.pool_addresses import parse_addresses, pool_endpoints

    state = ProcessState(key=ProcessKey(4242, 1.0))
    verdict = Verdict(
        ProcessKey(4242, 1.0),
        4242,
        "x",
        "/x",
        90,
        "malicious",
        [
            Evidence(
                "miner-cmdline-stratum",
                "cmdline",
                "stratum+tcp://198.51.100.4:3333 (pool URL)",
                40,
                "high",
            ),
            Evidence(
                "miner-cmdline-x",
                "cmdline",
                "-o stratum+ssl://[2001:db8::4]:443 -u 4AAAA.999.1.1",
                40,
                "high",
            ),
        ],
    )
    assert parse_addresses(pool_endpoints(verdict, state)) == (["198.51.100.4", "2001:db8::4"], [])
