"""Who owns the other end of a loopback TCP connection (X7).

TCP has no SO_PEERCRED. The kernel still knows the owner of every socket, and tells it through
`sock_diag` netlink: one exact lookup by the connection's four-tuple (the client end, whose
source is the peer's address and whose destination is ours) answers with that socket's uid.
It is a hash lookup in the kernel, a few microseconds whatever the size of the TCP table, so it
can run on the event loop; /proc/net/tcp, read whole for every connection, grew with the table
(9.5 ms a read seen here, blocking every session) and is kept only as a fallback for a kernel
without sock_diag, run in a worker thread by `peer_uid_off_loop`.

`PeerUid.lookup` is the one entry point: synchronous, never blocking (the netlink socket is
non-blocking and its answer is already there when `sendto` returns), None when the kernel does
not know the socket (the peer already closed it) or sock_diag is unavailable.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
ALL_TCP_STATES = 0xFFFFFFFF

# nlmsghdr: len, type, flags, seq, pid
_NLMSG = struct.Struct("=IHHII")
# inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid:
# sport, dport (network order), src[4], dst[4] (network order), if, cookie[2]
_REQ = struct.Struct("=BBBxI")
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid,
# inode
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_UID = struct.Struct("=IIIII")
_SOCKID_SIZE = _SOCKID.size + _SOCKID_TAIL.size

# The largest answer one lookup gets: an inet_diag_msg with no attributes asked for, or an
# error message quoting our request.
_ANSWER_BYTES = 1024


_V4_MAPPED = bytes(10) + b"\xff\xff"


def _address(ip: str) -> tuple[int, bytes]:
    """An address's family and its 16 bytes as inet_diag takes them; an IPv4-mapped IPv6
    address is IPv4 (where the kernel keeps such a connection). `inet_pton`, not `ipaddress`:
    this runs for every connection a listener accepts, refused ones included."""
    if ":" not in ip:
        return socket.AF_INET, socket.inet_pton(socket.AF_INET, ip).ljust(16, b"\0")
    packed = socket.inet_pton(socket.AF_INET6, ip.partition("%")[0])
    if packed.startswith(_V4_MAPPED):
        return socket.AF_INET, packed[12:].ljust(16, b"\0")
    return socket.AF_INET6, packed


def diag_request(seq: int, peer: tuple[str, int], local: tuple[str, int]) -> tuple[bytes, int]:
    """The netlink request that looks up the client end of the connection `peer` -> `local`,
    and the address family it asks about. Raises OSError for what is not an IP address."""
    family, peer_packed = _address(peer[0])
    _, local_packed = _address(local[0])
    body = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, ALL_TCP_STATES)
        + _SOCKID.pack(peer[1], local[1], peer_packed, local_packed)
        + _SOCKID_TAIL.pack(0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    )
    head = _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0)
    return head + body, family


def diag_answer_uid(data: bytes, seq: int) -> int | None:
    """The uid in a sock_diag answer to request `seq`; None for an error (no such socket), an
    answer that is not ours or is cut short, or a socket no process holds any more (inode 0):
    the kernel reports a closed end lingering in TIME_WAIT or FIN_WAIT2 with uid 0, which would
    pass for root's."""
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, kind, _flags, got_seq, _pid = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size or offset + length > len(data):
            return None
        if got_seq == seq:
            if kind == NLMSG_ERROR:
                return None
            if kind == SOCK_DIAG_BY_FAMILY:
                body = offset + _NLMSG.size
                uid_at = body + _MSG_HEAD.size + _SOCKID_SIZE
                if uid_at + _MSG_UID.size > offset + length:
                    return None
                _expires, _rqueue, _wqueue, uid, inode = _MSG_UID.unpack_from(data, uid_at)
                return int(uid) if inode else None
        offset += (length + 3) & ~3
    return None


class PeerUid:
    """Looks up loopback peers' uids over one netlink socket, opened on first use."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0
        self.available = True  # False once the kernel refused sock_diag: use the fallback

    def lookup(self, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
        """The uid owning the client end of the loopback connection `peer` -> `local`."""
        if not self.available:
            return None
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        try:
            request, _family = diag_request(self._seq, peer, local)
        except (OSError, ValueError):  # not an IP address
            return None
        try:
            sock = self._socket()
            sock.send(request)
            for _ in range(4):  # a stale answer of an earlier lookup may come first
                try:
                    data = sock.recv(_ANSWER_BYTES)
                except BlockingIOError:
                    return None
                uid = diag_answer_uid(data, self._seq)
                if uid is not None:
                    return uid
                if _is_answer_to(data, self._seq):
                    return None
            return None
        except OSError as exc:
            if exc.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT, errno.ENOENT):
                self.available = False
            self.close()
            return None

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
            sock.setblocking(False)
            sock.bind((0, 0))
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _is_answer_to(data: bytes, seq: int) -> bool:
    if len(data) < _NLMSG.size:
        return False
    return bool(_NLMSG.unpack_from(data, 0)[3] == seq)


def _proc_address(ip: str, port: int) -> str:
    """An address as /proc/net/tcp{,6} prints it: native-endian 32-bit words, then the port."""
    addr = ipaddress.ip_address(ip)
    if addr.version == 4:
        words = struct.unpack("=I", addr.packed)
        return f"{words[0]:08X}:{port:04X}"
    words = struct.unpack("=4I", addr.packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def proc_peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The same answer from /proc/net/tcp{,6}, read whole: slow, for a worker thread only."""
    want_local = _proc_address(peer[0], peer[1])
    want_remote = _proc_address(local[0], local[1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for row in f:
                    fields = row.split()
                    if len(fields) > 9 and fields[1] == want_local and fields[2] == want_remote:
                        # inode 0: a closed end lingering (TIME_WAIT): its uid 0 is nobody's
                        return int(fields[7]) if fields[9] != "0" else None
        except OSError:
            continue
    return None


_SHARED = PeerUid()


async def peer_uid_off_loop(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The loopback peer's uid without costing the loop: sock_diag where the kernel has it, else
    the /proc table in a worker thread (the caller bounds how many wait for one)."""
    if _SHARED.available:
        uid = _SHARED.lookup(peer, local)
        if uid is not None or _SHARED.available:
            return uid
    return await trio.to_thread.run_sync(proc_peer_uid, peer, local, abandon_on_cancel=True)


# Refusals are logged at most this often per kind and peer: a peer that churns connections must
# not fill the log (or cost a write per connection).
REFUSAL_LOG_PERIOD = 60.0
# Refusal kinds kept apart at most; past it, the rest are counted under one key (a remote
# host can come from many addresses, and the tally must stay small).
MAX_TALLIES = 256


Kind = TypeVar("Kind", bound=Hashable)
PeerKey = TypeVar("PeerKey", bound=Hashable)


@dataclass(frozen=True)
class TallyLine(Generic[Kind, PeerKey]):
    """A refusal line to log: its kind, its peer, how many since the last line."""

    kind: Kind
    peer: PeerKey | None
    times: int
    first: bool


class _Window:
    __slots__ = ("count", "until")

    def __init__(self, until: float) -> None:
        self.until = until
        self.count = 0  # refusals since the window's line (not yet logged)


class RefusalTally(Generic[Kind, PeerKey]):
    """Which refusals to log, for every listener that refuses peers (the HTTP endpoint, the
    OAuth redirect listener): one line per (kind, peer) per `period`, the first refusal at
    once, then the count, whatever the rate. Pure: the caller passes the time and writes the
    line."""

    def __init__(self, period: float = REFUSAL_LOG_PERIOD) -> None:
        self.period = period
        self.total = 0
        self._windows: dict[tuple[Kind, PeerKey | None], _Window] = {}

    def refused(
        self, kind: Kind, peer: PeerKey | None, now: float
    ) -> TallyLine[Kind, PeerKey] | None:
        """Count one refusal of `kind` from `peer` (a uid, an address...); the line to log now,
        if one is due."""
        self.total += 1
        key: tuple[Kind, PeerKey | None] = (kind, peer)
        window = self._windows.get(key)
        if window is None and len(self._windows) >= MAX_TALLIES:
            key = (kind, None)  # too many peers to tell apart: counted together
            window = self._windows.get(key)
        if window is None or now >= window.until:
            count = 1 + (window.count if window is not None else 0)
            self._windows[key] = _Window(now + self.period)
            return TallyLine(kind, key[1], count, first=window is None)
        window.count += 1
        return None

    def due(self, now: float) -> list[TallyLine[Kind, PeerKey]]:
        """The counts of the windows that ended; a window with nothing more is forgotten."""
        lines = []
        for key, window in list(self._windows.items()):
            if now >= window.until:
                del self._windows[key]
                if window.count:
                    lines.append(TallyLine(key[0], key[1], window.count, first=False))
        return lines

    def flush(self) -> list[TallyLine[Kind, PeerKey]]:
        """Every count not yet logged (the endpoint is stopping)."""
        lines = [
            TallyLine(kind, peer, window.count, first=False)
            for (kind, peer), window in self._windows.items()
            if window.count
        ]
        self._windows.clear()
        return lines
