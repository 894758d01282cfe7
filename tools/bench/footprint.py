"""Per-session footprint of an attached session: the bridge process and the daemon (issue 14).

N sessions are `mcpool attach` processes, as MCP clients launch them, each with stdio pipes
(so they hand off), initialized and with tools/list answered, on one daemon with 5 fake
servers. Measured with psutil's memory_full_info: RSS, USS (pages only that process holds) and
PSS (shared pages split among their users). The bridge side is measured twice: with the shell
waiter the bridge execs into after the hand-off (the default), and with the Python waiter
(MCPOOL_ATTACH_WAITER=python, what every session cost before). The daemon's per-session cost is
the growth from 1 to N+1 sessions, divided by N. Target (issue 14): at most 1 MiB USS per
attached session for the bridge side.

    .venv/bin/python tools/bench/footprint.py [--sessions 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import psutil
from _common import Daemon, LineConn, fake, kill_tree, table, write_result

TARGET_BRIDGE_USS = 1024 * 1024
SETTLE = 1.0  # let the daemon and the bridges finish their start-up before reading memory
WAITER_NAME = "mcpool-attach-waiter"


def memory(pid: int) -> dict[str, int]:
    info = psutil.Process(pid).memory_full_info()
    return {"rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", 0)}


def bridge(daemon: Daemon, waiter: str) -> tuple[subprocess.Popen[bytes], LineConn]:
    exe = os.path.join(os.path.dirname(sys.executable), "mcpool")
    env = dict(daemon.env)
    if waiter == "python":
        env["MCPOOL_ATTACH_WAITER"] = "python"
    else:
        env.pop("MCPOOL_ATTACH_WAITER", None)
    proc = subprocess.Popen(
        [exe, "attach", "--socket", daemon.sock, "--settings", daemon.config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    conn = LineConn(proc.stdout, proc.stdin)
    conn.handshake_and_list()
    return proc, conn


def run(daemon: Daemon, waiter: str, n: int) -> dict[str, Any]:
    first = [bridge(daemon, waiter)]  # entries spawned and discovered before the baseline
    time.sleep(SETTLE)
    base = memory(daemon.proc.pid)
    procs = [bridge(daemon, waiter) for _ in range(n)]
    time.sleep(SETTLE)
    after = memory(daemon.proc.pid)
    bridges = [memory(p.pid) for p, _ in procs]
    shapes = {psutil.Process(p.pid).cmdline()[0] for p, _ in procs}
    for p, _ in [*first, *procs]:
        kill_tree(p)
    per_daemon = {k: (after[k] - base[k]) / n for k in base}
    per_bridge = {k: sum(b[k] for b in bridges) / n for k in bridges[0]}
    return {"bridge": per_bridge, "daemon": per_daemon, "bridge_argv0": sorted(shapes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    args = ap.parse_args()
    servers = {f"s{i}": fake(FAKE_INSTRUCTIONS=str(i)) for i in range(5)}
    results: dict[str, Any] = {}
    for waiter in ("shell", "python"):
        daemon = Daemon(servers, {"drainGrace": 600})
        try:
            results[waiter] = run(daemon, waiter, args.sessions)
        finally:
            daemon.stop()

    def kib(v: float) -> str:
        return f"{v / 1024:.0f}"

    rows = []
    for waiter, label in (("shell", "shell waiter (default)"), ("python", "Python waiter")):
        r = results[waiter]
        b, d = r["bridge"], r["daemon"]
        verdict = "ok" if b["uss"] <= TARGET_BRIDGE_USS else "MISS"
        rows.append([f"bridge, {label}", kib(b["rss"]), kib(b["uss"]), kib(b["pss"]), verdict])
        rows.append(["  daemon, per session", kib(d["rss"]), kib(d["uss"]), kib(d["pss"]), ""])
    print(table(["per attached session", "RSS KiB", "USS KiB", "PSS KiB", "<= 1 MiB USS"], rows))
    argv0 = results["shell"]["bridge_argv0"]
    print(f"({args.sessions} sessions, 5 fake servers; the bridges' argv[0]: {argv0})")
    print(
        "wrote",
        write_result("footprint", {"sessions": args.sessions, "results": results}),
    )


if __name__ == "__main__":
    main()
