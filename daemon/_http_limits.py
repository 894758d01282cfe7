"""What the HTTP endpoint lets in, and how often it says so (X7, X8): bookkeeping, no I/O.

Theory of operation: every connection the endpoint accepts takes a *pending* slot before
anything is known of it; the slot is held while its peer's uid is looked up (sock_diag takes
microseconds; the /proc fallback a worker thread) and while a refusal it is owed is being sent.
Past `httpMaxPendingLookups` pending, a connection is closed as soon as it is accepted, so a
flood of connections costs an accept and a close each, never a task that waits.

Once the peer is known (`Peer`: its uid on loopback, its address from a remote host with
`--http-allow-remote`), `Admission.identified` decides: another uid's connection, or one whose
uid the kernel did not tell, is closed before a byte is read; the owner's is served while fewer
than `httpMaxConnections` are open in all and fewer than `httpMaxConnectionsPerUid` from that
peer, else answered 503 or 429. `BodyBudget` bounds the bytes of request bodies being read at
once (`httpMaxPendingBodyBytes`).

Refusals are logged through `mcpool.pool._peercred.RefusalTally` (one line a minute per kind
and peer, with a count: every refusal its own line was a log flood an attacker controlled).
`heap_trimmer` hands freed memory back to the system (glibc keeps a
process's freed heap; a thousand 20 KB messages freed leave it mapped).

All of it is plain `def`: under trio it cannot be interrupted, so it needs no lock.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from typing import NamedTuple


class Peer(NamedTuple):
    """Who is on the other end: a loopback peer's uid (None: the kernel did not say), or a
    remote peer's address (only with --http-allow-remote)."""

    uid: int | None
    address: str | None = None

    def describe(self, owner: int) -> str:
        if self.address is not None:
            return f"remote address {self.address}"
        if self.uid is None:
            return "a loopback peer whose uid the kernel did not tell (it closed first?)"
        return f"uid {self.uid}" + (" (the daemon's owner)" if self.uid == owner else "")


class Verdict(enum.Enum):
    SERVE = "serve"
    FOREIGN = "another local user"  # closed, unread and unanswered
    UNKNOWN = "no uid known"  # closed, unread and unanswered
    PENDING_FULL = "too many connections waiting for their peer's uid"  # closed at accept
    TOO_MANY = "too many HTTP connections"  # 503
    TOO_MANY_FROM_PEER = "too many HTTP connections from one uid"  # 429


# A verdict that is answered in HTTP before the connection closes, and the option it names.
ANSWERED: dict[Verdict, tuple[int, str]] = {
    Verdict.TOO_MANY: (503, "httpMaxConnections"),
    Verdict.TOO_MANY_FROM_PEER: (429, "httpMaxConnectionsPerUid"),
}


class Admission:
    """Connections pending (not yet served), open in all, and open per peer."""

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self.pending = 0
        self.open = 0
        self.by_peer: dict[Peer, int] = {}

    def arrive(self, max_pending: int) -> bool:
        """A connection was accepted: True when it may wait for its peer's uid."""
        if self.pending >= max_pending:
            return False
        self.pending += 1
        return True

    def identified(self, peer: Peer, *, max_open: int, max_per_peer: int) -> Verdict:
        """Its peer is known: serve it (then `left` when it ends) or refuse it. An answered
        refusal keeps its pending slot until `answered`; the others give it back now."""
        verdict = self._verdict(peer, max_open, max_per_peer)
        if verdict not in ANSWERED:
            self.pending -= 1
        if verdict is Verdict.SERVE:
            self.open += 1
            self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        return verdict

    def _verdict(self, peer: Peer, max_open: int, max_per_peer: int) -> Verdict:
        if peer.address is None and peer.uid is None:
            return Verdict.UNKNOWN
        if peer.address is None and peer.uid != self.owner:
            return Verdict.FOREIGN
        if self.open >= max_open:
            return Verdict.TOO_MANY
        if self.by_peer.get(peer, 0) >= max_per_peer:
            return Verdict.TOO_MANY_FROM_PEER
        return Verdict.SERVE

    def answered(self) -> None:
        """An answered refusal is over (sent, or given up on)."""
        self.pending -= 1

    def abandoned(self) -> None:
        """A pending connection ended before its peer was known (its task was cancelled)."""
        self.pending -= 1

    def left(self, peer: Peer) -> None:
        """A served connection ended."""
        self.open -= 1
        count = self.by_peer.get(peer, 0) - 1
        if count > 0:
            self.by_peer[peer] = count
        else:
            self.by_peer.pop(peer, None)


class BodyBudget:
    """Bytes of request bodies being read at once: reserved (a declared Content-Length whole,
    a chunked body as it comes), given back when the body has been read or refused. A body
    alone always fits (its own bound is maxMessageBytes, which may be set past the cap)."""

    def __init__(self) -> None:
        self.reserved = 0

    def reserve(self, size: int, cap: int, *, held: int = 0) -> bool:
        """`size` more bytes for a body that holds `held` already."""
        if self.reserved > held and self.reserved + size > cap:
            return False
        self.reserved += size
        return True

    def release(self, size: int) -> None:
        self.reserved -= size


def heap_trimmer() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` (gives the heap's free pages back to the system), or None where
    the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_heap() -> int:
        return int(trim(0))

    return trim_heap
