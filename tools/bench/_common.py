"""Shared helpers for the benchmarks: a private daemon, raw newline-JSON clients, result files."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "bench" / "results"
FAKE = ROOT / "tools" / "fake_upstream.py"
START_TIMEOUT = 20.0  # a cold daemon plus a cold npx server stay well under this
LOOPBACK_JS = ROOT / "tools" / "bench" / "loopback.cjs"
# A fast upstream for throughput and latency: one thread, calls answered inline (fake_upstream.py).
FAST = {"FAKE_INLINE": "1"}

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}


def peers() -> dict[str, str]:
    env_sh = ROOT / ".peers" / "env.sh"
    if not env_sh.exists():
        subprocess.run(["bash", str(ROOT / "tools" / "peers.sh")], check=True)
    out = {}
    for line in env_sh.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export ") :].split("=", 1)
            out[k] = v.strip().strip('"')
    return out


def servers() -> dict[str, dict[str, Any]]:
    p = peers()
    return {
        "fake (stdlib python)": {"command": sys.executable, "args": [str(FAKE)]},
        "server-everything": {"command": "node", "args": [p["PEER_EVERYTHING_JS"], "stdio"]},
        "server-filesystem": {"command": "node", "args": [p["PEER_FILESYSTEM_JS"], "/tmp"]},
        "mcp-server-time": {"command": p["PEER_VENV"] + "/bin/mcp-server-time", "args": []},
    }


def fake(**env: str | int) -> dict[str, Any]:
    """A settings entry for tools/fake_upstream.py with the given FAKE_* environment."""
    return {
        "command": sys.executable,
        "args": [str(FAKE)],
        "env": {k: str(v) for k, v in env.items()},
    }


def bench_peers() -> dict[str, str]:
    """BENCH_* paths of the proxies compared against (tools/bench/peers.sh installs them)."""
    subprocess.run(["bash", str(ROOT / "tools" / "bench" / "peers.sh")], check=True)
    out = {}
    for line in (ROOT / ".peers" / "bench" / "env.sh").read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export ") :].split("=", 1)
            out[k] = v.strip().strip('"')
    return out


def call_line(request_id: int, tool: str, args: dict[str, Any] | None = None) -> bytes:
    msg = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": args or {}},
    }
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, path: str = "/", timeout: float = START_TIMEOUT) -> None:
    """Until something on 127.0.0.1:port answers HTTP at all (any status)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            c.getresponse().read()
            c.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing answered on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM then SIGKILL a process started with start_new_session=True, and its group."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class _PostConn:
    """What the HTTP clients below share: a handshake and calls over their `post`."""

    def post(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def handshake_and_list(self) -> int:
        self.post(INIT)
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        reply = self.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert reply is not None
        return len(reply["result"]["tools"])

    def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        reply = self.post(obj)
        assert reply is not None
        return reply


class StreamableHttpConn(_PostConn):
    """A minimal streamable-HTTP MCP client on one keep-alive connection (no SDK)."""

    def __init__(self, port: int, path: str = "/mcp") -> None:
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.path = path
        self.sid: str | None = None

    def post(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.sid:
            headers["mcp-session-id"] = self.sid
            headers["mcp-protocol-version"] = INIT["params"]["protocolVersion"]
        payload = json.dumps(obj).encode()
        try:
            self.c.request("POST", self.path, payload, headers)
            r = self.c.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed our keep-alive connection while this path sat idle between
            # rounds (the proxies' HTTP servers time idle connections out): reconnect once.
            self.c.close()
            self.c.request("POST", self.path, payload, headers)
            r = self.c.getresponse()
        self.sid = r.getheader("mcp-session-id") or self.sid
        body = r.read()
        if r.status >= 400:
            raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
        if "id" not in obj or not body:
            return None
        if "text/event-stream" in (r.getheader("content-type") or ""):
            for line in body.split(b"\n"):
                if line.startswith(b"data:"):
                    msg = json.loads(line[5:])
                    if msg.get("id") == obj["id"] and "method" not in msg:
                        return msg
            raise RuntimeError(f"no response in the event stream: {body[:200]!r}")
        return json.loads(body)


class SseConn(_PostConn):
    """A minimal legacy-SSE MCP client: GET the event stream, POST to the endpoint it names."""

    def __init__(self, port: int, path: str = "/sse") -> None:
        self.stream_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.stream_conn.request("GET", path, headers={"Accept": "text/event-stream"})
        self.stream = self.stream_conn.getresponse()
        if self.stream.status != 200:
            raise RuntimeError(f"HTTP {self.stream.status} on GET {path}")
        event, data = self._event()
        assert event == "endpoint", (event, data)
        self.endpoint = data
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def _event(self) -> tuple[str, str]:
        event, data = "message", []
        while True:
            line = self.stream.readline()
            if not line:
                raise EOFError("event stream closed")
            line = line.rstrip(b"\r\n")
            if not line:
                if data:
                    return event, "\n".join(data)
                continue
            if line.startswith(b"event:"):
                event = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].strip().decode())

    def post(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self.c.request(
            "POST", self.endpoint, json.dumps(obj).encode(), {"Content-Type": "application/json"}
        )
        r = self.c.getresponse()
        r.read()
        if r.status >= 400:
            raise RuntimeError(f"HTTP {r.status} posting to {self.endpoint}")
        if "id" not in obj:
            return None
        while True:
            _, data = self._event()
            msg = json.loads(data)
            if msg.get("id") == obj["id"] and "method" not in msg:
                return msg


class LineConn:
    """A blocking newline-JSON connection over any pair of file objects."""

    def __init__(self, rfile: Any, wfile: Any) -> None:
        self.r = rfile
        self.w = wfile

    def send(self, obj: dict[str, Any]) -> None:
        self.w.write(json.dumps(obj).encode() + b"\n")
        self.w.flush()

    def send_raw(self, data: bytes) -> None:
        self.w.write(data)
        self.w.flush()

    def recv(self) -> dict[str, Any]:
        while True:
            line = self.r.readline()
            if not line:
                raise EOFError("connection closed")
            msg = json.loads(line)
            if "id" in msg and "method" not in msg:
                return msg  # skip notifications
            if "method" in msg and "id" in msg:
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})

    def handshake_and_list(self) -> int:
        self.send(INIT)
        self.recv()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        return len(self.recv()["result"]["tools"])

    def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.recv()


class Daemon:
    """A private daemon on a temporary socket, with the given servers in its config."""

    def __init__(
        self,
        servers: dict[str, dict[str, Any]],
        daemon_opts: dict[str, Any] | None = None,
        python_args: list[str] | None = None,
        cache_home: str | None = None,
        wrapper: list[str] | None = None,
        start_timeout: float = START_TIMEOUT,
        extra_env: dict[str, str] | None = None,
        daemon_args: list[str] | None = None,
    ):
        """`python_args` go before `-m mcpool` (e.g. `-m cProfile -o FILE`); `cache_home`
        keeps discovery snapshots across daemons (default: this daemon's own folder);
        `wrapper` goes before the interpreter (e.g. `valgrind --tool=callgrind`);
        `daemon_args` after the daemon's own (e.g. `--http 127.0.0.1:PORT`)."""
        self.dir = tempfile.mkdtemp(prefix="mcpool-bench-")
        self.sock = os.path.join(self.dir, "d.sock")
        self.config = os.path.join(self.dir, "config.json")
        Path(self.config).write_text(
            json.dumps({"mcpServers": servers, "daemon": daemon_opts or {}})
        )
        env = dict(os.environ)
        env["XDG_STATE_HOME"] = os.path.join(self.dir, "state")
        env["XDG_CACHE_HOME"] = cache_home or os.path.join(self.dir, "cache")
        env["MCPOOL_SOCKET"] = self.sock
        env.update(extra_env or {})
        self.env = env
        self.proc = subprocess.Popen(
            [
                *(wrapper or []),
                sys.executable,
                *(python_args or []),
                "-m",
                "mcpool",
                "daemon",
                "--socket",
                self.sock,
                "--config",
                self.config,
                *(daemon_args or []),
            ],
            env=env,
            # Not the caller's: `-m` puts the working directory first on sys.path, and in a
            # checkout of a revision before src/mcpool that is the checkout's `mcpool` package,
            # ahead of a PYTHONPATH (cpu.py's `--baseline` daemon would run this checkout's code).
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "stderr"), "w"),  # noqa: SIM115
        )
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.sock)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("daemon did not start")

    def connect(
        self, name: str = "bench", sources: list[str] | None = None
    ) -> tuple[socket.socket, LineConn]:
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        conn = LineConn(s.makefile("rb"), s.makefile("wb"))
        conn.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "mcpool/attach",
                "params": {"sources": sources or [self.config], "cwd": self.dir, "name": name},
            }
        )
        conn.recv()
        return s, conn

    def session(self, name: str = "bench", sources: list[str] | None = None) -> socket.socket:
        """An attached, initialized session whose tools/list was read: a bare socket."""
        s, conn = self.connect(name, sources)
        conn.handshake_and_list()
        return s

    def admin(self, command: str, params: dict[str, Any] | None = None) -> Any:
        """One `mcpool/admin/<command>` request, what daemonctl sends, without its start-up."""
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        try:
            conn = LineConn(s.makefile("rb"), s.makefile("wb"))
            conn.send(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": f"mcpool/admin/{command}",
                    "params": params or {},
                }
            )
            reply = conn.recv()
        finally:
            s.close()
        if "error" in reply:
            raise RuntimeError(f"admin {command}: {reply['error']}")
        return reply["result"]

    def rss(self) -> int:
        """The daemon process's own RSS in bytes (upstreams excluded)."""
        import psutil

        rss: int = psutil.Process(self.proc.pid).memory_info().rss
        return rss

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> dict[str, Any]:
    load = os.getloadavg()[0]
    if load > 1.5:
        print(
            f"warning: load average {load:.1f}: other work is running, timings are noisy",
            file=sys.stderr,
        )
    return {
        "date": time.strftime("%Y-%m-%d"),
        "loadavg_1min": round(load, 2),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2))
    return path


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
