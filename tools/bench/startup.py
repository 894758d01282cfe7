"""Time to a complete first tools/list for the five real peers (issue 14).

Three ways to get the tools of server-everything, -filesystem, -memory, mcp-server-time and
mcp-server-git (`--fake`: five fake_upstream.py servers with FAKE_STARTUP_DELAY):

- direct: the five servers started in parallel, each initialized and listed, as a client that
  runs its own servers does; done when the slowest has answered tools/list.
- mcpool, cold daemon, no snapshots: a daemon started now with an empty cache folder; one
  session attaches, initializes and lists; done when its list holds every server's tools
  (a partial first answer is followed by list_changed and listed again).
- mcpool, cold daemon, with snapshots: the same after a previous daemon ran the same servers
  and stopped (its discovery snapshots kept in the cache folder).

Each time counts from the first process being started (the daemon's start-up is included).
"first answer" is when the first tools/list answered, whatever it held.

    .venv/bin/python tools/bench/startup.py [--runs 3] [--fake]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

from _common import (
    INIT,
    START_TIMEOUT,
    Daemon,
    LineConn,
    fake,
    kill_tree,
    median,
    table,
    write_result,
)
from processes import servers as real_servers

LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def specs(use_fake: bool, workdir: str) -> dict[str, dict[str, Any]]:
    if use_fake:
        return {f"s{i}": fake(FAKE_STARTUP_DELAY=f"{0.2 * i:.1f}") for i in range(5)}
    return real_servers(False, workdir)


def direct(spec: dict[str, dict[str, Any]]) -> tuple[float, dict[str, int], dict[str, float]]:
    """Start every server at once; (time to the last tools/list, tool counts, per server)."""
    counts: dict[str, int] = {}
    times: dict[str, float] = {}
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.perf_counter()
    try:
        conns = {}
        for name, s in spec.items():
            proc = subprocess.Popen(
                [s["command"], *s["args"]],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **s.get("env", {})},
                start_new_session=True,
            )
            procs.append(proc)
            conns[name] = LineConn(proc.stdout, proc.stdin)

        def one(name: str) -> None:
            counts[name] = conns[name].handshake_and_list()
            times[name] = time.perf_counter() - t0

        threads = [threading.Thread(target=one, args=(n,)) for n in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(START_TIMEOUT)
        total = time.perf_counter() - t0
    finally:
        for p in procs:
            kill_tree(p)
    assert len(counts) == len(spec), f"not every server answered: {counts}"
    return total, counts, times


class _Lines:
    """Newline JSON over a socket, notifications kept (list_changed matters here)."""

    def __init__(self, s: socket.socket) -> None:
        self.r = s.makefile("rb")
        self.w = s.makefile("wb")

    def send(self, obj: dict[str, Any]) -> None:
        self.w.write(json.dumps(obj).encode() + b"\n")
        self.w.flush()

    def recv(self) -> dict[str, Any]:
        line = self.r.readline()
        if not line:
            raise EOFError("the daemon closed the connection")
        msg: dict[str, Any] = json.loads(line)
        return msg


def through_mcpool(
    spec: dict[str, dict[str, Any]], expected: int, cache_home: str
) -> tuple[float, float, int, Any]:
    """(time to a complete list, time to the first answer, its tool count, the daemon)."""
    t0 = time.perf_counter()
    daemon = Daemon(spec, {"drainGrace": 600}, cache_home=cache_home)
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.sock)
    s.settimeout(START_TIMEOUT * 2)
    conn = _Lines(s)
    conn.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "mcpool/attach",
            "params": {"sources": [daemon.config], "cwd": daemon.dir, "name": "startup"},
        }
    )
    conn.recv()
    conn.send(INIT)
    while "id" not in conn.recv():
        pass
    conn.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    first_at: float | None = None
    first_count = 0
    request_id = 2
    while True:
        conn.send({**LIST, "id": request_id})
        while True:
            msg = conn.recv()
            if msg.get("id") == request_id:
                break
        count = len(msg["result"]["tools"])
        if first_at is None:
            first_at, first_count = time.perf_counter() - t0, count
        if count >= expected:
            done = time.perf_counter() - t0
            s.close()
            return done, first_at, first_count, daemon
        while conn.recv().get("method") != "notifications/tools/list_changed":
            pass
        request_id += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fake", action="store_true")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="mcpool-bench-startup-")
    spec = specs(args.fake, workdir)
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "cold": [], "snapshots": []}
    try:
        for _ in range(args.runs):
            total, counts, per = direct(spec)
            runs["direct"].append({"seconds": total, "tools": counts, "per_server": per})
            expected = sum(counts.values())
            cache = tempfile.mkdtemp(prefix="mcpool-bench-cache-")
            try:
                for kind in ("cold", "snapshots"):
                    done, first, first_count, daemon = through_mcpool(spec, expected, cache)
                    daemon.stop()
                    runs[kind].append(
                        {"seconds": done, "first_answer": first, "first_tools": first_count}
                    )
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def ms(values: list[float]) -> str:
        return f"{median(values) * 1000:.0f}"

    rows = [
        ["direct, 5 servers in parallel", ms([r["seconds"] for r in runs["direct"]]), "", ""],
    ]
    for kind, label in (("cold", "no snapshots"), ("snapshots", "with snapshots")):
        rows.append(
            [
                f"mcpool, cold daemon, {label}",
                ms([r["seconds"] for r in runs[kind]]),
                ms([r["first_answer"] for r in runs[kind]]),
                str(runs[kind][-1]["first_tools"]),
            ]
        )
    slowest = runs["direct"][-1]["per_server"]
    print(table(["to a complete first tools/list", "median ms", "first answer ms", "tools"], rows))
    print(
        f"({args.runs} runs; {expected} tools; direct, slowest last run: "
        + ", ".join(f"{n} {t * 1000:.0f} ms" for n, t in sorted(slowest.items()))
        + ")"
    )
    print(
        "wrote",
        write_result(
            "startup-fake" if args.fake else "startup",
            {"servers": list(spec), "fake": args.fake, "runs": runs},
        ),
    )


if __name__ == "__main__":
    main()
