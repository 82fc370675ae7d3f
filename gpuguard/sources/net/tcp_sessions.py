"""The TCP stack's per-socket counters (tcp_info), read through NETLINK_SOCK_DIAG, mapped to (pid, fd).

Data flow: pids -> their TCP socket fds (``socket:[INODE]`` links in
/proc/PID/fd, :func:`socket_fds`) -> grouped by network namespace (the
/proc/PID/ns/net inode) -> sock_diag requests with ``INET_DIAG_INFO`` ->
:class:`TcpSession` per (pid, fd).

A dump walks the kernel's whole TCP hash table once per address family
(~10 ms for 262,144 buckets on the test VM, whatever the number of sockets;
GPU servers with more memory have larger tables), so :class:`TcpSessionReader`
dumps only when a socket it has not seen appears, and otherwise asks for each
known socket by its address tuple and cookie (a hash lookup in the kernel).

The kernel counts bytes and data segments in and out of every TCP socket
anyway, so the inbound side costs nothing per read(2): one dump per interval.
A container's sockets are only listed by a netlink socket created inside its
network namespace: for every other namespace a short-lived thread enters it
with setns(2) (libc through ctypes; Python 3.11 has no ``os.setns``), creates
the netlink socket, and switches back; the socket keeps its namespace.  That
needs CAP_SYS_ADMIN; a namespace that cannot be entered is reported, not
guessed.

tcp_info grows with kernel versions: only the length the kernel returned is
decoded, and a field beyond it is ``None`` (absent), never 0.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
CLONE_NEWNET = 0x40000000
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
}
# Sockets a process can hold with a peer: not LISTEN, TIME_WAIT (no owner) or NEW_SYN_RECV (a request, not a socket).
_STATES = 0xFFFFFFFF & ~((1 << 10) | (1 << 6) | (1 << 12))
_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI48s")  # struct inet_diag_req_v2
_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # struct inet_diag_msg (ports big-endian, kept raw)
_RTA = struct.Struct("=HH")
# (name, offset, format) in the uapi struct tcp_info (include/uapi/linux/tcp.h); fields past the
# length the kernel returned are absent.
_TCP_INFO_FIELDS = (
    ("state", 0, "B"),
    ("last_data_sent_ms", 44, "I"),
    ("last_data_recv_ms", 52, "I"),
    ("rtt_us", 68, "I"),
    ("total_retrans", 100, "I"),
    ("bytes_acked", 120, "Q"),
    ("bytes_received", 128, "Q"),
    ("segs_out", 136, "I"),
    ("segs_in", 140, "I"),
    ("data_segs_in", 152, "I"),
    ("data_segs_out", 156, "I"),
    ("bytes_sent", 200, "Q"),
)


@dataclass(slots=True, frozen=True)
class TcpSession:
    """One TCP socket as the stack counts it (``None``: this kernel's tcp_info has no such field)."""

    inode: int
    family: str  # "ipv4" | "ipv6"
    local: str  # "127.0.0.1:5555", "[::1]:5555"
    remote: str
    state: str
    bytes_acked: int | None = None  # bytes out the peer acknowledged (4.1+)
    bytes_sent: int | None = None  # bytes out including retransmissions (4.19+)
    bytes_received: int | None = None  # bytes in (4.1+)
    data_segs_in: int | None = None  # segments in that carried data (4.6+)
    data_segs_out: int | None = None
    segs_in: int | None = None
    segs_out: int | None = None
    last_data_recv_ms: int | None = None  # ms since the latest data in
    last_data_sent_ms: int | None = None
    rtt_us: int | None = None
    total_retrans: int | None = (
        None  # segments retransmitted (a peer counts those in data_segs_in again)
    )
    sockid: bytes = field(
        default=b"", repr=False, compare=False
    )  # struct inet_diag_sockid: asks for it again


@dataclass(slots=True)
class SessionDump:
    """What one read found: sessions by (pid, fd), and one line per namespace or pid that could not be read."""

    sessions: dict[tuple[int, int], TcpSession] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)


TCP_PROTOCOLS = frozenset({b"TCP\0", b"TCPv6\0"})


def socket_fds(
    pid: int, proc_root: str = "/proc", protocols: frozenset[bytes] | None = None
) -> dict[int, int]:
    """Socket inode -> fd for every socket the process holds (empty when its fd table is unreadable or gone);
    ``protocols`` keeps those whose sockfs ``system.sockprotoname`` is one of them (e.g. :data:`TCP_PROTOCOLS`)."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(f"{proc_root}/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{proc_root}/{pid}/fd/{name}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        if protocols is not None:
            try:
                if (
                    os.getxattr(f"{proc_root}/{pid}/fd/{name}", "system.sockprotoname")
                    not in protocols
                ):
                    continue
            except OSError:
                continue
        out.setdefault(int(target[8:-1]), int(name))
    return out


def netns_of(pid: int | str, proc_root: str = "/proc") -> int | None:
    """The inode of the process's network namespace; ``None`` when it cannot be read."""
    try:
        return os.stat(f"{proc_root}/{pid}/ns/net").st_ino
    except OSError:
        return None


def _address(family: int, raw: bytes, port: bytes) -> str:
    port_n = int.from_bytes(port, "big")
    if family == socket.AF_INET:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{port_n}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{port_n}"


def decode_tcp_info(data: bytes) -> dict[str, int | None]:
    """The fields of :data:`_TCP_INFO_FIELDS` present in ``data`` (the kernel's length); the rest ``None``."""
    out: dict[str, int | None] = {}
    for name, offset, fmt in _TCP_INFO_FIELDS:
        size = struct.calcsize(fmt)
        out[name] = (
            struct.unpack_from("=" + fmt, data, offset)[0] if offset + size <= len(data) else None
        )
    return out


def _parse(buffer: bytes, family: int, inodes: set[int] | None, out: dict[int, TcpSession]) -> bool:
    """Decode one recv's netlink messages into ``out``; True once the dump is done."""
    offset = 0
    while offset + _NLMSG.size <= len(buffer):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(buffer, offset)
        if length < _NLMSG.size:
            return True
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", buffer, offset + _NLMSG.size)[0]
            raise OSError(code, f"sock_diag: {os.strerror(code)}")
        if kind == SOCK_DIAG_BY_FAMILY:
            body = offset + _NLMSG.size
            (
                msg_family,
                state,
                _t,
                _r,
                sport,
                dport,
                src,
                dst,
                _if,
                _cookie,
                _exp,
                _rq,
                _wq,
                _uid,
                inode,
            ) = _MSG.unpack_from(buffer, body)
            if inodes is None or inode in inodes:
                info: dict[str, int | None] = decode_tcp_info(b"")
                attr = body + _MSG.size
                while attr + _RTA.size <= offset + length:
                    rta_len, rta_type = _RTA.unpack_from(buffer, attr)
                    if rta_len < _RTA.size:
                        break
                    if rta_type == INET_DIAG_INFO:
                        info = decode_tcp_info(buffer[attr + _RTA.size : attr + rta_len])
                    attr += (rta_len + 3) & ~3
                info.pop("state", None)
                out[inode] = TcpSession(
                    inode=inode,
                    family="ipv4" if msg_family == socket.AF_INET else "ipv6",
                    local=_address(msg_family, src, sport),
                    remote=_address(msg_family, dst, dport),
                    state=TCP_STATES.get(state, str(state)),
                    sockid=buffer[body + 4 : body + 52],
                    **info,
                )
        offset += (length + 3) & ~3
    return False


def dump_tcp(
    sock: socket.socket | None = None, inodes: set[int] | None = None
) -> dict[int, TcpSession]:
    """Every TCP socket (IPv4 and IPv6) with a peer in the netlink socket's namespace, by inode; ``inodes`` filters."""
    own = sock is None
    if own:
        sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
        )
    out: dict[int, TcpSession] = {}
    try:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            request = _REQ.pack(
                family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, _STATES, b""
            )
            sock.send(
                _NLMSG.pack(
                    _NLMSG.size + len(request),
                    SOCK_DIAG_BY_FAMILY,
                    NLM_F_REQUEST | NLM_F_DUMP,
                    seq,
                    0,
                )
                + request
            )
            try:
                while not _parse(sock.recv(1 << 16), family, inodes, out):
                    pass
            except OSError as exc:
                if family == socket.AF_INET6 and exc.errno in (errno.ENOENT, errno.EAFNOSUPPORT):
                    continue  # IPv6 disabled on this host (ipv6.disable=1): no IPv6 sockets to list
                raise
    finally:
        if own:
            sock.close()
    return out


def lookup_tcp(sock: socket.socket, known: TcpSession) -> TcpSession | None:
    """The socket ``known`` (from a dump) as it is now; ``None`` once it is gone (its tuple or
    cookie no longer match)."""
    family = socket.AF_INET if known.family == "ipv4" else socket.AF_INET6
    request = _REQ.pack(
        family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, _STATES, known.sockid
    )
    sock.send(
        _NLMSG.pack(_NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 0, 0) + request
    )
    out: dict[int, TcpSession] = {}
    try:
        _parse(sock.recv(1 << 16), family, {known.inode}, out)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESTALE):
            return None
        raise
    return out.get(known.inode)


_libc = ctypes.CDLL(None, use_errno=True)


def netlink_socket_in(pid: int, proc_root: str = "/proc") -> socket.socket:
    """A sock_diag socket created inside ``pid``'s network namespace (raises OSError: no CAP_SYS_ADMIN, pid gone)."""
    result: dict[str, object] = {}

    def enter() -> None:
        # setns(CLONE_NEWNET) changes this thread only; it ends right after, switched back or not.
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                target = os.open(f"{proc_root}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if _libc.setns(target, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(
                            err,
                            f"setns into the network namespace of pid {pid}: {os.strerror(err)}",
                        )
                finally:
                    os.close(target)
                try:
                    result["sock"] = socket.socket(
                        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
                    )
                finally:
                    _libc.setns(home, CLONE_NEWNET)
            finally:
                os.close(home)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=enter, name="gpuguard-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


ABSENT_RECHECK_S = (
    60.0  # a TCP socket no dump listed (unconnected, listening) is looked for again after this
)


class TcpSessionReader:
    """tcp_info of the TCP sockets of given pids, by (pid, fd), remembering each socket's identity between reads."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._known: dict[tuple[int | None, int], TcpSession] = {}  # (netns, inode) -> latest
        self._absent: dict[
            tuple[int | None, int], float
        ] = {}  # (netns, inode) -> when to look again
        self.dumps = self.lookups = 0

    def read(self, pids) -> SessionDump:
        dump = SessionDump()
        home = netns_of("thread-self", self.proc_root)
        by_netns: dict[int | None, list[tuple[int, dict[int, int]]]] = {}
        for pid in pids:
            fds = socket_fds(pid, self.proc_root, TCP_PROTOCOLS)
            if fds:
                by_netns.setdefault(netns_of(pid, self.proc_root), []).append((pid, fds))
        known: dict[tuple[int | None, int], TcpSession] = {}
        absent: dict[tuple[int | None, int], float] = {}
        now = time.monotonic()
        for netns, members in by_netns.items():
            wanted = {inode for _pid, fds in members for inode in fds}
            try:
                sock = (
                    socket.socket(
                        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
                    )
                    if netns is None or netns == home
                    else netlink_socket_in(members[0][0], self.proc_root)
                )
                try:
                    found = self._read_netns(sock, netns, wanted, now, absent)
                finally:
                    sock.close()
            except OSError as exc:
                dump.unreadable.append(
                    f"TCP counters of pids {', '.join(str(p) for p, _ in members)} "
                    f"(network namespace {netns}): {exc.strerror or exc}"
                )
                continue
            for pid, fds in members:
                for inode, fd in fds.items():
                    if inode in found:
                        dump.sessions[(pid, fd)] = known[(netns, inode)] = found[inode]
        self._known, self._absent = known, absent  # bounded by the sockets held now
        return dump

    def _read_netns(
        self, sock, netns, wanted: set[int], now: float, absent: dict
    ) -> dict[int, TcpSession]:
        found: dict[int, TcpSession] = {}
        unknown = set()
        for inode in wanted:
            key = (netns, inode)
            if key in self._known:
                self.lookups += 1
                session = lookup_tcp(sock, self._known[key])
                if session is not None:
                    found[inode] = session
            elif self._absent.get(key, 0.0) > now:
                absent[key] = self._absent[key]
            else:
                unknown.add(inode)
        if unknown:
            self.dumps += 1
            listed = dump_tcp(sock, unknown)
            found.update(listed)
            absent.update(
                {(netns, inode): now + ABSENT_RECHECK_S for inode in unknown - listed.keys()}
            )
        return found


def read_sessions(pids, proc_root: str = "/proc") -> SessionDump:
    """tcp_info of every TCP socket the pids hold, by (pid, fd), read once (a dump per network namespace)."""
    return TcpSessionReader(proc_root).read(pids)
