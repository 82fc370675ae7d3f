"""Deployment files: the systemd unit (systemd-analyze verify), install.sh against a DESTDIR,
logrotate, the DaemonSet (Kubernetes schema + security fields), Sigma rules (pySigma) and
the log-shipping examples."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpuguard.agent.capabilities import ENFORCE_CAPABILITIES, MONITOR_CAPABILITIES
from gpuguard.detect.ruleset.shipped import default_rule_paths
from gpuguard.events.agent_events import AgentLifecycle
from tests.support.prometheus import exposition
from tests.support.records import render_record
from tests.support.sigma_match import record_value, sigma_matches

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "packaging"
UNIT = PKG / "gpuguard.service"
ENFORCE_DROP_IN = PKG / "gpuguard-enforce.conf"
CAPS = set(MONITOR_CAPABILITIES)  # monitor mode's: the unit and the DaemonSet's base
ENFORCE_CAPS = set(ENFORCE_CAPABILITIES)


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
    # the enforce drop-in adds exactly enforce mode's two, each explained
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(ENFORCE_DROP_IN.read_text())
    added = set(parser["Service"]["CapabilityBoundingSet"].split())
    assert added == ENFORCE_CAPS - CAPS == {"CAP_KILL", "CAP_NET_ADMIN"}
    for cap in added:
        assert re.search(rf"^#\s+{cap}\s+\S", ENFORCE_DROP_IN.read_text(), re.M), cap
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
@pytest.mark.self_contained
def test_systemd_analyze_verify_and_security(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, (
        "systemd-analyze is missing (fix: bash packaging/setup-host.sh setup installs systemd)"
    )
    entry = REPO / ".venv" / "bin" / "gpuguard"
    assert entry.exists()
    # /opt/gpuguard/bin/gpuguard must exist for verify: give it one in a private mount namespace only.
    # /etc/systemd/system of the private namespace holds the unit, then its enforce drop-in:
    # systemd itself merges the two bounding sets
    units = "/etc/systemd/system"
    security = f"{analyze} security --offline=yes --no-pager {units}/gpuguard.service"
    script = (
        f"mount -t tmpfs gg-opt-{os.getpid()} /opt && mkdir -p /opt/gpuguard/bin && "
        f"ln -s {entry} /opt/gpuguard/bin/gpuguard && "
        f"{analyze} verify {UNIT} && {analyze} security --offline=yes --no-pager {UNIT} && "
        f"mount -t tmpfs gg-units-{os.getpid()} {units} && cp {UNIT} {units}/ && "
        f"echo ==monitor && {security} && mkdir {units}/gpuguard.service.d && "
        f"cp {ENFORCE_DROP_IN} {units}/gpuguard.service.d/enforce.conf && "
        f"echo ==enforce && {analyze} verify {units}/gpuguard.service && {security}"
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
    monitor, enforce = result.stdout.split("==monitor")[1].split("==enforce")
    for cap in ("CAP_KILL", "CAP_NET_ADMIN"):  # granted only with the drop-in
        assert re.search(rf"✓ CapabilityBoundingSet=~{cap}\b", monitor), monitor[-2000:]
        assert re.search(rf"✗ CapabilityBoundingSet=~{cap}\b", enforce), enforce[-2000:]
    assert re.search(r"✗ CapabilityBoundingSet=~CAP_SYS_ADMIN\b", monitor)
    # docs/deploy.md states both ratings: they are these
    rated = [
        re.search(r"Overall exposure level for gpuguard.service: ([\d.]+)", part).group(1)
        for part in (monitor, enforce)
    ]
    text = " ".join((REPO / "docs" / "deploy.md").read_text().split())
    said = re.search(r"rates it ([\d.]+) \(MEDIUM\) in monitor mode and ([\d.]+) with", text)
    assert said and list(said.groups()) == rated, (rated, "fix docs/deploy.md's ratings")


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
    for rel in (
        "kubernetes/base/daemonset.yaml",
        "kubernetes/overlays/metrics/servicemonitor.yaml",
        "prometheus/gpuguard-alerts.yaml",
        "grafana/provisioning/dashboards/gpuguard.yaml",
    ):
        assert (share / rel).read_bytes() == (PKG / rel).read_bytes(), rel
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


def test_install_enforce_adds_the_capability_drop_in_and_uninstall_removes_it(tmp_path):
    dest = tmp_path / "root"
    drop_in = dest / "etc/systemd/system/gpuguard.service.d/enforce.conf"
    assert _install(dest).returncode == 0 and not drop_in.exists()  # monitor: the unit alone
    assert (dest / "opt/gpuguard/share/gpuguard-enforce.conf").exists()  # for a manual install
    done = _install(dest, "--enforce")
    assert done.returncode == 0, done.stderr
    assert drop_in.read_bytes() == ENFORCE_DROP_IN.read_bytes()
    assert _install(dest, "--uninstall").returncode == 0
    assert not drop_in.parent.exists()


def test_install_refuses_unknown_options(tmp_path):
    result = _install(tmp_path, "--bogus")
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr


def test_shipped_config_is_accepted_by_the_agent():
    from gpuguard.agent import config
    from gpuguard.config.yaml_marks import load_marked_file

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


# -- Kubernetes (Kustomize base + overlays) ---------------------------------------------------

K8S = PKG / "kubernetes"
OVERLAYS = ("monitor", "enforce", "metrics", "metrics-podmonitor")
MIN_KUBERNETES = (1, 27)  # docs/deploy.md states it
# benchmarks/README-agent.md: RSS 146 MB idle, up to 183 MB under process churn, 253 MB at worst
# in event bursts (MiB here).
RSS_BUSY_MIB, RSS_WORST_MIB = 183 * 1000**2 / 2**20, 253 * 1000**2 / 2**20


def kubectl() -> str:
    found = os.environ.get("GPUGUARD_KUBECTL") or shutil.which("kubectl")
    assert found, (
        "kubectl is missing (fix: apt-get install kubernetes-client; "
        "bash packaging/setup-host.sh setup installs it)"
    )
    return found


def render(overlay: str) -> list[dict]:
    """``kubectl kustomize`` of one overlay (offline), as documents."""
    run = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


def _quantity_mib(value: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(value[:-2]) * units[value[-2:]]


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def test_every_overlay_validates_for_every_kubernetes_version_from_the_minimum():
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions

    versions = sorted(
        {v for v in all_versions() if _version_key(v)[:2] >= MIN_KUBERNETES}, key=_version_key
    )
    assert versions[0].startswith("1.27") and len(versions) >= 8, versions
    for overlay in OVERLAYS:
        for doc in render(overlay):
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # CRDs: checked field by field below
            for version in versions:
                kubernetes_validate.validate(doc, version, strict=True)
    broken = by_kind(render("monitor"))["DaemonSet"]
    broken["spec"]["template"]["spec"]["hostPId"] = True  # a typo is caught, not ignored
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, versions[0], strict=True)
    # the 1.30+ field is not used: AppArmor comes from the annotation every version honours
    pod = by_kind(render("monitor"))["DaemonSet"]["spec"]["template"]
    assert "appArmorProfile" not in json.dumps(pod["spec"])
    assert (
        pod["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/gpuguard"]
        == "unconfined"
    )
    assert "1.27" in (REPO / "docs/deploy.md").read_text()


def test_daemonset_security_fields():
    m = by_kind(render("monitor"))
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
    (enforcing,) = by_kind(render("enforce"))["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    enforce_sc = enforcing["securityContext"]
    assert {f"CAP_{c}" for c in enforce_sc["capabilities"]["add"]} == ENFORCE_CAPS
    assert enforce_sc["capabilities"]["drop"] == ["ALL"] and enforce_sc["privileged"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {v["mountPath"]: v for v in container["volumeMounts"]}
    assert volumes[mounts["/var/log/gpuguard"]["name"]]["hostPath"]["path"] == "/var/log/gpuguard"
    # the probe cache outlives a pod, so a rolled-out agent loads its probes without compiling
    assert mounts["/var/cache/gpuguard"].get("readOnly") is not True
    for path in (
        "/var/cache/gpuguard",
        "/sys/fs/bpf",
        "/sys/kernel/tracing",
        "/sys/fs/cgroup",
        "/var/log/containers",
        "/var/log/pods",
    ):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    # the image carries bcc's kernel headers: nothing of the node's is mounted
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    for path in ("/lib/modules", "/usr/src"):
        assert path not in mounts and not any(h.startswith(path) for h in host_paths), path
    for path in (
        "/sys/kernel/tracing",
        "/etc/gpuguard",
        "/var/log/containers",
        "/var/log/pods",
    ):
        assert mounts[path].get("readOnly") is True
    config = volumes[mounts["/etc/gpuguard"]["name"]]["projected"]
    assert config["defaultMode"] == 0o400 and "subPath" not in mounts["/etc/gpuguard"]
    assert {s["configMap"]["name"] for s in config["sources"]} == {
        "gpuguard-config",
        "gpuguard-rules",
    }
    assert (
        m["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    )
    configs = [d for d in render("monitor") if d["kind"] == "ConfigMap"]
    agent = yaml.safe_load(
        next(c for c in configs if "agent.yaml" in c["data"])["data"]["agent.yaml"]
    )
    assert agent["log"]["path"] == "/var/log/gpuguard/events.json" and agent["mode"] == "monitor"


def test_metrics_bind_the_pod_ip_and_the_probes_read_health():
    ds = by_kind(render("monitor"))["DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    args = container["args"]
    address = args[args.index("--metrics-address") + 1]
    from gpuguard.outputs.metrics_http import DEFAULT_METRICS_PORT, parse_address

    port = DEFAULT_METRICS_PORT
    assert address == f"[$(POD_IP)]:{port}"
    # what the kubelet substitutes parses for IPv4 and IPv6 pod IPs alike
    assert parse_address(address.replace("$(POD_IP)", "10.0.3.7")) == ("10.0.3.7", port)
    assert parse_address(address.replace("$(POD_IP)", "fd00::7")) == ("fd00::7", port)
    (declared,) = container["ports"]
    assert declared == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_resources_come_from_the_measured_rss_and_cpu():
    (container,) = by_kind(render("monitor"))["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    res = container["resources"]
    assert _quantity_mib(res["requests"]["memory"]) >= RSS_BUSY_MIB
    assert _quantity_mib(res["limits"]["memory"]) >= 1.5 * RSS_WORST_MIB
    assert "cpu" not in res.get("limits", {})  # a throttled ring reader loses events
    assert res["requests"]["cpu"] == "200m"
    text = (REPO / "benchmarks/README-agent.md").read_text()
    assert "146 MB" in text and "253 MB" in text  # the figures these come from are still there


def test_overlays_differ_only_where_they_say():
    monitor, enforce = by_kind(render("monitor")), by_kind(render("enforce"))
    (m,) = monitor["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    (e,) = enforce["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert "--mode" not in m["args"] and e["args"][-2:] == ["--mode", "enforce"]
    assert e["args"][:-2] == m["args"]
    e["args"] = m["args"]
    added = set(e["securityContext"]["capabilities"]["add"]) - set(
        m["securityContext"]["capabilities"]["add"]
    )
    assert added == {"KILL", "NET_ADMIN"}
    e["securityContext"]["capabilities"]["add"] = m["securityContext"]["capabilities"]["add"]
    assert enforce == monitor

    scraped = render("metrics")
    kinds = [d["kind"] for d in scraped]
    assert kinds.count("Service") == 1 and kinds.count("ServiceMonitor") == 1
    assert "PodMonitor" not in kinds  # one way of scraping per overlay, never both
    svc = by_kind(scraped)["Service"]
    pod_labels = by_kind(scraped)["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None"
    assert set(svc["spec"]["selector"].items()) <= set(pod_labels.items())
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    sm = by_kind(scraped)["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]["selector"]["matchLabels"].items()) <= set(
        svc["metadata"]["labels"].items()
    )
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    pm = by_kind(render("metrics-podmonitor"))["PodMonitor"]
    assert set(pm["spec"]["selector"]["matchLabels"].items()) <= set(pod_labels.items())
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    for monitor_ in (sm["spec"]["endpoints"][0], pm["spec"]["podMetricsEndpoints"][0]):
        assert monitor_["relabelings"][0]["targetLabel"] == "instance"


class ConfigMapVolume:
    """A directory laid out the way the kubelet's atomic writer lays out a ConfigMap volume:
    ``..<timestamp>/`` holds the files, ``..data`` links to it, each key links into ``..data``;
    an update writes a new timestamped directory and renames a new ``..data`` link over the old."""

    def __init__(self, path: Path, files: dict[str, str]) -> None:
        self.path, self.serial = path, 0
        path.mkdir(mode=0o755)
        self.update(files)
        for name in files:
            os.symlink(f"..data/{name}", path / name)

    def update(self, files: dict[str, str]) -> None:
        self.serial += 1
        old = os.readlink(self.path / "..data") if (self.path / "..data").is_symlink() else None
        stamp = self.path / f"..2026_11_25_08_00_00.{self.serial:09d}"
        stamp.mkdir(mode=0o755)
        for name, text in files.items():
            (stamp / name).write_text(text)
            (stamp / name).chmod(0o400)
        os.symlink(stamp.name, self.path / "..data_tmp")
        os.rename(self.path / "..data_tmp", self.path / "..data")
        if old:
            shutil.rmtree(self.path / old)


def test_rules_configmap_layout_is_what_the_agent_reads_by_default(tmp_path):
    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.ruleset.shipped import default_rule_paths, shipped_rules_file

    docs = render("monitor")
    data = {}
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            data.update(doc["data"])
    assert set(data) == {"agent.yaml", "site-rules.yaml"}
    volume = ConfigMapVolume(tmp_path / "gpuguard", data)
    paths = default_rule_paths(volume.path)
    assert paths == [shipped_rules_file(), volume.path / "site-rules.yaml"]
    assert len(load_ruleset(paths).rules) == len(load_ruleset([shipped_rules_file()]).rules)


def _rules_info(port: int) -> tuple[str, float, str]:
    """gpuguard_rules_info's version, the failed reloads, and its digest."""
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    version, failed, digest = "", 0.0, ""
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "gpuguard_rules_info":
                version, digest = sample.labels["version"], sample.labels["digest"]
            if sample.name == "gpuguard_reloads_total" and sample.labels["result"] == "failed":
                failed = sample.value
    return version, failed, digest


def _digest_of(*paths: Path) -> str:
    """SHA-256 of the files' contents, one after another (the agent's rules digest)."""
    return hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()


@pytest.mark.root
@pytest.mark.self_contained
def test_a_rules_configmap_update_reaches_the_running_agent_and_its_version_label(tmp_path):
    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.ruleset.shipped import shipped_rules_file
    from tests.support.agent_run import AgentProcess, until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent_yaml = (
        f"rules: [{shipped_rules_file()}, site-rules.yaml]\n"
        f"metrics: {{address: '127.0.0.1:{port}'}}\n"
    )
    site = "version: 1\ndescription: site rules v1\n"
    volume = ConfigMapVolume(tmp_path / "etc", {"agent.yaml": agent_yaml, "site-rules.yaml": site})
    agent = AgentProcess(tmp_path, "--sensor", "proc", "--config", str(volume.path / "agent.yaml"))
    try:
        agent.wait_ready()
        first, _, digest = until(lambda: _rules_info(port)[0] and _rules_info(port), timeout=20)
        rule_files = [shipped_rules_file(), volume.path / "site-rules.yaml"]
        files = (*rule_files, *map(Path, load_ruleset(rule_files).yara_files))
        assert digest == _digest_of(*files) and first == digest[:12]  # the whole digest, too
        volume.update(
            {
                "agent.yaml": agent_yaml,
                "site-rules.yaml": "version: 1\nlists: {pool_ports: {extend: [3333]}}\n",
            }
        )
        second, failed, digest = until(
            lambda: (r := _rules_info(port))[0] != first and r, timeout=30
        )
        assert failed == 0 and digest == _digest_of(*files) and second == digest[:12]
        assert any(
            r.get("event", {}).get("action") == "reload" and second in r.get("message", "")
            for r in agent.records()
        )
        # a broken update keeps the last good rules, counts the failure, and says why
        volume.update({"agent.yaml": agent_yaml, "site-rules.yaml": "version: 1\nrules: [\n"})
        version, failed, _ = until(lambda: (r := _rules_info(port))[1] >= 1 and r, timeout=30)
        assert version == second
    finally:
        assert agent.stop() == 0, agent.stderr()


NUMBER_WORDS = {2: "two", 5: "five", 7: "seven"}


def test_containerfile_installs_offline_and_runs_the_agent():
    text = (PKG / "Containerfile").read_text()
    assert "--find-links /tmp/wheels --require-hashes" in text and "--no-index" in text
    assert "python3-bpfcc" in text
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))
    assert entry == ["/opt/gpuguard/bin/gpuguard"]
    assert json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))[0] == "agent"


def test_the_image_and_docs_name_the_capabilities_the_daemonset_grants():
    """The Containerfile's comment and docs/deploy.md say what the overlays grant (they drifted once)."""
    (monitor,) = by_kind(render("monitor"))["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    (enforce,) = by_kind(render("enforce"))["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    granted = monitor["securityContext"]["capabilities"]["add"]
    added = [c for c in enforce["securityContext"]["capabilities"]["add"] if c not in granted]
    text = (PKG / "Containerfile").read_text()
    listed = re.search(r"^#\s+capabilities: (.*)$", text, re.M).group(1).split()
    assert listed == granted, f"the Containerfile lists {listed}; the DaemonSet grants {granted}"
    assert f"overlays/enforce adds {' and '.join(added)}" in text
    patch = (K8S / "overlays/enforce/enforce.yaml").read_text()
    assert f"Monitor mode's {NUMBER_WORDS[len(granted)]}" in patch
    assert f"the response's {NUMBER_WORDS[len(added)]}" in patch
    assert not re.search(r"\b(six|eight|nine|ten)\b capabilities", text)
    deploy = (REPO / "docs/deploy.md").read_text()
    total = len(granted) + len(added)
    assert f"monitor mode's {NUMBER_WORDS[len(granted)]} capabilities" in deploy
    assert f"{len(granted)} capabilities monitoring, {total} enforcing" in deploy


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
    for name, rule in _sigma_rules().items():  # each alone: the folder folds the pool rule in
        if "correlation" not in rule:
            single = SigmaCollection.from_yaml((PKG / "sigma" / f"{name}.yml").read_text())
            (queries[rule["name"]],) = lucene.convert(single)
    assert "gpuguard.verdict:malicious" in queries["gpuguard_malicious_on_gpu_node"]
    assert "_exists_:destination.ip" in queries["gpuguard_pool_connection"]
    esql = "\n".join(ESQLBackend().convert(collection))
    assert (
        "count_distinct(host.name)" in esql
        and "by timebucket, destination.ip" in esql
        and ">= 3" in esql
    )


def test_sigma_rules_match_real_agent_records_and_not_benign_ones():
    from gpuguard.detect.cases import replay
    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.ruleset.shipped import shipped_rules_file
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
        assert all(sigma_matches(rules[rule], d) for d in docs["malicious"]), rule
        assert not any(sigma_matches(rules[rule], d) for d in docs["clean"]), rule
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
    assert sigma_matches(blind, fault) and not sigma_matches(blind, start)
    # the correlation's fields exist in the records it counts
    corr = rules["gpuguard_pool_on_many_hosts"]["correlation"]
    miner = docs["malicious"][0]
    assert (
        record_value(miner, corr["group-by"][0]) == "141.94.96.144"
        and record_value(miner, corr["condition"]["field"]) == "gpu-1"
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


# -- Fleet view: alerting rules, dashboard, provisioning --------------------------------------

PROM = PKG / "prometheus"


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, (
        "promtool is missing (fix: bash packaging/setup-host.sh setup installs prometheus)"
    )
    return found


def test_alerting_rules_pass_promtool_check_and_their_unit_tests():
    check = subprocess.run(
        [_promtool(), "check", "rules", str(PROM / "gpuguard-alerts.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    tested = subprocess.run(
        [_promtool(), "test", "rules", "gpuguard-alerts.test.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROM,
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    alerts = {
        r["alert"]
        for g in yaml.safe_load((PROM / "gpuguard-alerts.yaml").read_text())["groups"]
        for r in g["rules"]
    }
    tests = yaml.safe_load((PROM / "gpuguard-alerts.test.yaml").read_text())["tests"]
    covered = {t["alertname"] for case in tests for t in case["alert_rule_test"]}
    assert covered == alerts  # every alert has a test


def test_the_gpu_node_alert_is_tested_over_both_dcgm_exporter_spellings_of_the_node():
    """dcgm-exporter renamed Hostname to hostname after 4.8.2: the alert joins on UUID, and the
    promtool tests above hold it to both spellings, each naming its nodes by its own label."""
    rule = next(
        r
        for g in yaml.safe_load((PROM / "gpuguard-alerts.yaml").read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "GpuguardMissingOnGpuNode"
    )
    assert "on (UUID)" in rule["expr"] and "on (Hostname)" not in rule["expr"]
    spellings = set()
    for case in yaml.safe_load((PROM / "gpuguard-alerts.test.yaml").read_text())["tests"]:
        for check in case["alert_rule_test"]:
            if check["alertname"] != "GpuguardMissingOnGpuNode" or not check["exp_alerts"]:
                continue
            dcgm = [s["series"] for s in case["input_series"] if s["series"].startswith("DCGM_")]
            (label,) = {re.search(r"\b([Hh]ostname)=", s).group(1) for s in dcgm}
            assert all(label in a["exp_labels"] for a in check["exp_alerts"])
            spellings.add(label)
    assert spellings == {"Hostname", "hostname"}


def test_the_zero_series_deploy_md_counts_are_the_ones_the_shipped_agent_declares():
    """docs/deploy.md's count of gpuguard_findings_total series at start, from the code: every
    rule a finding can name under the shipped rules and config, once per verdict."""
    from gpuguard.agent.config import load_config
    from gpuguard.agent.telemetry import finding_rules
    from gpuguard.detect.ruleset.load import load_ruleset
    from gpuguard.detect.ruleset.model import VERDICTS
    from gpuguard.detect.ruleset.shipped import shipped_rules_file

    rules = finding_rules(load_ruleset([shipped_rules_file()]), load_config(PKG / "agent.yaml"))
    text = " ".join((REPO / "docs" / "deploy.md").read_text().split())
    said = re.search(
        r"That is (\d+) series per node with the shipped rules and config \((\d+) rules and "
        r"host checks, (\d+) verdicts each",
        text,
    )
    assert said, "docs/deploy.md no longer states the zero series count"
    assert tuple(map(int, said.groups())) == (
        len(rules) * len(VERDICTS),
        len(rules),
        len(VERDICTS),
    ), 'fix the count in docs/deploy.md, "Alerts"'


def test_alerting_rules_read_only_metrics_the_agent_exports():
    from gpuguard.outputs.metrics import metric_names

    exported = metric_names(per_process_gpu=True)
    for group in yaml.safe_load((PROM / "gpuguard-alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"\bgpuguard_[a-z_]+\b", rule["expr"]):
                assert name in exported, (rule["alert"], name)


def test_dashboard_has_a_datasource_variable_and_the_fleet_row():
    doc = json.loads((PKG / "grafana-dashboard.json").read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "__inputs" not in doc and "DS_PROMETHEUS" not in json.dumps(doc)
    for panel in doc["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows[0] == "Fleet"
    fleet = " ".join(
        t["expr"]
        for p in doc["panels"]
        if p["type"] != "row" and p["gridPos"]["y"] < 17
        for t in p["targets"]
    )
    for metric in (
        "gpuguard_findings_total",
        "gpuguard_blocks_active",
        "gpuguard_rules_info",
        "gpuguard_ring_lost_events_total",
        "gpuguard_queue_dropped_total",
        "gpuguard_pod_gpu_series_dropped_total",
    ):
        assert metric in fleet, metric
    assert "sum by (instance" in fleet and "count by (version)" in fleet
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning_example_loads_the_dashboard():
    prov = PKG / "grafana" / "provisioning"
    sources = yaml.safe_load((prov / "datasources/gpuguard-prometheus.yaml").read_text())
    assert sources["apiVersion"] == 1 and sources["datasources"][0]["type"] == "prometheus"
    dashboards = yaml.safe_load((prov / "dashboards/gpuguard.yaml").read_text())
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def test_promtool_check_metrics_passes_on_the_agents_exposition(tmp_path):
    from gpuguard.outputs.metrics import AgentMetrics
    from tests.support.metrics_pipeline import Pipeline

    metrics = AgentMetrics(per_process_gpu=True)
    pipeline = Pipeline(metrics, tmp_path)
    try:
        pipeline.run_once()
    finally:
        pipeline.close()
    body = exposition(metrics)
    assert b"gpuguard_pod_gpu_sm_percent{" in body and b"gpuguard_process_gpu_sm_percent{" in body
    run = subprocess.run(
        [_promtool(), "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    # Its one complaint is by design: the GPU series carry dcgm-exporter's label names
    # (modelName, Hostname) so DCGM_FI_DEV_* joins them without label_replace.  Every other
    # lint rule holds, and a family without those labels draws no complaint.
    from prometheus_client.parser import text_string_to_metric_families

    from gpuguard.outputs.gpu_metrics import GPU_LABELS

    dcgm_named = {
        fam.name
        for fam in text_string_to_metric_families(body.decode())
        if any(set(GPU_LABELS) <= set(sample.labels) for sample in fam.samples)
    }
    assert dcgm_named and "gpuguard_findings" not in dcgm_named
    lines = (run.stdout + run.stderr).decode().splitlines()
    camel = " label names should be written in 'snake_case' not 'camelCase'"
    assert lines and all(line.endswith(camel) for line in lines), lines
    complained = {line.removesuffix(camel) for line in lines}
    assert complained == dcgm_named, complained
    # promtool does complain about what it should: a counter without _total
    bad = b"# HELP x_bad a\n# TYPE x_bad counter\nx_bad 1\n"
    assert subprocess.run(
        [_promtool(), "check", "metrics"], input=bad, capture_output=True
    ).returncode


def _documented_dcgm_joins() -> list[str]:
    text = (REPO / "docs/deploy.md").read_text()
    section = text[text.index("### Joining DCGM") : text.index("## Fleet view")]
    return re.findall(r"```promql\n(.*?)```", section, re.S)


def _promtool_series(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": f"{value:.6f}x5"}


def test_the_documented_dcgm_joins_work_on_series_as_both_exporters_write_them(tmp_path):
    """The PromQL in docs/deploy.md, "Joining DCGM", run by promtool over gpuguard's own
    exposition (the fake H100s of tests/test_agent_metrics.py) and dcgm-exporter series labelled
    as its metric template writes them (gpu index, UUID, pci_bus_id, device, modelName, Hostname)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpuguard.outputs.metrics import AgentMetrics
    from tests.support.metrics_pipeline import Pipeline

    metrics = AgentMetrics(hostname="gpu-1")
    pipeline = Pipeline(metrics, tmp_path)
    try:
        pipeline.run_once()
    finally:
        pipeline.close()
    target = {"instance": "gpu-1", "job": "gpuguard-metrics"}
    ours = [
        (s.name, {**s.labels, **target}, s.value)
        for fam in text_string_to_metric_families(exposition(metrics).decode())
        for s in fam.samples
        if s.name in ("gpuguard_pod_gpu_sm_percent", "gpuguard_pod_gpu_memory_bytes")
    ]
    gpus = {labels["UUID"] for _, labels, _ in ours} | {
        s.labels["UUID"]
        for fam in text_string_to_metric_families(exposition(metrics).decode())
        for s in fam.samples
        if s.name == "gpuguard_gpu_utilization_percent"
    }
    busy, idle = sorted(gpus)  # the H100 with two pods on it, and one gpuguard sees no pod on
    dcgm = {"job": "dcgm-exporter", "instance": "10.0.0.1:9400", "Hostname": "gpu-1"}
    model = "NVIDIA H100 80GB HBM3"
    theirs = []
    for index, uuid in enumerate((busy, idle)):
        labels = {
            **dcgm,
            "gpu": str(index),
            "UUID": uuid,
            "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
            "device": f"nvidia{index}",
            "modelName": model,
        }
        theirs.append(("DCGM_FI_DEV_FB_USED", labels, 76210.0 if uuid == busy else 0.0))
        theirs.append(("DCGM_FI_DEV_GPU_UTIL", labels, 98.0 if uuid == busy else 97.0))
    share, unattributed = _documented_dcgm_joins()
    memory = [(labels, v) for name, labels, v in ours if name == "gpuguard_pod_gpu_memory_bytes"]
    assert len(memory) == 2
    doc = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [_promtool_series(*s) for s in ours + theirs],
                "promql_expr_test": [
                    {
                        "expr": share.strip(),
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": "{"
                                + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                                + "}",
                                "value": float(f"{v:.6f}") / (76210.0 * 1048576),
                            }
                            for labels, v in memory
                        ],
                    },
                    {
                        "expr": unattributed.strip(),
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": f'{{Hostname="gpu-1",UUID="{idle}",modelName="{model}"}}',
                                "value": 97,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "dcgm-join.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    tested = subprocess.run(
        [_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
