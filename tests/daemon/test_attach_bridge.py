"""The real `python -m mcpool attach` driven against a fake daemon (a Unix socket server thread)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpool.daemon import _attach, _detach

# Every wait in these tests is bounded by this; a healthy run takes milliseconds.
WAIT = 10.0

ATTACH_RESULT = {"session": "s-1", "daemonPid": 4242, "version": "0.1.0"}


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


class FakeDaemon:
    """Answers the first line of each connection with `handler(conn, first_line_bytes)`. The
    fds that came with that line (a hand-off) are in `self.handed`."""

    def __init__(self, path: Path, handler: Callable[[socket.socket, bytes], None]) -> None:
        self.path = path
        self.handler = handler
        self.attach_requests: list[dict[str, object]] = []
        self.handed: list[int] = []
        self.offered = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.listener.settimeout(WAIT)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(WAIT)
            # The first bytes with recvmsg, as the daemon reads them: fds come with them.
            data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 4)
            self.offered = len(fds)
            if getattr(self.handler, "takes_handoff", False):
                self.handed.extend(fds)
            else:
                for fd in fds:  # declined, as the daemon does: the client's pipes are not ours
                    os.close(fd)
            reader = _Prefixed(data, conn.makefile("rb"))
            first = reader.readline()
            self.attach_requests.append(json.loads(first))
            # The bridge going away mid-conversation is some tests' point, not a fake's failure.
            with contextlib.suppress(OSError):
                self.handler(conn, reader)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(WAIT)


class _Prefixed:
    """A line reader over `prefix` then `rest` (the bytes recvmsg took, then the socket)."""

    def __init__(self, prefix: bytes, rest: Any) -> None:
        self.buf = prefix
        self.rest = rest

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            more = self.rest.readline()
            if not more:
                break
            self.buf += more
        line, sep, self.buf = self.buf.partition(b"\n")
        return line + sep

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


def echo_after(extra: bytes = b"", goodbye: bytes = b"") -> Callable[[socket.socket, object], None]:
    """Attach result (with `extra` in the same send), echo lines until EOF, then `goodbye`."""

    def handler(conn: socket.socket, reader: object) -> None:
        conn.sendall(_line({"jsonrpc": "2.0", "id": 0, "result": ATTACH_RESULT}) + extra)
        for line in reader:
            conn.sendall(line)
        conn.sendall(goodbye)

    return handler


@pytest.fixture
def daemon_factory(sock_dir: Path) -> Iterator[Callable[..., FakeDaemon]]:
    made: list[FakeDaemon] = []

    def make(handler: Callable[[socket.socket, object], None]) -> FakeDaemon:
        fake = FakeDaemon(sock_dir / "daemon.sock", handler)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()


def start_attach(sock: Path, cwd: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, XDG_CONFIG_HOME=str(cwd / "config"), XDG_STATE_HOME=str(cwd / "state"))
    env.pop("MCPOOL_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "mcpool", "attach", "--socket", str(sock), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
    )


def echoed_ping(proc: subprocess.Popen[bytes]) -> bool:
    """Write a ping line to the bridge's stdin; whether the same line comes back on stdout."""
    assert proc.stdin is not None
    msg = _line({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    proc.stdin.write(msg)
    proc.stdin.flush()
    return read_line(proc) == msg


def read_line(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()))
    reader.start()
    reader.join(WAIT)
    assert result, "no line from mcpool attach in time"
    return result[0]


def test_relays_both_ways_and_keeps_bytes_sent_behind_the_response(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    hello = _line({"jsonrpc": "2.0", "method": "notifications/hello"})
    fake = daemon_factory(echo_after(extra=hello))
    (sock_dir / ".mcp.json").write_text("{}")
    proc = start_attach(fake.path, sock_dir, "--name", "proj")
    assert proc.stdin is not None
    assert read_line(proc) == hello
    for i in range(3):
        msg = _line({"jsonrpc": "2.0", "id": i, "method": "ping"})
        proc.stdin.write(msg)
        proc.stdin.flush()
        assert read_line(proc) == msg
    out, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, out, err) == (0, b"", b"")

    (request,) = fake.attach_requests
    assert request["method"] == "mcpool/attach"
    assert request["params"] == {
        "sources": [str(sock_dir / "config/mcpool/config.json"), str(sock_dir / ".mcp.json")],
        "cwd": str(sock_dir),
        "name": "proj",
        "clientPid": os.getpid(),
        # Its stdio are pipes, so it offered them; this fake declined, so it relayed (above).
        "handoff": True,
    }


def test_settings_replace_default_sources_and_name_defaults_to_cwd(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    fake = daemon_factory(echo_after())
    work = sock_dir / "myproject"
    work.mkdir()
    proc = start_attach(fake.path, work, "--settings", "a.json", "--settings=/etc/b.json")
    proc.communicate(timeout=WAIT)
    assert proc.returncode == 0
    params = fake.attach_requests[0]["params"]
    assert isinstance(params, dict)
    assert params["sources"] == [str(work / "a.json"), "/etc/b.json"]
    assert params["name"] == "myproject"


def test_stdin_eof_half_closes_and_relays_until_the_daemon_closes(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    goodbye = _line({"jsonrpc": "2.0", "method": "bye"})
    fake = daemon_factory(echo_after(goodbye=goodbye))
    proc = start_attach(fake.path, sock_dir)
    msg = _line({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    out, err = proc.communicate(msg, timeout=WAIT)
    assert (proc.returncode, out, err) == (0, msg + goodbye, b"")


def test_error_response_exits_1_with_the_message_and_reason(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    def refuse(conn: socket.socket, reader: object) -> None:
        error = {"code": -31001, "message": "bad settings", "data": "x.json: not JSON"}
        conn.sendall(_line({"jsonrpc": "2.0", "id": 0, "error": error}))

    fake = daemon_factory(refuse)
    proc = start_attach(fake.path, sock_dir)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 1
    assert out == b""
    assert err == b"mcpool attach: bad settings (x.json: not JSON)\n"


def test_daemon_going_away_exits_1_with_one_stderr_line(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    def answer_once(conn: socket.socket, reader: object) -> None:
        conn.sendall(_line({"jsonrpc": "2.0", "id": 0, "result": ATTACH_RESULT}))
        conn.sendall(reader.readline())

    fake = daemon_factory(answer_once)
    proc = start_attach(fake.path, sock_dir)
    assert echoed_ping(proc)
    assert proc.wait(WAIT) == 1  # stdin is still open
    assert proc.stderr is not None
    assert proc.stderr.read() == b"mcpool attach: the daemon closed the connection\n"
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()


def test_sigterm_exits_143_without_a_traceback(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    fake = daemon_factory(echo_after())
    proc = start_attach(fake.path, sock_dir)
    assert proc.stdin is not None
    assert echoed_ping(proc)  # relaying, so the handlers are installed
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, err) == (143, b"")


def test_large_messages_flow_both_ways_at_once(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    fake = daemon_factory(echo_after())
    proc = start_attach(fake.path, sock_dir)
    # Several MiB, more than the relay's buffers plus the kernel's: only backpressure keeps it
    # correct, and a blocking write in the wrong direction would deadlock.
    payload = b"".join(_line({"id": i, "blob": "x" * 5000 + str(i)}) for i in range(1000))
    out, err = proc.communicate(payload, timeout=WAIT * 3)
    assert proc.returncode == 0, err
    assert out == payload


def test_usage_errors_exit_2() -> None:
    for args in (["attach", "--bogus"], ["attach", "--socket"], ["nonsense"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "mcpool", *args], capture_output=True, timeout=WAIT, check=False
        )
        assert proc.returncode == 2, args
        assert b"usage:" in proc.stderr
        assert proc.stdout == b""


def test_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mcpool", "--version"], capture_output=True, timeout=WAIT, check=True
    )
    assert proc.stdout.startswith(b"mcpool ")


class FakeStart:
    """A start whose status pipe says `line` (None: nothing yet) after `after` seconds."""

    def __init__(self, line: bytes | None, after: float = 0.0) -> None:
        self.line = line
        self.ready_at = time.monotonic() + after
        self.waits = 0
        self.closed = False

    def wait(self, timeout: float) -> _detach.StartOutcome | None:
        self.waits += 1
        if self.line is None or time.monotonic() < self.ready_at:
            time.sleep(min(timeout, max(0.0, self.ready_at - time.monotonic())))
            if self.line is None or time.monotonic() < self.ready_at:
                return None
        return _detach.parse_status(self.line) or _detach.StartOutcome(None, None, "killed")

    def close(self) -> None:
        self.closed = True


def test_cold_start_spawns_once_and_waits_for_the_daemon_to_say_it_serves(
    sock_dir: Path,
) -> None:
    path = sock_dir / "daemon.sock"
    spawned: list[Path] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    start = FakeStart(b"serving 4242", after=0.1)

    def spawn(p: Path) -> FakeStart:
        spawned.append(p)

        def come_up() -> None:
            time.sleep(0.1)  # the daemon importing trio and loading settings
            listener.bind(str(p))
            listener.listen()

        threading.Thread(target=come_up, daemon=True).start()
        return start

    with listener:
        sock, started = _attach.connect_or_start(path, spawn, timeout=WAIT)
        sock.close()
    assert spawned == [path]
    assert started is start and start.closed
    # One wait on the status pipe until it spoke, not a connect loop.
    assert start.waits <= 2


def test_cold_start_keeps_retrying_after_losing_the_race_and_fails_fast_on_a_crash(
    sock_dir: Path,
) -> None:
    path = sock_dir / "daemon.sock"
    # A loser exits 0: keep waiting for the winner, up to the (here tiny) timeout.
    with pytest.raises(_attach.AttachError, match="no daemon answered"):
        _attach.connect_or_start(path, lambda p: FakeStart(b"exit 0 lost"), timeout=0.05)
    began = time.monotonic()
    with pytest.raises(
        _attach.AttachError, match=r"failed to start \(exit status 1: no folder\); see "
    ):
        _attach.connect_or_start(path, lambda p: FakeStart(b"exit 1 no folder"), timeout=WAIT)
    # At once, not after the start timeout: the status pipe said it.
    assert time.monotonic() - began < WAIT / 2
    # Its pipe closed without a word: the reason found instead, still at once.
    with pytest.raises(_attach.AttachError, match=r"exited before serving .*: killed\)"):
        _attach.connect_or_start(path, lambda p: FakeStart(b""), timeout=WAIT)
    assert time.monotonic() - began < WAIT / 2
    # Still starting when the time is up.
    with pytest.raises(_attach.AttachError, match="no daemon answered"):
        _attach.connect_or_start(path, lambda p: FakeStart(None), timeout=0.05)


def test_broken_stdout_exits_0_quietly(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    fake = daemon_factory(echo_after())
    proc = start_attach(fake.path, sock_dir)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # the client stops reading; the echo below then has nowhere to go
    proc.stdin.write(_line({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
    proc.stdin.flush()
    assert proc.wait(WAIT) == 0
    assert proc.stderr.read() == b""
    proc.stdin.close()
    proc.stderr.close()


def handing_off_daemon(
    daemon_factory: Callable[..., FakeDaemon], ended: dict[str, object] | None
) -> FakeDaemon:
    """A fake daemon that accepts the hand-off: it echoes lines from the handed stdin to the
    handed stdout until EOF, then closes them and sends `ended` (None: just closes)."""
    fake: list[FakeDaemon] = []

    def handler(conn: socket.socket, reader: Any) -> None:
        stdin_fd, stdout_fd = fake[0].handed
        conn.sendall(
            _line({"jsonrpc": "2.0", "id": 0, "result": {**ATTACH_RESULT, "handoff": True}})
        )
        with os.fdopen(stdin_fd, "rb") as stdin, os.fdopen(stdout_fd, "wb") as stdout:
            for line in stdin:
                stdout.write(line)  # echo
                stdout.flush()
        if ended is not None:
            conn.sendall(_line({"jsonrpc": "2.0", "method": "mcpool/ended", "params": ended}))

    handler.takes_handoff = True  # type: ignore[attr-defined]
    fake.append(daemon_factory(handler))
    return fake[0]


def test_hand_off_gives_the_daemon_stdio_and_exits_0_when_the_client_closed(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon]
) -> None:
    fake = handing_off_daemon(
        daemon_factory, {"reason": "the client disconnected", "clientClosed": True}
    )
    proc = start_attach(fake.path, sock_dir)
    # The fake echoes on the fds it was handed: the bridge itself relays nothing.
    assert echoed_ping(proc)
    out, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, out, err) == (0, b"", b"")
    assert fake.attach_requests[0]["params"]["handoff"] is True  # type: ignore[index]


@pytest.mark.parametrize(
    ("ended", "stderr"),
    [
        (
            {"reason": "the daemon is shutting down", "clientClosed": False},
            b"mcpool attach: the daemon is shutting down\n",
        ),
        (None, b"mcpool attach: the daemon closed the connection\n"),  # gone without a word
    ],
)
def test_hand_off_ended_by_the_daemon_exits_1_with_one_line(
    sock_dir: Path,
    daemon_factory: Callable[..., FakeDaemon],
    ended: dict[str, object] | None,
    stderr: bytes,
) -> None:
    fake = handing_off_daemon(daemon_factory, ended)
    proc = start_attach(fake.path, sock_dir)
    _out, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, err) == (1, stderr)


@pytest.mark.parametrize("why", ["env", "file"])
def test_no_hand_off_for_a_file_on_stdin_or_when_relay_is_asked_for(
    sock_dir: Path, daemon_factory: Callable[..., FakeDaemon], why: str
) -> None:
    fake = daemon_factory(echo_after())
    msg = _line({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    requests = sock_dir / "requests.jsonl"
    requests.write_bytes(msg)
    env = dict(os.environ, XDG_CONFIG_HOME=str(sock_dir / "config"))
    if why == "env":
        env["MCPOOL_ATTACH_RELAY"] = "1"
    argv = [sys.executable, "-m", "mcpool", "attach", "--socket", str(fake.path)]
    with open(requests, "rb") as stdin:
        if why == "file":
            done = subprocess.run(
                argv, stdin=stdin, capture_output=True, cwd=sock_dir, env=env, timeout=WAIT
            )
        else:
            done = subprocess.run(
                argv, input=msg, capture_output=True, cwd=sock_dir, env=env, timeout=WAIT
            )
    assert (done.returncode, done.stdout) == (0, msg)
    assert "handoff" not in fake.attach_requests[0]["params"]  # type: ignore[operator]
    assert fake.offered == 0
