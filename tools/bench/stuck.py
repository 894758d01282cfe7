"""A session that stops reading must not slow the others (issue 9's stuck-client item).

Four sessions call `echo` on one shared upstream in a loop (one call outstanding each) while a
fifth session floods it with large echo calls and never reads its socket. Phases, each
`--seconds` long, the four sessions' latency measured throughout:

1. baseline   nobody is stuck;
2. stuck      the fifth session has filled its socket and about half of its daemon-side buffer
              (`sessionBufferBytes`) with answers it does not read, and stays connected;
3. overflow   it sends more until the daemon disconnects it (past `sessionBufferBytes`); the
              phase checks it is gone from `daemonctl sessions`;
4. after      the daemon without it.

Target (issue 9): the others' p99 in phase 2 within 20% of the baseline. A timing assertion,
so it lives here and not in the tests (tests/e2e/test_chaos.py checks the disconnection and that
every other call succeeds).

    .venv/bin/python tools/bench/stuck.py [--seconds 3] [--buffer-mib 8]
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import time
from typing import Any

from _common import FAST, Daemon, LineConn, fake, median, pct, table, write_result

TARGET_RATIO = 1.2
CALLERS = 4
BIG = 256 * 1024  # bytes of text per flood call


def attach(daemon: Daemon, name: str) -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.sock)
    conn = LineConn(s.makefile("rb"), s.makefile("wb"))
    conn.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "mcpool/attach",
            "params": {"sources": [daemon.config], "cwd": daemon.dir, "name": name},
        }
    )
    session_id = conn.recv()["result"]["session"]
    conn.handshake_and_list()
    return s, session_id


def measure(callers: list[socket.socket], seconds: float) -> tuple[list[float], int]:
    """Each caller keeps one echo call outstanding for `seconds`: (latencies, failures)."""
    sel = selectors.DefaultSelector()
    sent: dict[int, float] = {}
    bufs: dict[int, bytes] = {}
    ids = {s.fileno(): 1000 for s in callers}
    for s in callers:
        sel.register(s, selectors.EVENT_READ, s)
        bufs[s.fileno()] = b""
    lat: list[float] = []
    failures = 0

    def fire(s: socket.socket) -> None:
        ids[s.fileno()] += 1
        s.sendall(
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"f__echo",'
            b'"arguments":{"text":"x"}}}\n' % ids[s.fileno()]
        )
        sent[s.fileno()] = time.perf_counter()

    for s in callers:
        fire(s)
    end = time.perf_counter() + seconds
    waiting = len(callers)
    while waiting:
        for key, _ in sel.select(timeout=5.0):
            s = key.data
            data = s.recv(1 << 16)
            if not data:
                raise RuntimeError("the daemon closed a caller's session")
            *lines, bufs[s.fileno()] = (bufs[s.fileno()] + data).split(b"\n")
            for line in lines:
                if b'"method"' in line:
                    continue
                lat.append(time.perf_counter() - sent[s.fileno()])
                if b'"result"' not in line:
                    failures += 1
                if time.perf_counter() < end:
                    fire(s)
                else:
                    waiting -= 1
    sel.close()
    return lat, failures


def flood(s: socket.socket, nbytes: int, start_id: int) -> int:
    text = "y" * BIG
    n = 0
    while n * BIG < nbytes:
        msg = {
            "jsonrpc": "2.0",
            "id": start_id + n,
            "method": "tools/call",
            "params": {"name": "f__echo", "arguments": {"text": text}},
        }
        try:
            s.sendall(json.dumps(msg).encode() + b"\n")
        except OSError:
            break  # already disconnected
        n += 1
    return start_id + n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--buffer-mib", type=float, default=8.0, help="the daemon's sessionBufferBytes")
    args = ap.parse_args()
    limit = int(args.buffer_mib * 2**20)
    daemon = Daemon({"f": fake(**FAST)}, {"drainGrace": 600, "sessionBufferBytes": limit})
    phases: dict[str, Any] = {}
    gone = False
    try:
        callers = [attach(daemon, f"c{i}")[0] for i in range(CALLERS)]
        stuck, stuck_id = attach(daemon, "stuck")
        measure(callers, 0.5)  # warm-up
        phases["baseline"] = measure(callers, args.seconds)
        # Half the daemon-side limit on top of what the socket buffers hold (a few hundred KB).
        next_id = flood(stuck, limit // 2 + 512 * 1024, 10)
        time.sleep(1.0)  # the upstream answers and the daemon queues them
        alive = {s["id"] for s in daemon.admin("sessions")}
        if stuck_id not in alive:
            raise RuntimeError("the stuck session was dropped before its buffer limit")
        phases["stuck"] = measure(callers, args.seconds)
        flood(stuck, limit, next_id)
        deadline = time.monotonic() + 10
        lat: list[float] = []
        fails = 0
        while time.monotonic() < deadline and not gone:
            chunk, f = measure(callers, 0.5)
            lat += chunk
            fails += f
            gone = stuck_id not in {s["id"] for s in daemon.admin("sessions")}
        phases["overflow"] = (lat, fails)
        phases["after"] = measure(callers, args.seconds)
        stuck.close()
        for s in callers:
            s.close()
    finally:
        daemon.stop()
    base99 = pct(phases["baseline"][0], 99)
    rows, results = [], {}
    for name, (lat, fails) in phases.items():
        p50, p99 = median(lat) * 1e3, pct(lat, 99) * 1e3
        ratio = pct(lat, 99) / base99
        verdict = ""
        if name == "stuck":
            verdict = ("ok" if ratio <= TARGET_RATIO else "MISS") + f" (<= {TARGET_RATIO}x)"
        results[name] = {
            "calls": len(lat),
            "failures": fails,
            "median_ms": p50,
            "p99_ms": p99,
            "p99_vs_baseline": ratio,
        }
        rows.append([name, len(lat), fails, f"{p50:.3f}", f"{p99:.3f}", f"{ratio:.2f}x", verdict])
    print(
        table(["phase", "calls", "failed", "median ms", "p99 ms", "p99/baseline", "target"], rows)
    )
    print(
        f"stuck session disconnected at its {args.buffer_mib:g} MiB limit:",
        "yes" if gone else "NO",
    )
    print(
        "wrote",
        write_result(
            "stuck",
            {"buffer_bytes": limit, "callers": CALLERS, "disconnected": gone, "results": results},
        ),
    )


if __name__ == "__main__":
    main()
