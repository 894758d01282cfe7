"""The owner of a loopback peer's socket (pool/_peercred.py), from the kernel."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from other_user import OtherUser

from mcpool.pool._peercred import (
    PeerUid,
    diag_answer_uid,
    diag_request,
    proc_peer_uid,
)


def _pair(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen(4)
    client = socket.create_connection(server.getsockname()[:2])
    conn, _ = server.accept()
    return server, client, conn


def test_the_uid_of_our_own_loopback_peer_is_ours_over_ipv4_and_ipv6() -> None:
    lookup = PeerUid()
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        server, client, conn = _pair(family, host)
        with server, client, conn:
            peer, local = conn.getpeername()[:2], conn.getsockname()[:2]
            assert lookup.lookup(peer, local) == os.getuid()
            assert proc_peer_uid(peer, local) == os.getuid()
    lookup.close()


def test_an_ipv4_peer_of_a_dual_stack_listener_is_found() -> None:
    server = socket.socket(socket.AF_INET6)
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.bind(("::", 0))
    server.listen(1)
    with server, socket.create_connection(("127.0.0.1", server.getsockname()[1])):
        conn, _ = server.accept()
        with conn:
            peer, local = conn.getpeername()[:2], conn.getsockname()[:2]
            assert peer[0].startswith("::ffff:")
            assert PeerUid().lookup(peer, local) == os.getuid()


def test_a_peer_that_already_closed_its_end_has_no_owner() -> None:
    """A closed client end lingers in TIME_WAIT or FIN_WAIT2 with uid 0 and no inode: it must
    not pass for root's (the tests run as root)."""
    server, client, conn = _pair(socket.AF_INET, "127.0.0.1")
    with server, conn:
        peer, local = conn.getpeername()[:2], conn.getsockname()[:2]
        client.close()
        deadline = time.monotonic() + 5
        lookup = PeerUid()
        while lookup.lookup(peer, local) is not None:
            assert time.monotonic() < deadline, "the closed end still reads as owned"
            time.sleep(0.01)
        assert proc_peer_uid(peer, local) is None


def test_a_connection_the_kernel_does_not_know_has_no_owner() -> None:
    assert PeerUid().lookup(("127.0.0.1", 1), ("127.0.0.1", 2)) is None


def test_an_answer_to_another_request_or_cut_short_reads_as_none() -> None:
    request, family = diag_request(7, ("127.0.0.1", 1000), ("127.0.0.1", 2000))
    assert family == socket.AF_INET
    assert diag_answer_uid(request, 8) is None  # not an answer to request 8
    assert diag_answer_uid(request[:10], 7) is None
    assert diag_answer_uid(b"", 7) is None


def test_another_users_connection_is_seen_as_theirs(other_user: OtherUser) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    script = other_user.script(
        "connect.py",
        "import socket, sys\n"
        f"s = socket.create_connection(('127.0.0.1', {port}))\n"
        "sys.stdin.read()\n",
    )
    proc = other_user.popen(["/usr/bin/python3", str(script)], stdin=subprocess.PIPE)
    try:
        server.settimeout(10)
        conn, _ = server.accept()
        with conn:
            peer, local = conn.getpeername()[:2], conn.getsockname()[:2]
            assert PeerUid().lookup(peer, local) == other_user.uid
            assert proc_peer_uid(peer, local) == other_user.uid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
        server.close()
