"""Daemon memory under `--http` sessions that never read, and bodies that never end (issue 26).

The issue's attack: 100 HTTP sessions without a GET stream and a chatty server took the daemon
from 33 MB to 1,956 MB (each session kept 1,000 server messages of any size), and after every
session was deleted it stayed near 1 GB; 40 connections each sending 15 MiB of a body they never
finish held 635 MB. Phases, the daemon's own RSS after each (upstreams excluded):

1. start     the daemon, one shared fake upstream, two socket sessions on it;
2. sessions  100 HTTP sessions initialized, none with a GET stream;
3. floods    3 floods of 1,000 log messages of 20 KB: one socket session keeps a call in flight
             (`sleep`) while the other calls `log` 1,000 times, so no single session owns the
             messages and every session of the server is sent each one (the stream-less HTTP
             sessions keep a few and drop the rest, counted in `daemonctl sessions`);
4. deleted   every HTTP session DELETEd (and the daemon's heap trimmed);
5. bodies    40 connections each sending 15 MiB of a body they never finish (each connection
             refused at once past `httpMaxPendingBodyBytes` gets a 503);
6. closed    those connections closed.

Targets (issue 26): RSS after the floods within 150 MB of the start, back within 50 MB once the
sessions are deleted; the bodies' phase bounded by the pending-body cap (64 MiB by default).

    .venv/bin/python tools/bench/http_memory.py [--sessions 100] [--floods 3] [--messages 1000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time
from typing import Any

from _common import INIT, Daemon, LineConn, fake, free_port, table, wait_http, write_result

TARGET_FLOOD_MB = 150
TARGET_DELETED_MB = 50
MESSAGE_BYTES = 20_000
BODY_CONNECTIONS = 40
BODY_BYTES = 15 * 1024 * 1024
SETTLE = 2.0  # the daemon finishes answering and trims its heap (1 s after sessions end)
MB = 1e6


def post_json(port: int, body: dict[str, Any], sid: str | None = None) -> tuple[int, Any, Any]:
    """One POST that takes a JSON answer only: (status, session id, answer)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if sid:
        headers["Mcp-Session-Id"] = sid
    c.request("POST", "/mcp", json.dumps(body).encode(), headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.getheader("mcp-session-id"), json.loads(data) if data else None


def http_session(port: int) -> str:
    status, sid, _ = post_json(port, INIT)
    assert status == 200, status
    assert sid, "no Mcp-Session-Id"
    status, _, _ = post_json(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    assert status == 202, status
    return str(sid)


def delete(port: int, sid: str) -> None:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 200, r.status


def drain(sock: socket.socket, stop: threading.Event) -> None:
    """Read everything a socket session is sent (it is sent every log message too)."""
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def flood(conn: LineConn, messages: int, first_id: int) -> None:
    text = "m" * MESSAGE_BYTES
    for n in range(messages):
        reply = conn.call(
            {
                "jsonrpc": "2.0",
                "id": first_id + n,
                "method": "tools/call",
                "params": {"name": "f__log", "arguments": {"level": "info", "message": text}},
            }
        )
        assert "result" in reply, reply


def http_stats(daemon: Daemon) -> tuple[int, int, int]:
    """HTTP sessions: (how many, lossy messages dropped in all, most bytes queued for one)."""
    mine = [s for s in daemon.admin("sessions") if s["via"] == "http"]
    dropped = sum(s.get("lossy_dropped", 0) for s in mine)
    return len(mine), dropped, max((s.get("queued_bytes", 0) for s in mine), default=0)


def unfinished_bodies(port: int) -> tuple[list[socket.socket], dict[int, int]]:
    """BODY_CONNECTIONS connections, each sending BODY_BYTES of a body one byte short; the
    status each got (0: none yet, still being read)."""
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {BODY_BYTES + 1}\r\n\r\n"
    ).encode()
    chunk = b"x" * (1 << 20)
    socks, statuses = [], {}
    for _ in range(BODY_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
        status = 0
        try:
            s.sendall(head)
            for _ in range(BODY_BYTES // len(chunk)):
                s.sendall(chunk)
        except OSError:
            pass  # refused and closed while it was sending
        s.settimeout(0.2)
        try:
            answer = s.recv(4096)
            if answer.startswith(b"HTTP/1.1 "):
                status = int(answer.split(b" ", 2)[1])
        except (TimeoutError, OSError):
            pass
        statuses[status] = statuses.get(status, 0) + 1
    return socks, statuses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--floods", type=int, default=3)
    ap.add_argument("--messages", type=int, default=1000)
    args = ap.parse_args()
    port = free_port()
    # A plain fake (a thread per call): `sleep` must not block its reader.
    daemon = Daemon({"f": fake()}, {"drainGrace": 600}, daemon_args=["--http", f"127.0.0.1:{port}"])
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    stop = threading.Event()
    try:
        wait_http(port, "/mcp")
        holder_sock, holder = daemon.connect("holder")
        holder.handshake_and_list()
        _flooder_sock, flooder = daemon.connect("flooder")
        flooder.handshake_and_list()
        time.sleep(SETTLE)
        start = daemon.rss()

        def phase(name: str, target: str = "", limit_mb: float | None = None) -> None:
            time.sleep(SETTLE)
            rss = daemon.rss()
            n, dropped, queued = http_stats(daemon)
            verdict = ""
            if limit_mb is not None:
                ok = (rss - start) / MB <= limit_mb
                verdict = ("ok" if ok else "MISS") + f" ({target})"
            results[name] = {
                "rss_mb": rss / MB,
                "over_start_mb": (rss - start) / MB,
                "http_sessions": n,
                "dropped": dropped,
                "most_queued_bytes": queued,
            }
            rows.append(
                [
                    name,
                    f"{rss / MB:.1f}",
                    f"{(rss - start) / MB:+.1f}",
                    n,
                    dropped,
                    queued,
                    verdict,
                ]
            )

        phase("start")
        sids = [http_session(port) for _ in range(args.sessions)]
        phase("sessions")
        reader = threading.Thread(target=drain, args=(holder_sock, stop), daemon=True)
        for n in range(args.floods):
            holder.send(
                {
                    "jsonrpc": "2.0",
                    "id": 10_000 + n,
                    "method": "tools/call",
                    "params": {"name": "f__sleep", "arguments": {"seconds": 3600}},
                }
            )
            if n == 0:
                time.sleep(0.5)  # the holder's call is in flight before the flood begins
                reader.start()
            flood(flooder, args.messages, 100_000 * (n + 1))
        phase("floods", f"<= +{TARGET_FLOOD_MB} MB", TARGET_FLOOD_MB)
        for sid in sids:
            delete(port, sid)
        phase("deleted", f"<= +{TARGET_DELETED_MB} MB", TARGET_DELETED_MB)
        socks, statuses = unfinished_bodies(port)
        phase("bodies")
        results["bodies"]["statuses"] = statuses
        for s in socks:
            s.close()
        phase("closed")
    finally:
        stop.set()
        daemon.stop()
    print(
        table(
            ["phase", "RSS MB", "vs start", "HTTP sessions", "dropped", "most queued B", "target"],
            rows,
        )
    )
    print(
        f"{args.floods} floods of {args.messages} x {MESSAGE_BYTES} B log messages; "
        f"{BODY_CONNECTIONS} unfinished bodies of {BODY_BYTES} B: "
        + ", ".join(
            f"{count} {'still being read' if status == 0 else f'answered {status}'}"
            for status, count in sorted(results["bodies"]["statuses"].items())
        )
    )
    print("wrote", write_result("http_memory", {"phases": results, "sessions": args.sessions}))


if __name__ == "__main__":
    main()
