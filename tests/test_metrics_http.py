"""The metrics port: only /metrics, /healthz and /readyz answer; TLS and basic auth from a web
config file in the Prometheus exporter-toolkit's format, scraped by Debian's real Prometheus."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from gpuguard.errors import GpuguardError
from gpuguard.outputs.metrics import AgentMetrics
from gpuguard.outputs.metrics_http import PATHS
from gpuguard.outputs.web_config import load_web_config
from tests.support.prometheus import PrometheusServer

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret scrape"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(where: Path, serial: str = "1") -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl."""
    where.mkdir(exist_ok=True)
    if not (where / "ca.key").exists():
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gg-test-ca",
            cwd=where,
        )  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=gg-{name}", cwd=where,
        )  # fmt: skip
        (where / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", serial, "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=where,
        )  # fmt: skip
    for path in where.iterdir():
        path.chmod(0o600)
    return {p.stem + p.suffix.replace(".", "_"): p for p in where.iterdir()}


def web_config(where: Path, text: str) -> Path:
    path = where / "web.yml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def password_hash(password: str = PASSWORD) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()


def get(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None):
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def client_context(pki: dict[str, Path], with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca_crt"]))
    if with_cert:
        ctx.load_cert_chain(pki["client_crt"], pki["client_key"])
    return ctx


# -- paths --------------------------------------------------------------------------------


def test_only_the_three_paths_answer_and_nothing_else_shows_the_metrics():
    metrics = AgentMetrics()
    server = metrics.serve("127.0.0.1:0")
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert PATHS == ("/metrics", "/healthz", "/readyz")
        code, body = get(base + "/metrics")
        assert code == 200 and "gpuguard_agent_info" in body
        assert get(base + "/healthz")[0] == 200 and get(base + "/readyz")[0] == 503  # starting
        for path in ("/", "/nope", "/favicon.ico", "/metrics/", "/metricsx", "/healthz/../metrics"):
            code, body = get(base + path)
            assert (code, body) == (404, "not found\n"), path
        posted = urllib.request.Request(base + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(posted, timeout=10)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, HEAD"
    finally:
        server.close()


def raw_request(port: int, method: str, path: str, headers: str = "") -> tuple[int, dict, bytes]:
    """One HTTP/1.0 request on a plain socket: status, headers and every byte after them (what a
    HEAD answer must not have)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"{method} {path} HTTP/1.0\r\nHost: x\r\n{headers}\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), fields, body


@pytest.mark.parametrize("users", [False, True], ids=["open", "basic-auth"])
def test_head_answers_wherever_get_does_with_its_headers_and_no_body(tmp_path, users):
    """HEAD is what GET is, less the body: same status, type and length, on every path."""
    web = None
    if users:
        web = load_web_config(web_config(tmp_path, f"basic_auth_users:\n  p: {password_hash()}\n"))
    metrics = AgentMetrics()
    server = metrics.serve("127.0.0.1:0", web=web)
    token = base64.b64encode(f"p:{PASSWORD}".encode()).decode()
    try:
        for path in (*PATHS, "/nope"):
            for auth in ("", f"Authorization: Basic {token}\r\n"):
                code, fields, body = raw_request(server.port, "GET", path, auth)
                h_code, h_fields, h_body = raw_request(server.port, "HEAD", path, auth)
                assert (h_code, h_body) == (code, b""), (path, auth)
                assert h_fields["content-type"] == fields["content-type"], path
                scrape = path == "/metrics" and code == 200
                if not scrape:
                    assert int(h_fields["content-length"]) == len(body), path
                else:  # the metrics body moves between two scrapes
                    assert int(h_fields["content-length"]) > 1000
                if path == "/metrics":
                    assert code == (401 if users and not auth else 200)
    finally:
        server.close()


# -- the web config file ---------------------------------------------------------------------


def test_tls_with_basic_auth_and_client_certificates(tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = web_config(
        tmp_path,
        "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
        f"basic_auth_users:\n  prometheus: '{password_hash()}'\n",
    )
    web = load_web_config(config)
    assert web.tls.cert_file == str(tmp_path / "pki" / "server.crt")  # relative to the file
    server = AgentMetrics().serve("127.0.0.1:0", web=web)
    base = f"https://127.0.0.1:{server.port}"
    try:
        tls = client_context(pki)
        code, body = get(base + "/metrics", tls, ("prometheus", PASSWORD))
        assert code == 200 and "gpuguard_agent_info" in body
        assert get(base + "/metrics", tls, ("prometheus", "wrong"))[0] == 401
        assert get(base + "/metrics", tls, ("nobody", PASSWORD))[0] == 401
        assert get(base + "/metrics", tls)[0] == 401
        assert get(base + "/metrics", tls, ("prometheus", "x" * 100))[0] == 401  # > 72 bytes
        # the kubelet's probes cannot send a password: health stays open, behind TLS
        assert get(base + "/healthz", tls)[0] == 200
        assert get(base + "/nope", tls, ("prometheus", PASSWORD))[0] == 404
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: no answer
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    finally:
        server.close()
    mutual = web_config(
        tmp_path,
        "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
        "  client_ca_file: pki/ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n",
    )
    server = AgentMetrics().serve("127.0.0.1:0", web=load_web_config(mutual))
    try:
        url = f"https://127.0.0.1:{server.port}/metrics"
        assert get(url, client_context(pki, with_cert=True))[0] == 200
        # no client certificate: /metrics refuses, the health paths answer (kubelet probes)
        assert get(url, client_context(pki)) == (403, "client certificate required\n")
        assert get(url.replace("/metrics", "/healthz"), client_context(pki))[0] == 200
        stranger = make_pki(tmp_path / "other")  # a certificate another CA signed
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            get(url, client_context(stranger, with_cert=True))  # the handshake refuses it
    finally:
        server.close()


def kubelet_probe(port: int, path: str) -> int:
    """What an httpGet probe with ``scheme: HTTPS`` does: no server verification, no client
    certificate, no password; the status it gets."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return get(f"https://127.0.0.1:{port}{path}", ctx)[0]


@pytest.mark.parametrize(
    "tls_extra",
    [
        "",
        "  client_ca_file: pki/ca.crt\n  client_auth_type: VerifyClientCertIfGiven\n",
        "  client_ca_file: pki/ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n",
        "  min_version: TLS13\n",
    ],
    ids=["tls", "client-cert-if-given", "client-cert-required", "tls13"],
)
def test_kubelet_probes_reach_the_health_paths_under_every_documented_web_config(
    tmp_path, tls_extra
):
    """Every option docs/deploy.md offers, with basic auth on: /healthz answers 200 and /readyz
    answers (503 while starting) to a probe that sends no certificate and no password, while
    /metrics stays closed to it."""
    pki = make_pki(tmp_path / "pki")
    config = web_config(
        tmp_path,
        "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
        + tls_extra
        + f"basic_auth_users:\n  prometheus: '{password_hash()}'\n",
    )
    server = AgentMetrics().serve("127.0.0.1:0", web=load_web_config(config))
    try:
        assert kubelet_probe(server.port, "/healthz") == 200
        assert kubelet_probe(server.port, "/readyz") == 503  # starting: an answer, not a failure
        assert kubelet_probe(server.port, "/metrics") in (401, 403)
        scraper = client_context(pki, with_cert=True)
        code, body = get(
            f"https://127.0.0.1:{server.port}/metrics", scraper, ("prometheus", PASSWORD)
        )
        assert code == 200 and "gpuguard_agent_info" in body
    finally:
        server.close()


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path):
    pki = make_pki(tmp_path / "pki", serial="10")
    config = web_config(
        tmp_path, "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
    )
    problems: list[str] = []
    server = AgentMetrics().serve(
        "127.0.0.1:0", web=load_web_config(config), on_problem=problems.append
    )

    def serial() -> int:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            ctx = client_context(pki)
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                der = conn.getpeercert(binary_form=True)
        text = subprocess.run(
            ["openssl", "x509", "-inform", "der", "-noout", "-serial"],
            input=der, capture_output=True, check=True,
        ).stdout.decode()  # fmt: skip
        return int(text.strip().split("=")[1], 16)

    try:
        assert serial() == 10
        make_pki(tmp_path / "pki", serial="11")  # cert-manager renews the certificate in place
        assert serial() == 11
        (tmp_path / "pki" / "server.crt").write_text("not a certificate\n")  # a broken renewal
        assert serial() == 11 and len(problems) == 1 and "previous" in problems[0]
        assert serial() == 11 and len(problems) == 1  # said once
    finally:
        server.close()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tls_server_config:\n  cert_file: pki/server.crt\n", "tls_server_config needs key_file"),
        (
            "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            ":4:3: tls_server_config.cipher_suites is not implemented by gpuguard",
        ),
        ("basic_auth_users:\n  prometheus: plain-text-password\n", "must be a bcrypt hash"),
        ("basic_auth_user:\n  prometheus: x\n", ":1:1: unknown key 'basic_auth_user'"),
        (
            "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
            "  client_ca_file: pki/ca.crt\n",
            "a client CA needs client_auth_type RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
            "  client_auth_type: RequestClientCert\n",
            "is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/ca.key\n",
            "cannot load the certificate and key",
        ),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: pki/server.key\n", "not found"),
        ("- just a list\n", "the web config must be a mapping"),
    ],
)
def test_a_bad_web_config_is_one_line_naming_the_place_and_the_fix(tmp_path, text, says):
    make_pki(tmp_path / "pki")
    config = web_config(tmp_path, text)
    with pytest.raises(GpuguardError) as refused:
        load_web_config(config)
    line = refused.value.one_line()
    assert says in line and "\n" not in line and "(fix: " in line, line


def test_an_oversized_web_config_is_named_as_itself(tmp_path):
    config = web_config(tmp_path, "# " + "x" * 70_000 + "\n")
    with pytest.raises(GpuguardError) as refused:
        load_web_config(config)
    line = refused.value.one_line()
    assert line.startswith(f"metrics web config {config} is larger than the 64 KiB limit"), line


@pytest.mark.root
@pytest.mark.self_contained
def test_a_web_config_others_could_write_is_refused_and_the_agent_says_so_in_one_line(tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki['server_crt']}\n  key_file: {pki['server_key']}\n",
    )
    config.chmod(0o620)
    with pytest.raises(GpuguardError, match="refusing metrics web config .*writable by group"):
        load_web_config(config)
    config.chmod(0o600)
    os.chown(config, 65534, 65534)  # nobody's file: anyone running as nobody could rewrite it
    with pytest.raises(GpuguardError, match="owned by uid 65534, not root"):
        load_web_config(config)
    os.chown(config, 0, 0)
    pki["server_key"].chmod(0o666)  # a file it names is judged the same way
    with pytest.raises(GpuguardError, match="refusing key_file .*writable by group/others"):
        load_web_config(config)
    pki["server_key"].chmod(0o600)
    config.chmod(0o660)
    run = subprocess.run(
        [sys.executable, "-m", "gpuguard", "agent", "--sensor", "proc", "--log", "-"]
        + ["--state-file", str(tmp_path / "s.json"), "--metrics-address", "127.0.0.1:0"]
        + ["--web-config-file", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert (
        line.startswith("gpuguard: refusing metrics web config") and f"chmod go-w {config}" in line
    )


# -- a real Prometheus scrapes over TLS with basic auth -----------------------------------------


def test_real_prometheus_scrapes_over_tls_with_basic_auth_and_a_wrong_password_is_refused(tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = web_config(
        tmp_path,
        "tls_server_config:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n"
        f"basic_auth_users:\n  prometheus: '{password_hash()}'\n",
    )
    metrics = AgentMetrics()
    metrics.declare_findings(["miner-cmdline-stratum"])
    exporter = metrics.serve("127.0.0.1:0", web=load_web_config(config))
    (tmp_path / "good").write_text(PASSWORD)
    (tmp_path / "bad").write_text("not the password")
    jobs = ""
    for job, password_file in (("gpuguard-tls", "good"), ("gpuguard-wrong-password", "bad")):
        jobs += (
            f"  - job_name: {job}\n    scheme: https\n"
            f"    tls_config: {{ca_file: {pki['ca_crt']}}}\n"
            f"    basic_auth: {{username: prometheus, password_file: {tmp_path / password_file}}}\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
        )
    config_text = "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + jobs
    server = PrometheusServer(tmp_path, config_text)
    api = server.api
    try:
        targets: dict[str, dict] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            server.check_alive()
            try:
                doc = json.loads(urllib.request.urlopen(f"{api}/targets", timeout=5).read())
            except OSError:
                time.sleep(0.3)
                continue
            targets = {t["labels"]["job"]: t for t in doc["data"]["activeTargets"]}
            # a target's health is its last scrape's: on a loaded host a scrape may time out
            # (1 s here), so the answers are waited for, not the first scrape of each
            good, bad = targets.get("gpuguard-tls", {}), targets.get("gpuguard-wrong-password", {})
            if good.get("health") == "up" and "401" in bad.get("lastError", ""):
                break
            time.sleep(0.3)
        good, bad = targets["gpuguard-tls"], targets["gpuguard-wrong-password"]
        assert good["health"] == "up" and good["scrapeUrl"].startswith("https://"), good
        assert bad["health"] == "down" and "401" in bad["lastError"], bad
        query = urllib.parse.urlencode(
            {"query": 'gpuguard_findings_total{job="gpuguard-tls",verdict="malicious"}'}
        )
        result = json.loads(urllib.request.urlopen(f"{api}/query?{query}", timeout=5).read())
        (sample,) = result["data"]["result"]
        assert sample["metric"]["rule"] == "miner-cmdline-stratum" and sample["value"][1] == "0"
    finally:
        server.stop()
        exporter.close()


def test_the_agent_config_names_the_web_config_relative_to_itself(tmp_path):
    from gpuguard.agent.config import load_config

    config = tmp_path / "agent.yaml"
    config.write_text("metrics: {address: '127.0.0.1:0', web_config_file: web.yml}\n")
    config.chmod(0o600)
    assert load_config(config).metrics_web_config == str(tmp_path / "web.yml")
    config.write_text("metrics: {web_config_file: /etc/gpuguard/web.yml}\n")
    assert load_config(config).metrics_web_config == "/etc/gpuguard/web.yml"
