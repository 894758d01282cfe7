"""The attached session's waiter (issue 14, point 4): after the hand-off `mcpool attach` execs
into a small shell that keeps the bridge's contract, in a fraction of the memory.

Each contract test runs twice: with the shell waiter, and with the Python one it replaces
(MCPOOL_ATTACH_WAITER=python), so both stay equivalent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mcpool.daemon._waiter import WAITER_ENV, WAITER_NAME

from .test_attach_bridge import ATTACH_RESULT, WAIT, FakeDaemon, start_attach

# The target for the bridge side of one attached session.
MAX_WAITER_USS = 1024 * 1024
# psutil sees the exec at an unpredictable moment; polled at this interval, bounded by WAIT.
POLL = 0.01


class ControlledDaemon:
    """A fake daemon that takes the hand-off, then does what the test says, when it says."""

    def __init__(self, path: Path) -> None:
        self.send: list[bytes] = []
        self.go = threading.Event()
        self.attached = threading.Event()
        self.let_go = threading.Event()  # close the client's stdio, keep the control socket
        self.peer_closed = threading.Event()

        def handler(conn: socket.socket, reader: object) -> None:
            result = {**ATTACH_RESULT, "handoff": True}
            conn.sendall(json.dumps({"jsonrpc": "2.0", "id": 0, "result": result}).encode())
            conn.sendall(b"\n")
            handed = list(self.fake.handed)
            self.attached.set()
            conn.settimeout(POLL)
            deadline = time.monotonic() + WAIT
            while not self.go.is_set() and time.monotonic() < deadline:
                if self.let_go.is_set():
                    for fd in handed:
                        os.close(fd)
                    handed.clear()
                try:
                    data = conn.recv(1)
                except TimeoutError:
                    continue
                except OSError:
                    # ECONNRESET: the bridge died with bytes of ours unread (a signal while it
                    # still read the attach answer). Still its end, as the daemon reads it; an
                    # escape here kept the client's pipes open, and the test waited for EOF.
                    data = b""
                if data == b"":
                    self.peer_closed.set()  # as the daemon: the session ends
                    break
            for fd in handed:
                os.close(fd)  # the daemon lets go of the client's stdio first
            for data in self.send if self.go.is_set() else []:
                conn.sendall(data)

        handler.takes_handoff = True  # type: ignore[attr-defined]
        self.fake = FakeDaemon(path, handler)

    def finish(self, *lines: bytes) -> None:
        self.send = list(lines)
        self.go.set()


@pytest.fixture
def controlled(sock_dir: Path) -> Iterator[ControlledDaemon]:
    daemon = ControlledDaemon(sock_dir / "daemon.sock")
    yield daemon
    daemon.go.set()
    daemon.fake.close()


@pytest.fixture(params=["shell", "python"])
def waiter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setenv(WAITER_ENV, "python")
    else:
        monkeypatch.delenv(WAITER_ENV, raising=False)
    return str(request.param)


def _ended(reason: str | None, client_closed: bool, *, compact: bool = True) -> bytes:
    params: dict[str, object] = {"reason": reason, "clientClosed": client_closed}
    message = {"jsonrpc": "2.0", "method": "mcpool/ended", "params": params}
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(message, separators=separators).encode() + b"\n"


def _trapping(pid: int) -> bool:
    """The shell waiter runs and has installed its SIGINT and SIGTERM traps (a signal before
    that is the default death: the session still ends, but not with 130/143)."""
    if psutil.Process(pid).cmdline()[:1] != [WAITER_NAME]:
        return False
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    caught = int(fields["SigCgt"], 16)
    return all(caught & (1 << (signum - 1)) for signum in (signal.SIGINT, signal.SIGTERM))


def _waiting(proc: subprocess.Popen[bytes], waiter: str, controlled: ControlledDaemon) -> None:
    """Until the bridge has handed off (and, for the shell, exec'd into the waiter)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if controlled.attached.is_set() and (waiter == "python" or _trapping(proc.pid)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(POLL)
    raise AssertionError("the bridge never became the waiter")


@pytest.mark.parametrize(
    ("lines", "status", "stderr"),
    [
        ([_ended("the client disconnected", True)], 0, b""),
        ([_ended("the client disconnected", True, compact=False)], 0, b""),
        (
            [b'{"jsonrpc":"2.0","method":"notifications/other"}\n', _ended("shut down", False)],
            1,
            b"mcpool attach: shut down\n",
        ),
        (
            [_ended('server "x" \\ said\tno', False, compact=False)],
            1,
            b'mcpool attach: server "x" \\ said\tno\n',
        ),
        ([_ended(None, False)], 1, b"mcpool attach: the daemon ended the session\n"),
        ([], 1, b"mcpool attach: the daemon closed the connection\n"),
        ([b'{"jsonrpc":"2.0","method":"mcpool/ended"'], 1, b"mcpool attach: "),
    ],
)
def test_the_waiter_exits_as_the_bridge_always_did(
    sock_dir: Path,
    controlled: ControlledDaemon,
    waiter: str,
    lines: list[bytes],
    status: int,
    stderr: bytes,
) -> None:
    proc = start_attach(controlled.fake.path, sock_dir)
    _waiting(proc, waiter, controlled)
    controlled.finish(*lines)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == status
    assert out == b""
    if stderr.endswith(b": "):  # a cut-off line: some one-line reason, no traceback
        assert err.startswith(stderr) and err.count(b"\n") == 1, err
    else:
        assert err == stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_waiter_exits_128_plus_the_signal_quietly_and_the_session_ends(
    sock_dir: Path, controlled: ControlledDaemon, waiter: str, signum: int, status: int
) -> None:
    proc = start_attach(controlled.fake.path, sock_dir)
    _waiting(proc, waiter, controlled)
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, err) == (status, b"")
    assert controlled.peer_closed.wait(WAIT)


def test_killing_the_waiter_closes_the_control_socket(
    sock_dir: Path, controlled: ControlledDaemon, waiter: str
) -> None:
    proc = start_attach(controlled.fake.path, sock_dir)
    _waiting(proc, waiter, controlled)
    proc.kill()
    proc.communicate(timeout=WAIT)
    # The daemon watches this socket: its end is the session's end.
    assert controlled.peer_closed.wait(WAIT)


def test_the_shell_waiter_is_small_and_holds_none_of_the_clients_stdio(
    sock_dir: Path, controlled: ControlledDaemon
) -> None:
    proc = start_attach(controlled.fake.path, sock_dir)
    _waiting(proc, "shell", controlled)
    waiter = psutil.Process(proc.pid)
    assert waiter.memory_full_info().uss <= MAX_WAITER_USS
    # Only the daemon holds the client's pipes now: when it lets go, the client sees EOF on
    # stdout while the waiter still waits for the `ended` line.
    controlled.let_go.set()
    assert proc.stdout is not None
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    reader.join(WAIT)
    assert got == [b""]
    assert proc.poll() is None
    controlled.finish(_ended("the client disconnected", True))
    assert proc.wait(WAIT) == 0
