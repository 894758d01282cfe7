"""What detaching the daemon and following escaped descendants cost (issue 26 items 1 and 7).

- cold start: `mcpool attach` with no daemon running, until its initialize is answered (the
  bridge starts the daemon detached and waits on its status pipe); settings without servers,
  so it is the daemon's own start. The daemon is stopped between runs.
- idle wake-ups: a daemon with one idle upstream, context switches of its event loop's thread
  over `--idle` seconds (nothing here may add a timer: the walk runs at close, the sweep at death).
- tree walk: `escaped_descendants` of a running upstream (Node's server-everything when the
  peers are installed, with its threads; else the fake), what each close adds.
- environment scan: `marked_processes` over this machine's /proc, what each close adds (in a
  worker thread) and what the guardian does once when the daemon dies.

`--baseline REV` also measures the cold start and idle wake-ups of another revision (exported
with `git archive`, imported ahead of this checkout), in the same rounds. An exported tree starts
slower on its own (about 60 ms here: compare `--baseline HEAD` with this checkout clean), so a
cold-start difference is read against that.

    .venv/bin/python tools/bench/detach.py [--runs N] [--idle S] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import FAKE, INIT, ROOT, peers, table, write_result
from cpu import export_revision

from mcpool.pool._guardian import ProcessSet, escaped_descendants, mark, marked_processes

ANSWER_TIMEOUT = 20.0
IDLE_ROUNDS = 3  # the idle time is split in rounds, interleaved between revisions


def _env(root: str, extra: dict[str, str]) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")},
        "XDG_STATE_HOME": os.path.join(root, "state"),
        "XDG_CONFIG_HOME": os.path.join(root, "config"),
        "XDG_CACHE_HOME": os.path.join(root, "cache"),
        **extra,
    }


def _places() -> tuple[str, str]:
    """A private folder for settings and state, and a socket path in a short one under /tmp.
    Not both under /tmp: the daemon watches the folders above its settings files, and /tmp
    churns with other work on a shared machine (each change a wake-up that is not ours)."""
    cache = os.path.expanduser("~/.cache")
    os.makedirs(cache, exist_ok=True)
    root = tempfile.mkdtemp(prefix="mcpool-bench-detach-", dir=cache)
    return root, os.path.join(tempfile.mkdtemp(prefix="mcpb"), "s", "daemon.sock")


def _stop(sock: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-c", "import sys; from mcpool.daemon._ctl import main; sys.exit(main())",
         "--socket", sock, "stop"],
        env=env, capture_output=True, timeout=ANSWER_TIMEOUT, check=False,
    )  # fmt: skip


def cold_start(extra: dict[str, str], settings: dict[str, Any] | None = None) -> float:
    """Seconds from launching `mcpool attach` (no daemon) to its initialize answer."""
    root, sock = _places()
    env = _env(root, extra)
    path = os.path.join(root, "settings.json")
    with open(path, "w") as f:
        json.dump({"mcpServers": settings or {}}, f)
    argv = [sys.executable, "-m", "mcpool", "attach", "--socket", sock, "--settings", path]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps(INIT).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        took = time.perf_counter() - began
        assert b'"protocolVersion"' in line, line
        return took
    finally:
        proc.kill()
        proc.wait()
        _stop(sock, env)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(os.path.dirname(os.path.dirname(sock)), ignore_errors=True)


def idle_wakeups(extra: dict[str, str], seconds: float) -> float:
    """Context switches per second of an idle daemon (all threads) serving one idle upstream."""
    root, sock = _places()
    env = _env(root, extra)
    settings = {"f": {"command": sys.executable, "args": [str(FAKE)]}}
    path = os.path.join(root, "settings.json")
    with open(path, "w") as f:
        json.dump({"mcpServers": settings}, f)
    argv = [sys.executable, "-m", "mcpool", "attach", "--socket", sock, "--settings", path]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps(INIT).encode() + b"\n")
        proc.stdin.flush()
        proc.stdout.readline()
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(sock)
        conn.sendall(b'{"jsonrpc":"2.0","id":1,"method":"mcpool/admin/status","params":{}}\n')
        pid = json.loads(conn.makefile().readline())["result"]["pid"]
        conn.close()
        time.sleep(1.0)  # settle after the attach
        before = _switches(pid)
        time.sleep(seconds)
        return (_switches(pid) - before) / seconds
    finally:
        proc.kill()
        proc.wait()
        _stop(sock, env)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(os.path.dirname(os.path.dirname(sock)), ignore_errors=True)


def _switches(pid: int) -> int:
    """Context switches of the event loop's thread (the main one): worker threads come and go
    (trio retires an idle one after 10 s), and their counts go with them."""
    total = 0
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def tree_walk(runs: int) -> tuple[str, int, float]:
    """(what, its thread count, median microseconds) of one `escaped_descendants` walk."""
    command = [sys.executable, str(FAKE)]
    what = "fake (python)"
    try:
        everything = peers().get("PEER_EVERYTHING_JS")
    except (OSError, subprocess.CalledProcessError):
        everything = None
    if everything and shutil.which("node"):
        command, what = ["node", everything, "stdio"], "server-everything (node)"
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # its threads are up
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        times = []
        for _ in range(runs * 20):
            held = ProcessSet()
            began = time.perf_counter()
            escaped_descendants(proc.pid, held)
            times.append(time.perf_counter() - began)
            held.close()
        return what, threads, statistics.median(times) * 1e6
    finally:
        proc.kill()
        proc.wait()


def environment_scan(runs: int) -> tuple[int, float]:
    """(processes on the machine, median milliseconds) of one `marked_processes` scan."""
    count = sum(1 for name in os.listdir("/proc") if name.isdigit())
    times = []
    for _ in range(runs * 5):
        began = time.perf_counter()
        marked_processes(mark("MCPOOL_UPSTREAM_ID", f"{os.getpid()}.1"))
        times.append(time.perf_counter() - began)
    return count, statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured")
    parser.add_argument("--baseline", metavar="REV", help="also measure this revision")
    args = parser.parse_args()
    revisions: list[tuple[str, dict[str, str]]] = [("this checkout", {})]
    if args.baseline:
        revisions.append((args.baseline, {"PYTHONPATH": export_revision(args.baseline)}))

    colds: dict[str, list[float]] = {name: [] for name, _ in revisions}
    for _ in range(args.runs):  # interleaved: load on the machine affects both alike
        for name, extra in revisions:
            colds[name].append(cold_start(extra))
    rounds: dict[str, list[float]] = {name: [] for name, _ in revisions}
    for _ in range(IDLE_ROUNDS):
        for name, extra in revisions:
            rounds[name].append(idle_wakeups(extra, args.idle / IDLE_ROUNDS))
    idles = {name: statistics.median(values) for name, values in rounds.items()}
    rows = []
    for name, _ in revisions:
        values = sorted(colds[name])
        rows.append([
            name,
            f"{statistics.median(values) * 1e3:.0f}",
            f"{values[int(len(values) * 0.9) - 1 if len(values) > 1 else 0] * 1e3:.0f}",
            f"{idles[name]:.2f}",
        ])  # fmt: skip
    print(table(["revision", "cold start ms (median)", "p90", "idle wake-ups/s"], rows))
    print()
    what, threads, walk_us = tree_walk(args.runs)
    count, sweep_ms = environment_scan(args.runs)
    print(
        table(
            ["measure", "value"],
            [
                [f"tree walk at close: {what}, {threads} threads", f"{walk_us:.0f} us"],
                [
                    f"environment scan (each close, the death sweep): {count} processes",
                    f"{sweep_ms:.1f} ms",
                ],
            ],
        )
    )
    path = write_result(
        "detach",
        {
            "cold_start_ms": {k: [round(v * 1e3, 1) for v in vs] for k, vs in colds.items()},
            "idle_wakeups_per_s": idles,
            "tree_walk_us": walk_us,
            "tree_walk_of": what,
            "environment_scan_ms": sweep_ms,
            "processes": count,
            "baseline": args.baseline,
        },
    )
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
