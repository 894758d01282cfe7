"""Another local user against a login's OAuth redirect listener (issue 26 item 2, X7).

The daemon's `CallbackListener` (pool/_oauth.py) runs here, in this process's trio loop, while
our own uid asks it one request at a time (a `GET` of a path it answers 404, which changes
nothing) and times each round trip. Phases, each `--seconds` long:

1. baseline  nobody else;
2. churn     another uid (made with `useradd`, as the tests do) connects, sends a callback
             with a state, and reconnects, as fast as `--churners` processes can;
3. held      that uid tries to hold `--held` connections open, opening a new one for each
             the listener closed: it holds none for long, each is closed unread when accepted.

Printed: the owner's p50 and p99 per phase, the other uid's connection attempts, and how many
of its connections were refused (every one that connected) in how many log lines (once a
minute per uid, and the rest when the listener closes).
Needs root (to make and be the other user) and /usr/bin/python3 for that user.

    .venv/bin/python tools/bench/oauth_callback.py [--seconds 3] [--churners 4] [--held 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import trio
from _common import median, pct, table, write_result

from mcpool.pool._oauth import CallbackListener

OTHER_USER = "mcpool-other"
SYSTEM_PYTHON = "/usr/bin/python3"

CHURN = textwrap.dedent(
    """
    import socket, sys, time
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /callback?code=theirs&state=s1 HTTP/1.1\\r\\n\\r\\n")
                s.recv(4096)
        except OSError:
            pass
        n += 1
    print(n)
    """
)

HOLD = textwrap.dedent(
    """
    import resource, selectors, socket, sys, time
    port, seconds, held = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    end, opened, live = time.monotonic() + seconds, 0, []
    while time.monotonic() < end:
        live = [s for s in live if s.fileno() >= 0]
        while len(live) < held and time.monotonic() < end:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                break
            s.setblocking(False)
            live.append(s)
            opened += 1
        # Drop the ones the listener closed, to open them again.
        for s in list(live):
            try:
                if s.recv(1) == b"":
                    s.close()
            except BlockingIOError:
                pass
            except OSError:
                s.close()
    print(opened)
    """
)


def other_user() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", OTHER_USER], check=True)
        entry = pwd.getpwnam(OTHER_USER)
    return entry.pw_uid, entry.pw_gid


async def owner_round_trips(port: int, seconds: float) -> list[float]:
    times: list[float] = []
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        began = trio.current_time()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
            while await stream.receive_some():
                pass
        times.append((trio.current_time() - began) * 1000)
    return times


async def main(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        sys.exit("needs root, to make and act as a second local user")
    uid, gid = other_user()
    scratch = Path(tempfile.mkdtemp(prefix="mcpool-bench-"))
    scratch.chmod(0o755)
    (scratch / "churn.py").write_text(CHURN)
    (scratch / "hold.py").write_text(HOLD)
    lines: list[dict[str, Any]] = []

    def log(level: str, msg: str, **fields: Any) -> None:
        lines.append({"msg": msg, **fields})

    listener = await CallbackListener.bind("bench", 0, exact=False, log=log)
    listener.gate.issue("http://as.invalid/authorize?state=s1")
    port = listener.port

    def run_as_other(script: str, *extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [SYSTEM_PYTHON, str(scratch / script), str(port), str(args.seconds), *extra],
            user=uid,
            group=gid,
            extra_groups=[],
            cwd=scratch,
            stdout=subprocess.PIPE,
        )

    rows: list[list[Any]] = []
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(listener.serve)
        for phase in ("baseline", "churn", "held"):
            procs = []
            if phase == "churn":
                procs = [run_as_other("churn.py") for _ in range(args.churners)]
            elif phase == "held":
                procs = [run_as_other("hold.py", str(args.held))]
            times = await owner_round_trips(port, args.seconds)
            attempts = 0
            for proc in procs:
                out, _ = await trio.to_thread.run_sync(proc.communicate)
                attempts += int(out or 0)
            p50, p99 = median(times), pct(times, 99)
            rows.append([phase, len(times), f"{p50:.3f}", f"{p99:.3f}", attempts])
            result[phase] = {"p50_ms": p50, "p99_ms": p99, "other_connections": attempts}
        nursery.cancel_scope.cancel()
    listener.close()  # reports the refusals not logged yet
    print(table(["phase", "owner requests", "p50 ms", "p99 ms", "other uid attempts"], rows))
    theirs = [line for line in lines if line.get("uid") == uid]
    refused = sum(line["count"] for line in theirs)
    print(f"the other uid's connections refused: {refused}, in {len(theirs)} log lines")
    write_result("oauth_callback", {"phases": result, "refused": refused, "log_lines": len(theirs)})
    print(json.dumps(theirs[:2], indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--churners", type=int, default=4)
    parser.add_argument("--held", type=int, default=2000)
    trio.run(main, parser.parse_args())
