"""CPU per relayed call: where a relay's time goes, as opposed to how long a call waits.

The latency benchmark measures wall time, which mixes a relay's own work with the machine's
wake-up latency. This one reads the relay process's user+system CPU (/proc/PID/stat) across
sequential trivial calls, for the reference relays of `_relay.py` (a `selectors` loop; a trio
loop with mcpool's I/O pattern and a watchfiles watcher, as the daemon runs) and for the daemon
with a client on its socket. The difference between the trio reference and mcpool is mcpool's
own cost per call; between the two references, the event loop's.

    .venv/bin/python tools/bench/cpu.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
from _common import FAST, Daemon, fake, table, write_result
from latency import reference

WARMUP = 2000


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(call: Callable[[dict[str, Any]], Any], tool: str, pid: int, n: int) -> dict[str, float]:
    def msg(i: int) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"text": "x"}},
        }

    for i in range(WARMUP):
        call(msg(i))
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    for i in range(n):
        call(msg(i))
    t1, cpu1 = time.perf_counter(), cpu_seconds(pid)
    return {"cpu_us": (cpu1 - cpu0) / n * 1e6, "wall_us": (t1 - t0) / n * 1e6}


def relay_pid(mode: str) -> int:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(arg.endswith("_relay.py") for arg in cmdline) and mode in cmdline:
            return int(proc.pid)
    raise RuntimeError(f"no {mode} relay process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30_000)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    workdir = tempfile.mkdtemp(prefix="mcpool-cpu-")
    for mode in ("bare", "trio-watch"):
        path = reference(mode, workdir)
        try:
            results[f"reference relay ({mode})"] = measure(
                path.call, path.tool, relay_pid(mode), args.calls
            )
        finally:
            path.cleanup()
    daemon = Daemon({"f": fake(**FAST)})
    try:
        sock, conn = daemon.connect()
        conn.handshake_and_list()
        results["mcpool daemon (socket client)"] = measure(
            conn.call, "f__echo", daemon.proc.pid, args.calls
        )
        sock.close()
    finally:
        daemon.stop()
    rows = [[name, f"{r['cpu_us']:.1f}", f"{r['wall_us']:.1f}"] for name, r in results.items()]
    print(table(["relay process", "CPU us/call", "wall us/call (client included)"], rows))
    print("wrote", write_result("cpu", {"calls": args.calls, "results": results}))


if __name__ == "__main__":
    main()
