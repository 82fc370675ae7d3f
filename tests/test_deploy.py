"""Deployment files: the systemd unit (systemd-analyze verify), install.sh against a DESTDIR,
logrotate, the DaemonSet (Kubernetes schema + security fields), Sigma rules (pySigma) and
the log-shipping examples."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuguard.detect.shipped import default_rule_paths
from gpuguard.events.agent_events import AgentLifecycle
from gpuguard.outputs.records import render_record

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "packaging"
UNIT = PKG / "gpuguard.service"
CAPS = {
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_SYS_ADMIN",
    "CAP_SYS_RESOURCE",
    "CAP_KILL",
    "CAP_NET_ADMIN",
    "CAP_DAC_READ_SEARCH",
    "CAP_SYS_PTRACE",
}


def unit_settings() -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


# -- systemd unit ---------------------------------------------------------------------------


def test_unit_hardening():
    s = unit_settings()
    assert set(s["CapabilityBoundingSet"].split()) == CAPS
    for cap in CAPS:  # every capability is explained in the unit
        assert re.search(rf"^#\s+{cap}\s+\S", UNIT.read_text(), re.M), f"say why {cap} is needed"
    assert (
        s["ProtectSystem"] == "strict"
        and s["NoNewPrivileges"] == "yes"
        and s["PrivateTmp"] == "yes"
    )
    assert s["ProtectHome"] in ("yes", "read-only", "tmpfs")
    assert set(s["ReadWritePaths"].split()) == {"/sys/fs/bpf", "/sys/fs/cgroup"}
    assert (s["RuntimeDirectory"], s["LogsDirectory"], s["StateDirectory"]) == ("gpuguard",) * 3
    assert s["ExecStart"].split()[:2] == ["/opt/gpuguard/bin/gpuguard", "agent"]
    assert "-HUP" in s["ExecReload"] and s["KillSignal"] == "SIGTERM"


@pytest.mark.root
def test_systemd_analyze_verify_and_security(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, (
        "systemd-analyze is missing (fix: bash packaging/setup-host.sh setup installs systemd)"
    )
    entry = REPO / ".venv" / "bin" / "gpuguard"
    assert entry.exists()
    # /opt/gpuguard/bin/gpuguard must exist for verify: give it one in a private mount namespace only.
    script = (
        f"mount -t tmpfs gg-opt-{os.getpid()} /opt && mkdir -p /opt/gpuguard/bin && "
        f"ln -s {entry} /opt/gpuguard/bin/gpuguard && "
        f"{analyze} verify {UNIT} && {analyze} security --offline=yes --no-pager {UNIT}"
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpuguard.service" not in result.stderr, result.stderr  # verify printed no warning
    exposure = re.search(r"Overall exposure level for gpuguard.service: ([\d.]+)", result.stdout)
    assert exposure and float(exposure.group(1)) < 7.0, result.stdout[-400:]


# -- install.sh -------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = ("link", os.readlink(path))
        elif path.is_file():
            out[key] = ("file", oct(st.st_mode & 0o7777), st.st_mtime_ns, path.read_bytes())
        else:
            out[key] = ("dir", oct(st.st_mode & 0o7777))
    return out


def _install(dest: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(PKG / "install.sh"), "--destdir", str(dest), "--no-venv", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DESTDIR": ""},
    )


def test_install_lays_out_the_tree_idempotently_and_uninstalls(tmp_path):
    dest = tmp_path / "root"
    first = _install(dest)
    assert first.returncode == 0, first.stderr
    etc = dest / "etc"
    assert (etc / "gpuguard/agent.yaml").read_bytes() == (PKG / "agent.yaml").read_bytes()
    assert oct((etc / "gpuguard/agent.yaml").stat().st_mode & 0o777) == "0o600"
    assert (etc / "systemd/system/gpuguard.service").read_bytes() == UNIT.read_bytes()
    assert (etc / "logrotate.d/gpuguard").exists()
    assert oct((dest / "var/log/gpuguard").stat().st_mode & 0o777) == "0o750"
    assert os.readlink(dest / "usr/local/sbin/gpuguard") == "/opt/gpuguard/bin/gpuguard"
    share = dest / "opt/gpuguard/share"
    assert {p.name for p in (share / "sigma").iterdir()} == {
        p.name for p in (PKG / "sigma").glob("*.yml")
    }
    assert (share / "grafana-dashboard.json").exists() and (share / "doc/deploy.md").exists()
    # the shipped config is not mistaken for a site rules file
    assert etc / "gpuguard/agent.yaml" not in default_rule_paths(etc / "gpuguard")

    before = _tree(dest)
    again = _install(dest)
    assert again.returncode == 0 and "installed" not in again.stderr, again.stderr
    assert _tree(dest) == before  # nothing rewritten

    # an operator's edit survives an upgrade; the new default lands beside it
    edited = "mode: enforce\n"
    (etc / "gpuguard/agent.yaml").write_text(edited)
    assert _install(dest).returncode == 0
    assert (etc / "gpuguard/agent.yaml").read_text() == edited
    assert (etc / "gpuguard/agent.yaml.dist").read_bytes() == (PKG / "agent.yaml").read_bytes()

    gone = _install(dest, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert (
        not (etc / "systemd/system/gpuguard.service").exists()
        and not (etc / "logrotate.d/gpuguard").exists()
    )
    assert not (dest / "opt/gpuguard").exists() and not os.path.lexists(
        dest / "usr/local/sbin/gpuguard"
    )
    assert (etc / "gpuguard/agent.yaml").read_text() == edited and (
        dest / "var/log/gpuguard"
    ).is_dir()
    assert _install(dest, "--uninstall", "--purge").returncode == 0
    assert not (etc / "gpuguard").exists() and not (dest / "var/log/gpuguard").exists()


def test_install_refuses_unknown_options(tmp_path):
    result = _install(tmp_path, "--bogus")
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr


def test_shipped_config_is_accepted_by_the_agent():
    from gpuguard.agent import config
    from gpuguard.detect.yaml_marks import load_marked_file

    loaded = config.parse_config(load_marked_file(PKG / "agent.yaml", config.MAX_CONFIG_BYTES))
    assert loaded.mode == "monitor" and loaded.log_path == "/var/log/gpuguard/events.json"
    # the agent's own rotation is a safety net above logrotate's maxsize
    maxsize = re.search(r"maxsize (\d+)M", (PKG / "gpuguard.logrotate").read_text())
    assert loaded.log_max_bytes > int(maxsize.group(1)) * 1024 * 1024 and loaded.log_keep >= 1
    assert (loaded.log_syslog_format, loaded.log_facility) == ("rfc5424", "daemon")


def test_shipped_config_parses_and_names_the_rotated_log():
    data = yaml.safe_load((PKG / "agent.yaml").read_text())
    assert data["mode"] == "monitor" and data["log"]["format"] == "ecs"
    assert data["log"]["path"] in (PKG / "gpuguard.logrotate").read_text()


def test_logrotate_accepts_the_file_and_the_agent_reopens_after_rotation(tmp_path):
    logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
    assert os.path.exists(logrotate), (
        "logrotate is missing (fix: bash packaging/setup-host.sh setup)"
    )
    from gpuguard.outputs.log_writer import open_log

    log = tmp_path / "events.json"
    conf = tmp_path / "gpuguard.logrotate"
    text = (
        (PKG / "gpuguard.logrotate").read_text().replace("/var/log/gpuguard/events.json", str(log))
    )
    conf.write_text(text.replace("create 0640 root adm", "create 0640 root root"))
    writer = open_log(str(log), "ecs", queue_size=0)
    writer.write(AgentLifecycle(time=1.0, action="start"))
    result = subprocess.run(
        [logrotate, "--force", "--state", str(tmp_path / "state"), str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    rotated = [p for p in tmp_path.iterdir() if p.name.startswith("events.json-")]
    assert len(rotated) == 1 and '"action":"start"' in rotated[0].read_text()
    writer.write(AgentLifecycle(time=2.0, action="stop"))  # reopens the new file
    writer.close()
    assert '"action":"stop"' in log.read_text() and '"action":"start"' not in log.read_text()


# -- Kubernetes ---------------------------------------------------------------------------------


def _manifests() -> dict[str, dict]:
    return {
        doc["kind"]: doc
        for doc in yaml.safe_load_all((PKG / "kubernetes/daemonset.yaml").read_text())
    }


def test_daemonset_validates_against_the_kubernetes_schema():
    import kubernetes_validate

    for _kind, doc in _manifests().items():
        kubernetes_validate.validate(doc, "1.32", strict=True)
    broken = _manifests()["DaemonSet"]
    broken["spec"]["template"]["spec"]["hostPId"] = True  # a typo is caught, not ignored
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.32", strict=True)


def test_daemonset_security_fields():
    m = _manifests()
    pod = m["DaemonSet"]["spec"]["template"]["spec"]
    assert (
        pod["hostPID"] is True
        and pod["hostNetwork"] is True
        and pod["automountServiceAccountToken"] is False
    )
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert (
        sc["privileged"] is False
        and sc["allowPrivilegeEscalation"] is False
        and sc["readOnlyRootFilesystem"]
    )
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert (
        {f"CAP_{c}" for c in sc["capabilities"]["add"]}
        == CAPS
        == set(unit_settings()["CapabilityBoundingSet"].split())
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {v["mountPath"]: v for v in container["volumeMounts"]}
    assert volumes[mounts["/var/log/gpuguard"]["name"]]["hostPath"]["path"] == "/var/log/gpuguard"
    for path in (
        "/sys/fs/bpf",
        "/sys/kernel/tracing",
        "/lib/modules",
        "/usr/src",
        "/sys/fs/cgroup",
    ):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    for path in ("/sys/kernel/tracing", "/lib/modules", "/usr/src", "/etc/gpuguard"):
        assert mounts[path].get("readOnly") is True
    assert volumes[mounts["/etc/gpuguard"]["name"]]["configMap"]["defaultMode"] == 0o400
    assert (
        m["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    )
    config = yaml.safe_load(m["ConfigMap"]["data"]["agent.yaml"])
    assert config["log"]["path"] == "/var/log/gpuguard/events.json"


def test_containerfile_installs_offline_and_runs_the_agent():
    text = (PKG / "Containerfile").read_text()
    assert "--no-index --find-links /tmp/wheels" in text and "python3-bpfcc" in text
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))
    assert entry == ["/opt/gpuguard/bin/gpuguard"]
    assert json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))[0] == "agent"


# -- Sigma and log shipping ----------------------------------------------------------------------


def _sigma_rules() -> dict[str, dict]:
    return {p.stem: yaml.safe_load(p.read_text()) for p in (PKG / "sigma").glob("*.yml")}


def test_sigma_rules_convert_with_pysigma():
    from sigma.backends.elasticsearch import ESQLBackend, LuceneBackend
    from sigma.collection import SigmaCollection

    collection = SigmaCollection.load_ruleset([PKG / "sigma"])
    assert not collection.errors and len(collection.rules) == len(_sigma_rules())
    lucene = LuceneBackend()
    queries = {}
    for rule in collection.rules:
        if type(rule).__name__ == "SigmaRule":
            (queries[rule.name],) = lucene.convert_rule(rule)
    assert "gpuguard.verdict:malicious" in queries["gpuguard_malicious_on_gpu_node"]
    assert "_exists_:destination.ip" in queries["gpuguard_pool_connection"]
    esql = "\n".join(ESQLBackend().convert(collection))
    assert (
        "count_distinct(host.name)" in esql
        and "by timebucket, destination.ip" in esql
        and ">= 3" in esql
    )


def _value(doc: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _matches(rule: dict, doc: dict) -> bool:
    """The subset of Sigma these rules use: maps of field[|exists] -> value or list; 'a and b'."""
    detection = rule["detection"]

    def selection(name: str) -> bool:
        for key, want in detection[name].items():
            field, _, modifier = key.partition("|")
            have = _value(doc, field)
            if modifier == "exists":
                if (have is not None) != want:
                    return False
                continue
            wants = want if isinstance(want, list) else [want]
            haves = have if isinstance(have, list) else [have]
            if not any(str(h) == str(w) for h in haves for w in wants):
                return False
        return True

    return all(selection(name.strip()) for name in detection["condition"].split(" and "))


def test_sigma_rules_match_real_agent_records_and_not_benign_ones():
    from gpuguard.detect.cases import replay
    from gpuguard.detect.rules import load_ruleset
    from gpuguard.detect.shipped import shipped_rules_file
    from gpuguard.outputs.finding import finding_from_verdict

    ruleset = load_ruleset([shipped_rules_file()])
    docs = {"malicious": [], "clean": []}
    for case in ("miner_stratum_cmdline", "benign_pytorch_training", "benign_inference_server"):
        verdicts, correlator = replay(
            Path(__file__).resolve().parent / "cases" / case / "capture.ggrec", ruleset
        )
        for v in verdicts:
            state = correlator.get(v.key)
            finding = finding_from_verdict(v, state.facts, ruleset, state)
            docs.setdefault(v.verdict, []).append(
                json.loads(render_record(finding, "ecs", {"hostname": "gpu-1", "name": "gpu-1"}))
            )
    rules = _sigma_rules()
    assert docs["malicious"] and docs["clean"]
    for rule in ("gpuguard_malicious_on_gpu_node", "gpuguard_pool_connection"):
        assert all(_matches(rules[rule], d) for d in docs["malicious"]), rule
        assert not any(_matches(rules[rule], d) for d in docs["clean"]), rule
    blind = rules["gpuguard_agent_blind"]
    fault = json.loads(
        render_record(
            AgentLifecycle(time=1.0, action="fault", message="disk full"),
            "ecs",
            {"hostname": "gpu-1"},
        )
    )
    start = json.loads(
        render_record(AgentLifecycle(time=1.0, action="start"), "ecs", {"hostname": "gpu-1"})
    )
    assert _matches(blind, fault) and not _matches(blind, start)
    # the correlation's fields exist in the records it counts
    corr = rules["gpuguard_pool_on_many_hosts"]["correlation"]
    miner = docs["malicious"][0]
    assert (
        _value(miner, corr["group-by"][0]) == "141.94.96.144"
        and _value(miner, corr["condition"]["field"]) == "gpu-1"
    )


def test_log_shipping_examples_read_the_agents_log():
    log_path = yaml.safe_load((PKG / "agent.yaml").read_text())["log"]["path"]
    vector = yaml.safe_load((PKG / "shipping/vector.yaml").read_text())
    assert vector["sources"]["gpuguard"]["include"] == [log_path]
    assert {s["type"] for s in vector["sinks"].values()} == {"elasticsearch", "splunk_hec_logs"}
    assert all(s["inputs"] == ["gpuguard_ecs"] for s in vector["sinks"].values())
    fluent = yaml.safe_load((PKG / "shipping/fluent-bit.yaml").read_text())["pipeline"]
    assert fluent["inputs"][0]["path"] == log_path and fluent["inputs"][0]["parser"] == "json"
    assert {o["name"] for o in fluent["outputs"]} == {"opensearch", "splunk"}
