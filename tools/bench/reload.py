"""Reload: a settings write to the last session's notifications/tools/list_changed.

N initialized sessions (default 20) read the daemon's config file, which holds one server
(fake_upstream.py). Each trial rewrites that file atomically (temp file + rename, as editors
save), toggling `excludeTools: ["echo"]`, so every session's view changes without any process
restarting (R2), and times until the last session got its list_changed.

The trigger: when the daemon watches its settings files, the write alone. A daemon that does not
(yet) is told to reload with the admin request `daemonctl reload` sends, right after the write,
over a socket opened beforehand (so no interpreter start is in the figure). `--trigger auto`
(default) tries the write alone first and falls back; the output says which was measured.

    .venv/bin/python tools/bench/reload.py [--sessions 20] [--trials 30]
                                          [--trigger auto|watch|admin]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import time
from pathlib import Path
from typing import Any

from _common import Daemon, LineConn, fake, median, pct, table, write_result

WATCH_PROBE = 3.0  # a watching daemon reloads well within this; silence means it does not watch
TIMEOUT = 30.0
PAUSE = 0.25  # between trials: longer than the watcher's debounce, so trials do not merge


def write_settings(path: str, exclude: bool) -> None:
    server: dict[str, Any] = fake()
    if exclude:
        server["excludeTools"] = ["echo"]
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps({"mcpServers": {"f": server}, "daemon": {"drainGrace": 600}}))
    os.replace(tmp, path)


def wait_all(socks: list[socket.socket], t0: float, timeout: float) -> float | None:
    """Seconds from t0 to the last session's tools list_changed, or None on timeout."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, s)
    got: dict[int, float] = {}
    deadline = time.perf_counter() + timeout
    try:
        while len(got) < len(socks):
            if time.perf_counter() > deadline:
                return None
            for key, _ in sel.select(timeout=0.5):
                s = key.data
                try:
                    data = s.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("the daemon closed a session")
                if b"notifications/tools/list_changed" in data and s.fileno() not in got:
                    got[s.fileno()] = time.perf_counter() - t0
        return max(got.values())
    finally:
        sel.close()
        for s in socks:
            s.setblocking(True)


def admin_conn(daemon: Daemon) -> tuple[socket.socket, LineConn]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(daemon.sock)
    return s, LineConn(s.makefile("rb"), s.makefile("wb"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--trigger", choices=("auto", "watch", "admin"), default="auto")
    args = ap.parse_args()
    daemon = Daemon({"f": fake()}, {"drainGrace": 600})
    socks: list[socket.socket] = []
    times: list[float] = []
    trigger = args.trigger
    exclude = False
    try:
        socks = [daemon.session(f"r{i}") for i in range(args.sessions)]
        if trigger in ("auto", "watch"):
            exclude = not exclude
            t0 = time.perf_counter()
            write_settings(daemon.config, exclude)
            if wait_all(socks, t0, WATCH_PROBE) is not None:
                trigger = "watch"
            elif trigger == "watch":
                raise SystemExit("the daemon did not reload on a settings write")
            else:
                trigger = "admin"
                daemon.admin("reload")  # catch up with the probe's write
                wait_all(socks, time.perf_counter(), TIMEOUT)
        for _ in range(args.trials):
            time.sleep(PAUSE)
            exclude = not exclude
            s = conn = None
            if trigger == "admin":
                s, conn = admin_conn(daemon)
            t0 = time.perf_counter()
            write_settings(daemon.config, exclude)
            if conn is not None:
                conn.send(
                    {"jsonrpc": "2.0", "id": 1, "method": "mcpool/admin/reload", "params": {}}
                )
            elapsed = wait_all(socks, t0, TIMEOUT)
            if conn is not None and s is not None:
                conn.recv()
                s.close()
            if elapsed is None:
                raise RuntimeError("a reload did not reach every session")
            times.append(elapsed)
    finally:
        for sk in socks:
            sk.close()
        daemon.stop()
    how = (
        "the write alone (the daemon watches its settings files)"
        if trigger == "watch"
        else "write + the admin reload request `daemonctl reload` sends (the daemon did not "
        "react to the write alone)"
    )
    rows = [
        [
            "write -> last list_changed",
            f"{median(times) * 1e3:.1f}",
            f"{pct(times, 99) * 1e3:.1f}",
            f"{max(times) * 1e3:.1f}",
        ]
    ]
    print(table(["", "median ms", "p99 ms", "max ms"], rows))
    print(f"({args.sessions} sessions, {args.trials} trials; trigger: {how})")
    print(
        "wrote",
        write_result(
            "reload",
            {
                "sessions": args.sessions,
                "trials": args.trials,
                "trigger": trigger,
                "median_ms": median(times) * 1e3,
                "p99_ms": pct(times, 99) * 1e3,
                "max_ms": max(times) * 1e3,
            },
        ),
    )


if __name__ == "__main__":
    main()
