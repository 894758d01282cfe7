"""Per-call overhead: a trivial tools/call, directly over stdio versus through each relay.

One fast upstream (tools/fake_upstream.py with FAKE_INLINE=1, `echo`), one raw newline-JSON (or
raw HTTP) client with no SDK, so the client's own cost is the same small constant in every row.
Paths, all measured in one run and interleaved in rounds so drift hits them alike:

- direct      the upstream spawned by the client, over its stdin/stdout
- reference   bare byte relays on a Unix socket (tools/bench/_relay.py): a `selectors` loop and
              a trio loop with mcpool's I/O pattern, no parsing: the floor of any relay process
- socket      a client on mcpool's Unix socket
- attach      through `mcpool attach` (the stdio bridge) to the same daemon
- mcp-proxy   (PyPI) `mcp-proxy --port P -- CMD`: its streamable-HTTP endpoint, and through its
              own stdio client (`mcp-proxy --transport streamablehttp URL`), as an editor would
- supergateway (npm) `--stdio CMD --outputTransport streamableHttp --stateful`: HTTP, and through
              its own stdio client (`--streamableHttp URL`)
- mcp-hub     (npm) its unified endpoint (legacy SSE at /mcp); it has no stdio client, so the
              stdio row goes through mcp-proxy's SSE client

A proxy that cannot be started here gets a row saying why. Targets (issue 9): mcpool adds at
most 0.12 ms median on the socket, 0.15 ms through attach, p99 at most 0.4 ms.
Prints a table, writes tools/bench/results/latency.json.

    .venv/bin/python tools/bench/latency.py [--calls N] [--rounds R] [--no-peers]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    FAKE,
    FAST,
    LOOPBACK_JS,
    Daemon,
    LineConn,
    SseConn,
    StreamableHttpConn,
    bench_peers,
    fake,
    free_port,
    kill_tree,
    median,
    pct,
    table,
    wait_http,
    write_result,
)

TARGET_SOCKET_MS = 0.12
TARGET_ATTACH_MS = 0.15
TARGET_P99_MS = 0.4

Caller = Callable[[dict[str, Any]], dict[str, Any]]


class Path_:
    """One way of reaching the upstream: a call function and what to clean up."""

    def __init__(self, name: str, tool: str, call: Caller, cleanup: Callable[[], None]) -> None:
        self.name = name
        self.tool = tool
        self.call = call
        self.cleanup = cleanup
        self.samples: list[float] = []
        self.next_id = 100

    def run(self, n: int) -> None:
        call, tool = self.call, self.tool
        for _ in range(n):
            self.next_id += 1
            msg = {
                "jsonrpc": "2.0",
                "id": self.next_id,
                "method": "tools/call",
                "params": {"name": tool, "arguments": {"text": "x"}},
            }
            t0 = time.perf_counter()
            reply = call(msg)
            self.samples.append(time.perf_counter() - t0)
            if "result" not in reply:
                raise RuntimeError(f"{self.name}: {reply}")


def _stdio(
    argv: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], LineConn]:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    return proc, LineConn(proc.stdout, proc.stdin)


def direct() -> Path_:
    proc, conn = _stdio([sys.executable, str(FAKE)], FAST)
    conn.handshake_and_list()
    return Path_("direct stdio", "echo", conn.call, lambda: kill_tree(proc))


def start_reference(
    mode: str, sock_path: str, wrapper: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], Any, LineConn]:
    """A reference relay of `_relay.py` (`wrapper` before it, e.g. callgrind) in front of the
    fast fake, ready, with a client connected and past the handshake: (relay, socket, conn)."""
    import socket

    relay = subprocess.Popen(
        [
            *(wrapper or []),
            sys.executable,
            os.path.join(os.path.dirname(__file__), "_relay.py"),
            mode,
            sock_path,
            "--",
            sys.executable,
            str(FAKE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FAST},
        start_new_session=True,
    )
    assert relay.stdout is not None
    relay.stdout.readline()  # "ready"
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    conn = LineConn(s.makefile("rb"), s.makefile("wb"))
    conn.handshake_and_list()
    return relay, s, conn


def reference(mode: str, workdir: str) -> Path_:
    relay, s, conn = start_reference(mode, os.path.join(workdir, f"relay-{mode}.sock"))

    def cleanup() -> None:
        s.close()
        kill_tree(relay)

    return Path_(f"reference relay ({mode})", "echo", conn.call, cleanup)


def mcpool_paths(daemon: Daemon) -> list[Path_]:
    sock, conn = daemon.connect()
    conn.handshake_and_list()
    bridge = os.path.join(os.path.dirname(sys.executable), "mcpool")
    proc, bconn = _stdio(
        [bridge, "attach", "--socket", daemon.sock, "--settings", daemon.config], daemon.env
    )
    bconn.handshake_and_list()
    return [
        Path_("mcpool socket", "f__echo", conn.call, sock.close),
        Path_("mcpool attach", "f__echo", bconn.call, lambda: kill_tree(proc)),
    ]


def _fake_cmd() -> list[str]:
    return [sys.executable, str(FAKE)]


def mcp_proxy(peers: dict[str, str], workdir: str) -> list[Path_]:
    port = free_port()
    server = subprocess.Popen(
        [
            peers["BENCH_MCP_PROXY"],
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--pass-environment",
            "--",
            *_fake_cmd(),
        ],
        env={**os.environ, **FAST},
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(workdir, "mcp-proxy.err"), "w"),  # noqa: SIM115
        start_new_session=True,
    )
    cleanups: list[Callable[[], None]] = [lambda: kill_tree(server)]
    try:
        wait_http(port, "/status")
        http = StreamableHttpConn(port, "/mcp")
        http.handshake_and_list()
        client, conn = _stdio(
            [
                peers["BENCH_MCP_PROXY"],
                "--transport",
                "streamablehttp",
                "--log-level",
                "WARNING",
                f"http://127.0.0.1:{port}/mcp",
            ]
        )
        cleanups.append(lambda: kill_tree(client))
        conn.handshake_and_list()
    except BaseException:
        for c in cleanups:
            c()
        raise
    return [
        Path_("mcp-proxy http", "echo", http.call, lambda: None),
        Path_("mcp-proxy stdio", "echo", conn.call, lambda: [c() for c in cleanups]),
    ]


def supergateway(peers: dict[str, str], workdir: str) -> list[Path_]:
    port = free_port()
    server = subprocess.Popen(
        [
            "node",
            "--require",
            str(LOOPBACK_JS),
            peers["BENCH_SUPERGATEWAY"],
            "--stdio",
            " ".join(_fake_cmd()),
            "--outputTransport",
            "streamableHttp",
            "--stateful",
            "--port",
            str(port),
            "--logLevel",
            "none",
        ],
        env={**os.environ, **FAST},
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(workdir, "supergateway.err"), "w"),  # noqa: SIM115
        start_new_session=True,
    )
    cleanups: list[Callable[[], None]] = [lambda: kill_tree(server)]
    try:
        wait_http(port, "/healthz")
        http = StreamableHttpConn(port, "/mcp")
        http.handshake_and_list()
        client, conn = _stdio(
            [
                "node",
                peers["BENCH_SUPERGATEWAY"],
                "--streamableHttp",
                f"http://127.0.0.1:{port}/mcp",
                "--logLevel",
                "none",
            ]
        )
        cleanups.append(lambda: kill_tree(client))
        conn.handshake_and_list()
    except BaseException:
        for c in cleanups:
            c()
        raise
    return [
        Path_("supergateway http", "echo", http.call, lambda: None),
        Path_("supergateway stdio", "echo", conn.call, lambda: [c() for c in cleanups]),
    ]


def mcp_hub(peers: dict[str, str], workdir: str) -> list[Path_]:
    port = free_port()
    home = Path(workdir) / "hub"
    # mcp-hub fetches a marketplace catalog from the internet at start unless its cache is
    # fresh; a fresh one-entry cache keeps it off the network (loopback only here).
    cache = home / "data" / "mcp-hub" / "cache"
    cache.mkdir(parents=True)
    (cache / "registry.json").write_text(
        json.dumps(
            {
                "registry": {
                    "version": "bench",
                    "generatedAt": 0,
                    "totalServers": 1,
                    "servers": [{"id": "none", "name": "none"}],
                },
                "lastFetchedAt": int(time.time() * 1000) + 3_600_000,
                "serverDocumentation": {},
            }
        )
    )
    config = home / "hub.json"
    config.write_text(json.dumps({"mcpServers": {"f": fake(**FAST)}}))
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
    }
    server = subprocess.Popen(
        [
            "node",
            "--require",
            str(LOOPBACK_JS),
            peers["BENCH_MCP_HUB"],
            "--port",
            str(port),
            "--config",
            str(config),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(workdir, "mcp-hub.err"), "w"),  # noqa: SIM115
        start_new_session=True,
    )
    cleanups: list[Callable[[], None]] = [lambda: kill_tree(server)]
    try:
        wait_http(port, "/api/health")
        deadline = time.monotonic() + 20
        while True:  # the hub answers before its endpoint and its servers are ready
            try:
                sse = SseConn(port, "/mcp")
                tools = sse.handshake_and_list()
            except (RuntimeError, OSError, EOFError):
                tools = 0
            if tools or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not tools:
            raise RuntimeError("mcp-hub listed no tools")
        client, conn = _stdio(
            [peers["BENCH_MCP_PROXY"], "--log-level", "WARNING", f"http://127.0.0.1:{port}/mcp"]
        )
        cleanups.append(lambda: kill_tree(client))
        conn.handshake_and_list()
    except BaseException:
        for c in cleanups:
            c()
        raise
    return [
        Path_("mcp-hub sse", "f__echo", sse.call, lambda: None),
        Path_("mcp-hub via mcp-proxy stdio", "f__echo", conn.call, lambda: [c() for c in cleanups]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000, help="per mcpool/direct path")
    ap.add_argument("--proxy-calls", type=int, default=1000, help="per proxy path")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()

    workdir = tempfile.mkdtemp(prefix="mcpool-bench-lat-")
    daemon = Daemon({"f": fake(**FAST)}, {"drainGrace": 600})
    paths: list[Path_] = []
    fast: set[str] = set()
    failures: dict[str, str] = {}
    try:
        paths.append(direct())
        paths.append(reference("bare", workdir))
        paths.append(reference("trio", workdir))
        paths.append(reference("trio-watch", workdir))
        paths += mcpool_paths(daemon)
        fast = {p.name for p in paths}
        if not args.no_peers:
            peers = bench_peers()
            for name, start in (
                ("mcp-proxy", mcp_proxy),
                ("supergateway", supergateway),
                ("mcp-hub", mcp_hub),
            ):
                try:
                    paths += start(peers, workdir)
                except Exception as exc:
                    failures[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
                    traceback.print_exc(file=sys.stderr)
        for p in paths:  # warm-up: JIT-less but caches, branch predictors, page faults
            p.run(200)
            p.samples.clear()
        for _ in range(args.rounds):
            for p in paths:
                p.run((args.calls if p.name in fast else args.proxy_calls) // args.rounds)
    finally:
        for p in paths:
            with contextlib.suppress(Exception):
                p.cleanup()
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    base = paths[0]
    b50, b99 = median(base.samples) * 1e3, pct(base.samples, 99) * 1e3
    rows, results = [], {}
    for p in paths:
        m50, m99 = median(p.samples) * 1e3, pct(p.samples, 99) * 1e3
        add50, add99 = m50 - b50, m99 - b99
        verdict = ""
        if p.name == "mcpool socket":
            verdict = "ok" if add50 <= TARGET_SOCKET_MS and add99 <= TARGET_P99_MS else "MISS"
            verdict += f" (<= {TARGET_SOCKET_MS} / {TARGET_P99_MS})"
        elif p.name == "mcpool attach":
            verdict = "ok" if add50 <= TARGET_ATTACH_MS and add99 <= TARGET_P99_MS else "MISS"
            verdict += f" (<= {TARGET_ATTACH_MS} / {TARGET_P99_MS})"
        results[p.name] = {
            "n": len(p.samples),
            "median_ms": m50,
            "p99_ms": m99,
            "added_median_ms": add50,
            "added_p99_ms": add99,
        }
        rows.append(
            [
                p.name,
                len(p.samples),
                f"{m50:.3f}",
                f"{m99:.3f}",
                "" if p is base else f"{add50:+.3f}",
                "" if p is base else f"{add99:+.3f}",
                verdict,
            ]
        )
    for name, why in failures.items():
        results[name] = {"error": why}
        rows.append([name, 0, "-", "-", "-", "-", f"not run: {why}"])
    print(
        table(["path", "calls", "median ms", "p99 ms", "added median", "added p99", "target"], rows)
    )
    print(
        "wrote",
        write_result("latency", {"calls": args.calls, "rounds": args.rounds, "results": results}),
    )


if __name__ == "__main__":
    main()
