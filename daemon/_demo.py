"""`mcpool demo`: mcpool in one command, on a private daemon, leaving nothing behind.

It starts a daemon on a socket in a fresh temporary folder (its config, state and log live there
too: nothing is written to the user's config or state), attaches three sessions to the example
notes server (`_example_server.py`) through real `mcpool attach` processes, each with its own
policy, and shows what each sees, the one upstream process they share, and a warm attach next to
a cold start of the same server. Everything it started is stopped and the folder removed, also
on Ctrl-C or failure.

The MCP client here is a few lines of stdlib JSON-RPC over pipes: the SDK is a test dependency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from mcpool.daemon._setup import mcpool_command

EXAMPLE_SERVER = Path(__file__).with_name("_example_server.py")
# A cold daemon imports trio and msgspec; a first run also compiles .pyc files.
DAEMON_START_TIMEOUT = 15.0
# One MCP request to the example server or through the daemon: milliseconds when healthy.
REQUEST_TIMEOUT = 10.0
# `mcpool/admin/stop` drains sessions and closes the upstream within the daemon's own graces.
STOP_TIMEOUT = 15.0
POLL_INTERVAL = 0.01

SESSIONS: list[tuple[str, dict[str, Any], str]] = [
    ("reader", {"includeTools": ["list_notes", "search_notes", "server_info"]}, "includeTools"),
    ("writer", {"excludeTools": ["delete_note"]}, "excludeTools"),
    ("admin", {"trust": True, "alwaysLoadTools": True}, "no filter, trusted"),
]


class DemoFailed(Exception):
    pass


class StdioPeer:
    """A child process spoken to with newline-delimited JSON-RPC over its stdin and stdout."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, stderr: TextIO) -> None:
        self.began = time.perf_counter()
        self.label = " ".join(os.path.basename(a) for a in argv[:3])
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=cwd
        )
        self._buffer = bytearray()
        self._next_id = 1

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        request_id = self._next_id
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        deadline = time.monotonic() + REQUEST_TIMEOUT
        while True:
            message = self._receive(deadline)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise DemoFailed(f"{method}: {message['error'].get('message')}")
                return message.get("result")

    def notify(self, method: str) -> None:
        self._send({"jsonrpc": "2.0", "method": method})

    def initialize(self) -> None:
        self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "mcpool-demo", "version": "1"},
            },
        )
        self.notify("notifications/initialized")

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def _receive(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while (end := self._buffer.find(b"\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise DemoFailed(f"no answer from {self.label} in {REQUEST_TIMEOUT:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise DemoFailed(f"{self.label} exited ({self.proc.poll()})")
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        message = json.loads(line)
        return message if isinstance(message, dict) else {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(REQUEST_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def admin(sock: Path, command: str, params: dict[str, Any] | None = None) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(REQUEST_TIMEOUT)
        s.connect(str(sock))
        request = {"jsonrpc": "2.0", "id": 1, "method": f"mcpool/admin/{command}"}
        s.sendall(json.dumps({**request, "params": params or {}}).encode() + b"\n")
        with s.makefile("rb") as reader:
            response = json.loads(reader.readline())
    if "error" in response:
        raise DemoFailed(f"daemon {command}: {response['error']}")
    return response["result"]


def socket_attach_ms(sock: Path, sources: list[str]) -> float:
    """A warm attach by a client on the socket itself: attach, initialize, tools/list."""
    began = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(REQUEST_TIMEOUT)
        s.connect(str(sock))
        messages = [
            {"method": "mcpool/attach", "params": {"sources": sources, "name": "probe"}},
            {
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "probe", "version": "1"},
                },
            },
        ]
        with s.makefile("rb") as reader:
            for n, message in enumerate(messages):
                s.sendall(json.dumps({"jsonrpc": "2.0", "id": n, **message}).encode() + b"\n")
                reader.readline()
            s.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            s.sendall(b'{"jsonrpc":"2.0","id":9,"method":"tools/list"}\n')
            while json.loads(reader.readline()).get("id") != 9:
                pass
    return (time.perf_counter() - began) * 1000


@contextlib.contextmanager
def private_daemon(
    root: Path, env: dict[str, str], log: TextIO
) -> Iterator[subprocess.Popen[bytes]]:
    sock = root / "daemon.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mcpool",
            "daemon",
            "--socket",
            str(sock),
            "--config",
            str(root / "config.json"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
        cwd=root,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise DemoFailed(f"the daemon exited with status {proc.returncode}")
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(sock))
                break
            if time.monotonic() > deadline:
                raise DemoFailed(f"the daemon did not listen within {DAEMON_START_TIMEOUT:g} s")
            time.sleep(POLL_INTERVAL)
        yield proc
    finally:
        _stop_daemon(sock, proc)


def _stop_daemon(sock: Path, proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(OSError, DemoFailed, ValueError):
            admin(sock, "stop")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT)
    # Whatever is left of the daemon's process group (it started its own session): gone.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT)


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def _mib(rss: int | None) -> str:
    return "?" if rss is None else f"{rss / (1 << 20):.1f} MiB"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcpool demo",
        description="Show mcpool sharing one server between three sessions, on a private "
        "daemon that is removed afterwards.",
    )
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    began = time.monotonic()
    # Not under $TMPDIR's possibly long path: an AF_UNIX path must fit in 107 bytes.
    root = Path(
        tempfile.mkdtemp(prefix="mcpool-demo-", dir="/tmp" if Path("/tmp").is_dir() else None)
    )
    try:
        return _demo(root, began)
    except DemoFailed as exc:
        sys.stderr.write(f"mcpool demo: {exc}\n")
        with contextlib.suppress(OSError):
            sys.stderr.write((root / "daemon.stderr").read_text()[-2000:])
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _demo(root: Path, began: float) -> int:
    from mcpool.daemon._ctl import progress

    out = sys.stdout
    sock = root / "daemon.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")}
    env.update(
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
        # The snapshot cache too: the demo leaves nothing behind in the user's folders.
        XDG_CACHE_HOME=str(root / "cache"),
        MCPOOL_SOCKET=str(sock),
        MCPOOL_CONFIG=str(root / "config.json"),
    )
    server = {"command": sys.executable, "args": [str(EXAMPLE_SERVER)]}
    # The demo shows sharing: its first list waits for the example server however slow the
    # machine (REQUEST_TIMEOUT), instead of the startup budget a client gets.
    daemon_options = {"startupBudget": REQUEST_TIMEOUT}
    (root / "config.json").write_text(json.dumps({"mcpServers": {}, "daemon": daemon_options}))
    files = {}
    for name, policy, _ in SESSIONS:
        files[name] = root / f"{name}.json"
        files[name].write_text(json.dumps({"mcpServers": {"notes": {**server, **policy}}}))

    out.write("mcpool demo: one example server (notes), three sessions with different policies\n")
    out.write(f"private daemon on {sock}; removed when the demo ends\n\n")
    with open(root / "daemon.stderr", "w") as log, contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        with progress("starting a private mcpool daemon", False):
            daemon = stack.enter_context(private_daemon(root, env, log))
        out.write(
            f"daemon started (pid {daemon.pid}) in {_ms((time.perf_counter() - t0) * 1000)}\n"
        )

        # The same server without mcpool: what every editor window pays for every server.
        cold = StdioPeer([sys.executable, str(EXAMPLE_SERVER)], env, root, log)
        try:
            cold.initialize()
            cold.request("tools/list")
            cold_ms = (time.perf_counter() - cold.began) * 1000
        finally:
            cold.close()

        peers: dict[str, StdioPeer] = {}
        attach_ms: dict[str, float] = {}
        seen: dict[str, list[str]] = {}
        pids: dict[str, int] = {}
        command = mcpool_command()
        for name, _, _ in SESSIONS:
            argv = [*command, "attach", "--socket", str(sock), "--settings", str(files[name])]
            peer = StdioPeer([*argv, "--name", name], env, root, log)
            stack.callback(peer.close)
            peers[name] = peer
            with progress(f"attaching session {name}", False):
                peer.initialize()
                tools = peer.request("tools/list")["tools"]
            attach_ms[name] = (time.perf_counter() - peer.began) * 1000
            seen[name] = [t["name"] for t in tools]
            if "notes__server_info" in seen[name]:
                result = peer.request("tools/call", {"name": "notes__server_info"})
                pids[name] = json.loads(result["content"][0]["text"])["pid"]

        out.write("\nwhat each session sees (tools are exposed as <server>__<tool>):\n")
        for name, policy, label in SESSIONS:
            shown = ", ".join(t.removeprefix("notes__") for t in seen[name])
            out.write(f"  {name:<7} {label:<19} {shown}\n")
            out.write(f"  {'':<7} {'':<19} policy {json.dumps(policy)}\n")

        servers = admin(sock, "servers")
        sessions = admin(sock, "sessions")
        if len(servers) != 1:
            raise DemoFailed(f"expected one pooled server, the daemon has {len(servers)}")
        entry = servers[0]
        answered = sorted(set(pids.values()))
        out.write(
            f"\none upstream process for all {len(sessions)} sessions: pid {entry['pid']}, "
            f"{_mib(entry.get('rss'))}, entry {entry['id']}, refs {len(entry['refs'])}\n"
        )
        out.write(f"  server_info called from each session answered from pid {answered}\n")
        out.write("  without mcpool: one process per session per server\n")

        why = admin(sock, "explain", {"session": "reader", "name": "delete_note"})
        for match in why.get("matches") or []:
            out.write(
                f"\nwhy reader does not see delete_note: {match['rule']} "
                f"(server '{match['server']}' in {Path(match['source']).name}); "
                f"seen by {', '.join(o['name'] for o in match['seen_by']) or 'nobody'}\n"
            )

        warm_socket = socket_attach_ms(sock, [str(files["writer"])])
        first, *warm = (attach_ms[name] for name, _, _ in SESSIONS)
        out.write("\ntimings (start of the client process to its tools/list answer):\n")
        out.write(f"  cold start of the server itself      {_ms(cold_ms)}\n")
        out.write(f"  first attach (daemon spawns server)  {_ms(first)}\n")
        out.write(f"  warm attach via `mcpool attach`      {', '.join(_ms(w) for w in warm)}\n")
        out.write(f"  warm attach by a client on the socket {_ms(warm_socket)}\n")
        out.write(
            "  (the example server is a stdlib-only toy that starts fast; real servers take\n"
            "   0.4-1.7 s and 66-141 MiB each, which a warm attach does not pay)\n"
        )
        out.write("\ncleaning up: closing sessions, stopping the daemon\n")
    out.write(f"done in {time.monotonic() - began:.1f} s; nothing left running, nothing written\n")
    return 0
