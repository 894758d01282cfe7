"""Daemon memory: RSS idle, and with 100 and 1,000 attached sessions.

Every session has a view of the same 5 servers of 50 tools each (fake_upstream.py with
FAKE_TOOL_COUNT=50, plus its 9 built-in tools) through the same settings, so the sessions share
policies. Each session attaches, initializes, and reads tools/list once (as every real client
does right after initialize); RSS is taken before and after that tools/list so the cost of the
listing is visible on its own. Per-session KB is the slope between 100 and 1,000 sessions.
`--via attach` makes each session as `mcpool attach` does when it hands its stdio to the daemon
(a pipe pair passed with the attach request; the bridge processes themselves are left out):
such a session also holds the task that watches the bridge's socket.
The daemon's own RSS only; the upstreams are separate processes. Targets (issue 9): idle
daemon at most 35 MB, at most 16 KB per idle session when sessions share policies.

    .venv/bin/python tools/bench/memory.py [--sessions 100,1000] [--via socket|attach]
    (1,000 sessions need `ulimit -n 8192`)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import Any

from _common import INIT, Daemon, LineConn, fake, table, write_result

TARGET_IDLE_MB = 35
TARGET_SESSION_KB = 16
SERVERS = 5
TOOLS = 50
SETTLE = 1.0  # let the daemon finish answering before RSS is read


def settle_rss(daemon: Daemon) -> int:
    time.sleep(SETTLE)
    return daemon.rss()


def attach(daemon: Daemon, i: int, via: str = "socket") -> tuple[socket.socket, LineConn]:
    s, conn = daemon.connect(f"m{i}") if via == "socket" else handed_off(daemon, f"m{i}")
    conn.send(INIT)
    conn.recv()
    conn.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return s, conn


def handed_off(daemon: Daemon, name: str) -> tuple[socket.socket, LineConn]:
    """A session on a pipe pair handed to the daemon, as `mcpool attach` makes it."""
    to_daemon_r, to_daemon_w = os.pipe()
    from_daemon_r, from_daemon_w = os.pipe()
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.sock)
    request = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "mcpool/attach",
        "params": {"sources": [daemon.config], "cwd": daemon.dir, "name": name, "handoff": True},
    }
    socket.send_fds(s, [json.dumps(request).encode() + b"\n"], [to_daemon_r, from_daemon_w])
    os.close(to_daemon_r)
    os.close(from_daemon_w)
    answer = json.loads(s.makefile("rb").readline())
    assert answer["result"].get("handoff") is True, answer
    conn = LineConn(os.fdopen(from_daemon_r, "rb"), os.fdopen(to_daemon_w, "wb"))
    return s, conn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", default="100,1000")
    ap.add_argument("--via", choices=["socket", "attach"], default="socket")
    args = ap.parse_args()
    counts = [int(x) for x in args.sessions.split(",")]
    servers = {
        f"s{i}": fake(FAKE_TOOL_COUNT=TOOLS, FAKE_INSTRUCTIONS=f"server {i}")
        for i in range(SERVERS)
    }
    daemon = Daemon(servers, {"drainGrace": 600})
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    conns: list[tuple[socket.socket, LineConn]] = []
    try:
        idle = settle_rss(daemon)
        results["idle_bytes"] = idle
        rows.append(["idle (no session, no upstream)", f"{idle / 2**20:.1f} MB", ""])
        # One session first so the entries are spawned and discovered: their snapshots are
        # shared by every session and are not a per-session cost.
        conns.append(attach(daemon, 0, args.via))
        conns[0][1].send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert len(conns[0][1].recv()["result"]["tools"]) == SERVERS * (TOOLS + 9)
        one = settle_rss(daemon)
        results["one_session_bytes"] = one
        rows.append(["1 session (5 entries discovered)", f"{one / 2**20:.1f} MB", ""])
        listed = 1
        per: dict[int, tuple[int, int]] = {}
        for n in counts:
            while len(conns) < n:
                conns.append(attach(daemon, len(conns), args.via))
            before = settle_rss(daemon)
            for _, conn in conns[listed:]:
                conn.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
                conn.recv()
            listed = len(conns)
            after = settle_rss(daemon)
            per[n] = (before, after)
            results[f"sessions_{n}"] = {"rss_bytes": before, "rss_after_tools_list_bytes": after}
            rows.append([f"{n} sessions, initialized", f"{before / 2**20:.1f} MB", ""])
            rows.append(
                [f"{n} sessions, after each read tools/list", f"{after / 2**20:.1f} MB", ""]
            )
        if len(counts) >= 2:
            lo, hi = counts[0], counts[-1]
            for label, k in (("initialized", 0), ("after tools/list", 1)):
                kb = (per[hi][k] - per[lo][k]) / (hi - lo) / 1024
                results[f"per_session_kb_{label.replace(' ', '_').replace('/', '_')}"] = kb
                verdict = (
                    "ok" if kb <= TARGET_SESSION_KB else "MISS"
                ) + f" (<= {TARGET_SESSION_KB} KB)"
                rows.append([f"per session ({lo}->{hi}), {label}", f"{kb:.1f} KB", verdict])
        verdict = (
            "ok" if idle / 2**20 <= TARGET_IDLE_MB else "MISS"
        ) + f" (<= {TARGET_IDLE_MB} MB)"
        rows[0][2] = verdict
    finally:
        for s, _ in conns:
            s.close()
        daemon.stop()
    print(table(["daemon state", "RSS", "target"], rows))
    print(
        f"({SERVERS} servers x {TOOLS + 9} tools per session view, shared policies;"
        f" sessions via {args.via})"
    )
    print(
        "wrote",
        write_result(
            f"memory-{args.via}" if args.via != "socket" else "memory",
            {
                "servers": SERVERS,
                "tools_per_server": TOOLS + 9,
                "via": args.via,
                "results": results,
            },
        ),
    )


if __name__ == "__main__":
    main()
