"""Where the daemon's time goes on the hot path: py-spy on a daemon serving sequential calls.

Starts a private daemon with the fast upstream, drives `--seconds` of sequential tools/call from
one raw socket session (the latency benchmark's socket path), and samples the daemon with py-spy
(`--nonblocking`, idle samples dropped). Prints the functions by self time and by inclusive
time, and writes the collapsed stacks (for flamegraph tools) and a summary JSON to
tools/bench/results/. On a loaded machine py-spy counts a thread woken from epoll but waiting
for a CPU as busy in `get_events`; read the shares of the other functions relative to each other.

`--cprofile` runs the daemon under cProfile instead (deterministic call counts and per-call
times, with cProfile's own overhead on every Python call) and prints the top functions by total
and by cumulative time, per relayed call.

    .venv/bin/python tools/bench/profile_daemon.py [--seconds 10] [--rate 2000] [--cprofile]
                                           [--mode sequential|pipelined]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import threading
import time
from typing import Any

from _common import FAST, RESULTS, Daemon, bench_peers, fake, table, write_result
from throughput import _Stream, drive


def frame_name(frame: str) -> str:
    # py-spy raw frames look like "handle_line (mcpool/session/_session.py:331)".
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "mcpool/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


def cprofile(args: argparse.Namespace) -> None:
    import pstats

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"cprofile-{args.mode}.prof"
    daemon = Daemon(
        {"f": fake(**FAST)}, {"drainGrace": 600}, python_args=["-m", "cProfile", "-o", str(out)]
    )
    try:
        sock = daemon.session("profile")
        st = _Stream(sock.fileno(), sock.fileno(), b"f__echo")
        n, el = drive([st], 1 if args.mode == "sequential" else 32, args.seconds)
        sock.close()
    finally:
        daemon.stop()
    print(f"{args.mode}: {n:,} calls in {el:.1f} s under cProfile ({n / el:,.0f}/s)")
    stats = pstats.Stats(str(out))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows_t, rows_c = [], []
    entries = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        short = path.split("site-packages/")[-1].split("/work/main/")[-1]
        entries.append((f"{func} ({short}:{line})", ncalls, tottime, cumtime))
    for name, ncalls, tottime, _ in sorted(entries, key=lambda e: -e[2])[: args.top]:
        rows_t.append([f"{tottime / n * 1e6:.1f}", f"{ncalls / n:.2f}", name])
    for name, ncalls, _, cumtime in sorted(entries, key=lambda e: -e[3])[: args.top]:
        rows_c.append([f"{cumtime / n * 1e6:.1f}", f"{ncalls / n:.2f}", name])
    print(table(["own us/call", "calls/call", "function"], rows_t))
    print()
    print(table(["cumulative us/call", "calls/call", "function"], rows_c))
    print("profile:", out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--mode", choices=("sequential", "pipelined"), default="sequential")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cprofile", action="store_true")
    args = ap.parse_args()
    if args.cprofile:
        cprofile(args)
        return
    py_spy = bench_peers()["BENCH_PY_SPY"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"profile-{args.mode}.collapsed"
    daemon = Daemon({"f": fake(**FAST)}, {"drainGrace": 600})
    try:
        sock = daemon.session("profile")
        st = _Stream(sock.fileno(), sock.fileno(), b"f__echo")
        drive([st], 1, 0.5)  # warm-up
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(daemon.proc.pid),
                "--rate",
                str(args.rate),
                "--duration",
                str(int(args.seconds) + 1),
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)  # py-spy attaches
        result: dict[str, float] = {}

        def load() -> None:
            n, el = drive([st], 1 if args.mode == "sequential" else 32, args.seconds)
            result["rate"] = n / el

        t = threading.Thread(target=load)
        t.start()
        t.join()
        _, err = spy.communicate(timeout=60)
        if spy.returncode != 0:
            raise SystemExit(f"py-spy failed: {err.decode()[-500:]}")
        sock.close()
    finally:
        daemon.stop()

    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if f]
        # Strip the process/thread header py-spy puts first.
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    rows_self = [[f"{c / total * 100:.1f}%", name] for name, c in self_time.most_common(args.top)]
    rows_incl = [[f"{c / total * 100:.1f}%", name] for name, c in inclusive.most_common(args.top)]
    print(f"{args.mode}: {result.get('rate', 0):,.0f} calls/s while sampled, {total} samples")
    print(table(["self", "function"], rows_self))
    print()
    print(table(["inclusive", "function"], rows_incl))
    print("collapsed stacks:", out)
    print(
        "wrote",
        write_result(
            f"profile-{args.mode}",
            {
                "calls_per_s": result.get("rate"),
                "samples": total,
                "self": {k: v / total for k, v in self_time.most_common(60)},
                "inclusive": {k: v / total for k, v in inclusive.most_common(60)},
            },
        ),
    )


if __name__ == "__main__":
    main()
