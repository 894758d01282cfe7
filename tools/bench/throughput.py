"""Throughput: tools/call per second through one daemon with 1, 10 and 100 sessions.

One fast upstream (fake_upstream.py, FAKE_INLINE=1) shared by every session. Sequential: each
session has one call outstanding and sends the next when the answer arrives. Pipelined: each
session keeps WINDOW calls outstanding. The client is one selector loop over raw sockets that
counts answer lines without parsing them (one in every 1000 is parsed and checked), so it stays
cheap next to the daemon; client, daemon and upstream share this machine's cores. The daemon's
CPU time per call comes from /proc (psutil). Also shown: the upstream alone over its pipes, the
ceiling any relay in front of it can reach. Target (issue 9): at least 15,000 calls/s pipelined.

    .venv/bin/python tools/bench/throughput.py [--seconds S] [--window W]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from typing import Any

import psutil
from _common import FAKE, FAST, Daemon, LineConn, fake, table, write_result

TARGET_PIPELINED = 15_000
REQUEST = (
    b'{"jsonrpc":"2.0","id":%d,"method":"tools/call",'
    b'"params":{"name":"%s","arguments":{"text":"x"}}}\n'
)


class _Stream:
    """One session (or the upstream's pipes): send lines, count answer lines."""

    def __init__(self, rfd: int, wfd: int, tool: bytes) -> None:
        self.rfd, self.wfd, self.tool = rfd, wfd, tool
        self.next_id = 1000
        self.outstanding = 0
        self.tail = b""

    def send(self, k: int) -> None:
        start = self.next_id
        self.next_id += k
        data = b"".join(REQUEST % (i, self.tool) for i in range(start, start + k))
        while data:
            data = data[os.write(self.wfd, data) :]
        self.outstanding += k


def drive(streams: list[_Stream], window: int, seconds: float) -> tuple[int, float]:
    """Keep `window` calls outstanding per stream for `seconds`; (answers, elapsed)."""
    sel = selectors.DefaultSelector()
    for st in streams:
        os.set_blocking(st.rfd, False)
        sel.register(st.rfd, selectors.EVENT_READ, st)
        st.send(window)
    done = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    sending = True
    while sending or any(st.outstanding for st in streams):
        now = time.perf_counter()
        if sending and now >= stop_at:
            sending = False
            elapsed = now - t0
            counted = done
        if not sending and now > stop_at + 30:
            raise RuntimeError("answers still missing 30 s after the run")
        for key, _ in sel.select(timeout=1.0):
            st: _Stream = key.data
            try:
                data = os.read(st.rfd, 1 << 18)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("a session was closed by the daemon")
            k = data.count(b"\n")
            if k:
                lines = (st.tail + data).split(b"\n")
                st.tail = lines[-1]
                if (done // 1000) != ((done + k) // 1000):
                    msg = json.loads(lines[0])
                    if "result" not in msg:
                        raise RuntimeError(f"a call failed: {msg}")
            else:
                st.tail += data
            st.outstanding -= k
            done += k
            if sending:
                st.send(k)
    sel.close()
    for st in streams:
        os.set_blocking(st.rfd, True)
    return counted, elapsed


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument(
        "--window", type=int, default=32, help="outstanding calls per session, pipelined"
    )
    args = ap.parse_args()
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}

    # The upstream alone: the ceiling for any relay in front of it.
    up = subprocess.Popen(
        [sys.executable, str(FAKE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FAST},
    )
    LineConn(up.stdout, up.stdin).handshake_and_list()
    assert up.stdout is not None
    assert up.stdin is not None
    for mode, window in (("sequential", 1), ("pipelined", args.window)):
        st = _Stream(up.stdout.fileno(), up.stdin.fileno(), b"echo")
        n, el = drive([st], window, args.seconds)
        results[f"upstream alone/{mode}"] = {"calls_per_s": n / el}
        rows.append(["upstream alone", 1, mode, f"{n / el:,.0f}", "", ""])
    up.kill()
    up.wait()

    daemon = Daemon({"f": fake(**FAST)}, {"drainGrace": 600})
    socks: list[socket.socket] = []
    try:
        for sessions in (1, 10, 100):
            while len(socks) < sessions:
                socks.append(daemon.session(f"t{len(socks)}"))
            streams = [_Stream(s.fileno(), s.fileno(), b"f__echo") for s in socks]
            drive(streams, 1, 0.3)  # warm-up
            for mode, window in (("sequential", 1), ("pipelined", args.window)):
                c0 = cpu(daemon.proc.pid)
                n, el = drive(streams, window, args.seconds)
                per_call_us = (cpu(daemon.proc.pid) - c0) / max(n, 1) * 1e6
                rate = n / el
                verdict = ""
                if mode == "pipelined":
                    verdict = (
                        "ok" if rate >= TARGET_PIPELINED else "MISS"
                    ) + f" (>= {TARGET_PIPELINED:,})"
                results[f"mcpool/{sessions}/{mode}"] = {
                    "sessions": sessions,
                    "mode": mode,
                    "window": window,
                    "calls_per_s": rate,
                    "daemon_cpu_us_per_call": per_call_us,
                }
                rows.append(
                    ["mcpool socket", sessions, mode, f"{rate:,.0f}", f"{per_call_us:.0f}", verdict]
                )
    finally:
        for s in socks:
            s.close()
        daemon.stop()
    print(table(["path", "sessions", "mode", "calls/s", "daemon CPU us/call", "target"], rows))
    print(f"(pipelined window: {args.window} calls per session; {args.seconds:g} s per row)")
    print(
        "wrote",
        write_result(
            "throughput", {"seconds": args.seconds, "window": args.window, "results": results}
        ),
    )


if __name__ == "__main__":
    main()
