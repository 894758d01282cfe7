"""Fan-out: an upstream list_changed with 500 tools re-projected for 100 sessions.

100 initialized sessions share one upstream (fake_upstream.py). One more session calls its
`set_tools` tool with 500 fresh names; the upstream sends notifications/tools/list_changed, the
daemon re-lists (509 tools with the built-ins), re-projects every session's view, and notifies
each session whose view changed. Measured from the set_tools call: the last session's
list_changed, and the last session's re-read tools/list (each session asks for the list the
moment its notification arrives, as clients do). Median and max over the trials.

    .venv/bin/python tools/bench/fanout.py [--sessions 100] [--tools 500] [--trials 9]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import time
from typing import Any

from _common import Daemon, fake, median, table, write_result

TIMEOUT = 60.0


def run_trial(
    trigger: socket.socket, socks: list[socket.socket], names: list[str], n: int
) -> tuple[float, float, int]:
    sel = selectors.DefaultSelector()
    state: dict[int, dict[str, Any]] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, s)
        state[s.fileno()] = {"buf": b"", "notified": None, "listed": None}
    call = {
        "jsonrpc": "2.0",
        "id": 90_000 + n,
        "method": "tools/call",
        "params": {"name": "f__set_tools", "arguments": {"names": names}},
    }
    t0 = time.perf_counter()
    trigger.sendall(json.dumps(call).encode() + b"\n")
    deadline = t0 + TIMEOUT
    pending = len(socks)
    tools_seen = 0
    while pending:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{pending} sessions never got their list after {TIMEOUT} s")
        for key, _ in sel.select(timeout=1.0):
            s: socket.socket = key.data
            st = state[s.fileno()]
            try:
                data = s.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("the daemon closed a session")
            *lines, st["buf"] = (st["buf"] + data).split(b"\n")
            for line in lines:
                if b"notifications/tools/list_changed" in line and st["notified"] is None:
                    st["notified"] = time.perf_counter() - t0
                    s.sendall(b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}\n')
                elif line.startswith(b'{"jsonrpc":"2.0","id":7,') and st["listed"] is None:
                    st["listed"] = time.perf_counter() - t0
                    tools_seen = len(json.loads(line)["result"]["tools"])
                    pending -= 1
    sel.close()
    for s in socks:
        s.setblocking(True)
    # The trigger's own answer: read it so the next trial starts clean.
    trigger.settimeout(TIMEOUT)
    buf = b""
    while b'"id":%d' % (90_000 + n) not in buf:
        buf += trigger.recv(1 << 20)
    return (
        max(st["notified"] for st in state.values()),
        max(st["listed"] for st in state.values()),
        tools_seen,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--tools", type=int, default=500)
    ap.add_argument("--trials", type=int, default=9)
    args = ap.parse_args()
    daemon = Daemon({"f": fake()}, {"drainGrace": 600})
    socks: list[socket.socket] = []
    notified: list[float] = []
    listed: list[float] = []
    seen = 0
    try:
        trigger = daemon.session("trigger")
        socks = [daemon.session(f"f{i}") for i in range(args.sessions)]
        for trial in range(args.trials + 1):  # trial 0 is a warm-up
            names = [f"t{trial}_{i}" for i in range(args.tools)]
            n, lst, seen = run_trial(trigger, socks, names, trial)
            if trial:
                notified.append(n)
                listed.append(lst)
    finally:
        for s in socks:
            s.close()
        daemon.stop()
    rows = [
        [
            "last list_changed received",
            f"{median(notified) * 1e3:.1f}",
            f"{max(notified) * 1e3:.1f}",
        ],
        ["last tools/list re-read", f"{median(listed) * 1e3:.1f}", f"{max(listed) * 1e3:.1f}"],
    ]
    print(table(["from the upstream's set_tools call to", "median ms", "max ms"], rows))
    print(
        f"({args.sessions} sessions, {args.tools + 9} tools per view (first page of {seen} "
        f"re-read), {args.trials} trials, {os.cpu_count()} cores)"
    )
    print(
        "wrote",
        write_result(
            "fanout",
            {
                "sessions": args.sessions,
                "tools": args.tools + 9,
                "first_page": seen,
                "trials": args.trials,
                "last_notification_ms": {
                    "median": median(notified) * 1e3,
                    "max": max(notified) * 1e3,
                },
                "last_relist_ms": {"median": median(listed) * 1e3, "max": max(listed) * 1e3},
            },
        ),
    )


if __name__ == "__main__":
    main()
