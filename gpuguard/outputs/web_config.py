"""The metrics port's optional web config file, in the Prometheus exporter-toolkit's format.

node_exporter and dcgm-exporter read the same file (their ``--web.config.file``):
``tls_server_config`` (``cert_file``, ``key_file``; ``client_ca_file`` with a
``client_auth_type`` for client certificates; ``min_version``/``max_version``) and
``basic_auth_users`` (user name -> bcrypt hash).  It is read with the one config schema, so
every problem names ``file:line:col``.  The agent runs as root and this file decides who may
read its metrics, so it and every file it names are refused, like the rules, when anyone but
root could have written them.  Keys of the format that gpuguard does not implement are
refused by name, never ignored.  docs/deploy.md, "Metrics over TLS with basic auth".
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.config.filecheck import refusal_reason
from gpuguard.config.schema import Key, Section, check
from gpuguard.config.yaml_marks import load_trusted_file
from gpuguard.errors import GpuguardError

MAX_WEB_CONFIG_BYTES = 1 << 16
# The client_auth_type values Python's TLS can honour: it cannot ask for a certificate without
# verifying it, so the toolkit's RequestClientCert and RequireAnyClientCert are refused.  A
# required certificate is asked for and verified in the handshake like one given at will, and
# required by /metrics (403 without): the kubelet's probes never send one, and must still reach
# the health paths (docs/deploy.md, "Metrics over TLS with basic auth").
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_OPTIONAL,
}
REQUIRED_CLIENT_AUTH = "RequireAndVerifyClientCert"
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The toolkit's keys gpuguard does not implement, and why (refused with this reason).
NOT_IMPLEMENTED = {
    ("tls_server_config", "cert"): "give the certificate as cert_file",
    ("tls_server_config", "key"): "give the key as key_file",
    ("tls_server_config", "client_ca"): "give the client CA as client_ca_file",
    ("tls_server_config", "client_allowed_sans"): "use a client CA that signs only the scrapers",
    ("tls_server_config", "cipher_suites"): "remove it (OpenSSL's defaults apply)",
    ("tls_server_config", "curve_preferences"): "remove it (OpenSSL's defaults apply)",
    ("tls_server_config", "prefer_server_cipher_suites"): "remove it",
    ("http_server_config",): "remove it (HTTP/1.1, no extra headers)",
    ("rate_limit",): "remove it",
}
BCRYPT_HASH = re.compile(r"^\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")
_FIX = "correct the metrics web config (docs/deploy.md, 'Metrics over TLS with basic auth')"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """``tls_server_config``: the server's certificate and key, and who may connect."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @property
    def requires_client_cert(self) -> bool:
        """Whether /metrics answers only a client whose certificate the CA verified."""
        return self.client_auth_type == REQUIRED_CLIENT_AUTH

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def context(self) -> ssl.SSLContext:
        """A server TLS context from the files as they are now; raises ssl.SSLError or OSError."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        ctx.maximum_version = TLS_VERSIONS[self.max_version]
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    """The checked web config: TLS (None: plain HTTP) and basic-auth users (empty: none)."""

    tls: TlsFiles | None = None
    users: dict[str, str] = field(default_factory=dict)  # user name -> bcrypt hash
    source: str = ""


WEB_CONFIG_SCHEMA = Section(
    "",
    (
        Section(
            "tls_server_config",
            (
                Key("cert_file", "text", "the server's certificate (PEM; relative to this file)"),
                Key("key_file", "text", "its private key (PEM)"),
                Key("client_ca_file", "text", "CA that signs the scrapers' client certificates"),
                Key(
                    "client_auth_type",
                    "choice",
                    "client certificates: none, checked when given, or required",
                    choices=tuple(CLIENT_AUTH),
                ),
                Key("min_version", "choice", "oldest TLS version", choices=tuple(TLS_VERSIONS)),
                Key("max_version", "choice", "newest TLS version", choices=tuple(TLS_VERSIONS)),
            ),
            "TLS for the metrics port (absent: plain HTTP)",
            model=TlsFiles,
            field="tls",
        ),
        Key(
            "basic_auth_users",
            "mapping",
            "user name: bcrypt hash (htpasswd -nBC 10 USER); /metrics then needs one of them",
            field="users",
            shows="{}",
        ),
    ),
    model=WebConfig,
)


def load_web_config(path: Path) -> WebConfig:
    """The web config in ``path``, checked; raises :class:`GpuguardError` (one line) otherwise."""
    doc = load_trusted_file(path, MAX_WEB_CONFIG_BYTES, "metrics web config")
    if doc.problems:
        position, message = doc.problems[0]
        raise GpuguardError(f"{position}: {message}", _FIX)
    data = doc.data if doc.data is not None else {}
    if not isinstance(data, dict):
        raise GpuguardError(f"{path}:1:1: the web config must be a mapping", _FIX)
    problems: list[str] = []

    def add(where: tuple, message: str, key: bool = False) -> None:
        problems.append(f"{doc.key_at(where) if key else doc.at(where)}: {message}")

    for where, fix in NOT_IMPLEMENTED.items():
        inner: Any = data
        for part in where[:-1]:
            inner = inner.get(part) if isinstance(inner, dict) else None
        if isinstance(inner, dict) and where[-1] in inner:
            add(where, f"{'.'.join(where)} is not implemented by gpuguard ({fix})", key=True)
    if not problems:
        values = check(data, WEB_CONFIG_SCHEMA, (), add, named=True)
        config = _checked(values, path.parent, add, doc)
    if problems:
        raise GpuguardError(problems[0], _FIX)
    return config


def _checked(values: dict, base: Path, add: Any, doc: Any) -> WebConfig:
    """The cross-key rules of the format, the named files' trust, and a test load of the TLS files."""
    users: dict[str, str] = {}
    for user, digest in (values.get("users") or {}).items():
        where = ("basic_auth_users", user)
        if not isinstance(user, str) or not user or ":" in user:
            add(where, f"user name {user!r} must be a non-empty string without ':'", key=True)
        elif not isinstance(digest, str) or not BCRYPT_HASH.match(digest):
            add(where, f"the password of {user!r} must be a bcrypt hash ($2y$10$..., 60 chars)")
        else:
            users[user] = digest
    tls = None
    if "tls" in values:
        given = values["tls"]
        files = {
            k: str(base / given[k])
            for k in ("cert_file", "key_file", "client_ca_file")
            if given.get(k)
        }
        tls = TlsFiles(**{**given, **files})
        _check_tls(tls, add)
    return WebConfig(tls=tls, users=users, source=str(doc.file))


def _check_tls(tls: TlsFiles, add: Any) -> None:
    at = ("tls_server_config",)
    for name in ("cert_file", "key_file"):
        if not getattr(tls, name):
            add(at, f"tls_server_config needs {name}", key=True)
    if tls.client_ca_file and tls.client_auth_type == "NoClientCert":
        add(
            at + ("client_ca_file",),
            "a client CA needs client_auth_type RequireAndVerifyClientCert",
        )
    if not tls.client_ca_file and tls.client_auth_type != "NoClientCert":
        add(at + ("client_auth_type",), f"{tls.client_auth_type} needs client_ca_file")
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        add(at + ("min_version",), f"min_version {tls.min_version} is above max_version")
    for name in ("cert_file", "key_file", "client_ca_file"):
        path = getattr(tls, name)
        if path:
            reason = refusal_reason(Path(path), name, f"{name} {path}")
            if reason is not None:
                add(at + (name,), f"{reason[0]} (fix: {reason[1]})")
    if tls.cert_file and tls.key_file:
        try:
            tls.context()
        except (ssl.SSLError, OSError) as exc:
            add(at + ("cert_file",), f"cannot load the certificate and key: {_ssl_reason(exc)}")


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return getattr(exc, "strerror", None) or str(exc)
