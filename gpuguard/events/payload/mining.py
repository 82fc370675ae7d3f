"""Mining pool protocols: stratum, CryptoNote (XMRig), ETHPROXY and plaintext Stratum V2 setup.

JSON-RPC lines cut at the capture limit are still read leniently for their
method and login fields; passwords are never copied into ``detail``.
"""

from __future__ import annotations

import json
import re

from gpuguard.events.payload.reader import (
    MAX_JSON_LINES,
    MAX_LIST,
    Decoded,
    Detail,
    Reader,
    Truncated,
    text,
    text_list,
)

# --- Stratum V2 ------------------------------------------------------------------------

_SV2_SUBPROTOCOLS = {0: "mining", 1: "job-declaration", 2: "template-distribution"}
_SV2_SETUP_MIN = 1 + 2 + 2 + 4 + 1 + 2 + 1 + 1 + 1 + 1  # every string empty
_SV2_SETUP_MAX = 1 + 2 + 2 + 4 + 2 + 5 * (1 + 255)
_SV2_STRINGS = ("vendor", "hardware_version", "firmware", "device_id")


def _sv2_string(reader: Reader) -> str | None:
    raw = reader.take(reader.u8())
    if any(b < 0x20 or b == 0x7F for b in raw):
        return None
    try:
        return text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def recognise_stratum_v2(data: bytes) -> Decoded | None:
    # Frame: extension_type u16 LE, msg_type u8, msg_length u24 LE, payload.
    # SetupConnection is extension 0, message 0x00, and opens every SV2 connection.
    if len(data) < 6 + 5 or data[0:3] != b"\x00\x00\x00":
        return None
    length = int.from_bytes(data[3:6], "little")
    if not _SV2_SETUP_MIN <= length <= _SV2_SETUP_MAX:
        return None
    payload = data[6 : 6 + length]
    complete = len(payload) == length
    reader = Reader(payload)
    detail: Detail = {"message": "SetupConnection"}
    try:
        subprotocol = reader.u8()
        min_version, max_version = reader.u16le(), reader.u16le()
        if subprotocol not in _SV2_SUBPROTOCOLS or not 1 <= min_version <= max_version <= 0xFF:
            return None
        detail.update(
            subprotocol=_SV2_SUBPROTOCOLS[subprotocol],
            min_version=min_version,
            max_version=max_version,
        )
        detail["flags"] = reader.u32le()
        host = _sv2_string(reader)
        if host is None:
            return None
        detail["endpoint_host"] = host
        detail["endpoint_port"] = reader.u16le()
        for key in _SV2_STRINGS:
            value = _sv2_string(reader)
            if value is None:
                return None
            detail[key] = value
    except Truncated:
        if complete:
            return None  # the declared length disagrees with the fields
        detail["truncated"] = True
        return "stratum-v2", detail, b""
    if reader.remaining():
        return None  # bytes left over inside the declared length
    return "stratum-v2", detail, b""


# --- JSON-RPC: stratum, CryptoNote, ETHPROXY ------------------------------------------

_CRYPTONOTE_METHODS = frozenset({"login", "submit", "keepalived", "getjob"})
_ETHPROXY_METHODS = frozenset(
    {"eth_submitLogin", "eth_getWork", "eth_submitWork", "eth_submitHashrate"}
)

_JSON_STR = r'"((?:[^"\\]|\\.){0,512})"'
_RE_METHOD = re.compile(r'"method"\s*:\s*' + _JSON_STR)
_RE_FIRST_PARAM = re.compile(r'"params"\s*:\s*\[\s*' + _JSON_STR)
_RE_KEY = {
    key: re.compile(rf'"{key}"\s*:\s*' + _JSON_STR) for key in ("login", "agent", "worker", "rigid")
}
_RE_ALGO = re.compile(r'"algo"\s*:\s*\[([^\]]{0,1024})\]')
_RE_STRING = re.compile(_JSON_STR)


def _protocol_of(method: str) -> str | None:
    if method.startswith("mining."):
        return "stratum"
    if method in _CRYPTONOTE_METHODS:
        return "cryptonote"
    if method in _ETHPROXY_METHODS:
        return "ethproxy"
    return None


def _unescape(raw: str) -> str:
    try:
        value = json.loads(f'"{raw}"')
    except (ValueError, RecursionError):
        return raw
    return value if isinstance(value, str) else raw


def _loads(line: bytes) -> dict | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class _Message:
    """One JSON-RPC line: fully parsed, or read leniently when cut short."""

    __slots__ = ("method", "obj", "text")

    def __init__(self, method: str, obj: dict | None, text: str) -> None:
        self.method = method
        self.obj = obj  # the parsed object, None when the line was partial
        self.text = text  # the line as text, for lenient extraction

    def params(self) -> object:
        return self.obj.get("params") if self.obj is not None else None

    def field(self, key: str) -> str | None:
        """A top-level (parsed) or anywhere-in-line (partial) string value."""
        if self.obj is not None:
            return text(self.obj.get(key))
        match = _RE_KEY[key].search(self.text)
        return text(_unescape(match.group(1))) if match else None

    def param_field(self, key: str) -> str | None:
        params = self.params()
        if isinstance(params, dict):
            return text(params.get(key))
        if self.obj is None:
            match = _RE_KEY[key].search(self.text)
            return text(_unescape(match.group(1))) if match else None
        return None

    def first_param(self) -> str | None:
        params = self.params()
        if isinstance(params, list) and params:
            return text(params[0])
        if self.obj is None:
            match = _RE_FIRST_PARAM.search(self.text)
            return text(_unescape(match.group(1))) if match else None
        return None


def _messages(data: bytes) -> list[_Message]:
    messages: list[_Message] = []
    for raw in data.split(b"\n", MAX_JSON_LINES)[:MAX_JSON_LINES]:
        line = raw.strip()
        if not line:
            continue
        if line[:1] != b"{":
            break
        obj = _loads(line)
        text = line.decode("utf-8", "replace")
        if obj is not None:
            method = obj.get("method")
        else:
            match = _RE_METHOD.search(text)
            method = _unescape(match.group(1)) if match else None
        if not isinstance(method, str):
            break
        messages.append(_Message(method, obj, text))
        if obj is None:
            break  # a line that does not parse is the one the capture cut
    return messages


def recognise_json_rpc(data: bytes) -> Decoded | None:
    messages = _messages(data)
    if not messages:
        return None
    protocol = _protocol_of(messages[0].method)
    if protocol is None:
        return None
    detail: Detail = {"method": text(messages[0].method)}
    if len(messages) > 1:
        detail["methods"] = [text(m.method) for m in messages[:MAX_LIST]]
    if protocol == "stratum":
        _stratum_detail(messages, detail)
    elif protocol == "cryptonote":
        if not _cryptonote_detail(messages, detail):
            return None
    else:
        _ethproxy_detail(messages, detail)
    return protocol, {k: v for k, v in detail.items() if v is not None}, b""


def _stratum_detail(messages: list[_Message], detail: Detail) -> None:
    for message in messages:
        if message.method == "mining.authorize" and "user" not in detail:
            detail["user"] = message.first_param()  # params[1] is the password: not kept
        elif message.method == "mining.subscribe" and "agent" not in detail:
            detail["agent"] = message.first_param()
            params = message.params()
            if isinstance(params, list) and len(params) > 1:
                version = text(params[1])
                if version and version.startswith("EthereumStratum/"):
                    detail["protocol_version"] = version
        elif message.method == "mining.hello" and "agent" not in detail:
            detail["agent"] = message.param_field("agent")


def _cryptonote_detail(messages: list[_Message], detail: Detail) -> bool:
    first = messages[0]
    # Plain "login"/"submit" are common JSON-RPC words; the XMRig protocol always
    # passes an object as params, so a parsed line with anything else is not it.
    if first.obj is not None and not isinstance(first.params(), dict):
        return False
    for message in messages:
        if message.method == "login":
            detail["login"] = message.param_field("login")
            detail["agent"] = message.param_field("agent")
            detail["rig_id"] = message.param_field("rigid")
            detail["algo"] = _algo_list(message)
            break
    return True


def _algo_list(message: _Message) -> list[str] | None:
    params = message.params()
    if isinstance(params, dict):
        return text_list(params.get("algo"))
    if message.obj is None:
        match = _RE_ALGO.search(message.text)
        if match:
            return [text(_unescape(s)) or "" for s in _RE_STRING.findall(match.group(1))[:MAX_LIST]]
    return None


def _ethproxy_detail(messages: list[_Message], detail: Detail) -> None:
    for message in messages:
        if detail.get("worker") is None:
            detail["worker"] = message.field("worker")
        if message.method == "eth_submitLogin" and detail.get("login") is None:
            detail["login"] = message.first_param()
