"""Shared helpers for the benchmarks: a private daemon, raw newline-JSON clients, result files."""

from __future__ import annotations

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


class Daemon:
    """A private daemon on a temporary socket, with the given servers in its config."""

    def __init__(self, servers: dict[str, dict[str, Any]], daemon_opts: dict[str, Any] | None = None):
        self.dir = tempfile.mkdtemp(prefix="mcpb")
        self.sock = os.path.join(self.dir, "d.sock")
        self.config = os.path.join(self.dir, "config.json")
        Path(self.config).write_text(
            json.dumps({"mcpServers": servers, "daemon": daemon_opts or {}})
        )
        env = dict(os.environ)
        env["XDG_STATE_HOME"] = os.path.join(self.dir, "state")
        env["MCPOOL_SOCKET"] = self.sock
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcpool", "daemon", "--socket", self.sock, "--config", self.config],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "stderr"), "w"),  # noqa: SIM115
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.sock)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("daemon did not start")

    def connect(self, name: str = "bench") -> tuple[socket.socket, LineConn]:
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        conn = LineConn(s.makefile("rb"), s.makefile("wb"))
        conn.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "mcpool/attach",
                "params": {"sources": [self.config], "cwd": self.dir, "name": name},
            }
        )
        conn.recv()
        return s, conn

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d"),
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
