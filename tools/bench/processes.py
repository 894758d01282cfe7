"""Processes and memory for 10 sessions with the same 5 servers: mcpool versus no sharing.

The 5 servers are the real peers (server-everything, server-filesystem, server-memory,
mcp-server-time, mcp-server-git; `--fake` uses fake_upstream.py instead). Without mcpool every
session spawns its own copy of each (10 x 5 processes). With mcpool the 10 sessions are
`mcpool attach` bridges, as editors launch them, on one daemon that runs each server once; the
bridges are counted too. Every process is initialized and has answered tools/list when counted.
RSS double-counts pages shared between processes (the interpreter, node's binary); USS (pages
only that process holds) does not, so both are shown.

    .venv/bin/python tools/bench/processes.py [--sessions 10] [--fake]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import psutil
from _common import Daemon, LineConn, fake, kill_tree, peers, table, write_result


def servers(use_fake: bool, workdir: str) -> dict[str, dict[str, Any]]:
    if use_fake:
        return {f"s{i}": fake(FAKE_INSTRUCTIONS=str(i)) for i in range(5)}
    p = peers()
    return {
        "everything": {"command": "node", "args": [p["PEER_EVERYTHING_JS"], "stdio"]},
        "filesystem": {"command": "node", "args": [p["PEER_FILESYSTEM_JS"], workdir]},
        "memory": {
            "command": "node",
            "args": [p["PEER_MEMORY_JS"]],
            "env": {"MEMORY_FILE_PATH": os.path.join(workdir, "memory.jsonl")},
        },
        "time": {"command": p["PEER_VENV"] + "/bin/mcp-server-time", "args": []},
        "git": {
            "command": p["PEER_VENV"] + "/bin/mcp-server-git",
            "args": ["--repository", str(os.path.dirname(os.path.abspath(__file__)))],
        },
    }


def tally(roots: list[int]) -> tuple[int, int, int]:
    """(process count, total RSS, total USS) over the roots and all their descendants."""
    procs: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        procs[pid] = p
        for c in p.children(recursive=True):
            procs[c.pid] = c
    rss = uss = 0
    for p in procs.values():
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        uss += info.uss
    return len(procs), rss, uss


def spawn(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], LineConn]:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )
    return proc, LineConn(proc.stdout, proc.stdin)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--fake", action="store_true")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="mcpool-bench-proc-")
    specs = servers(args.fake, workdir)
    results: dict[str, Any] = {}

    # Without sharing: every session starts every server.
    own: list[subprocess.Popen[bytes]] = []
    try:
        conns = []
        for _ in range(args.sessions):
            for spec in specs.values():
                proc, conn = spawn([spec["command"], *spec["args"]], spec.get("env", {}))
                own.append(proc)
                conns.append(conn)
        for conn in conns:  # started together; each must have answered before counting
            conn.handshake_and_list()
        results["own"] = dict(
            zip(("processes", "rss", "uss"), tally([p.pid for p in own]), strict=True)
        )
    finally:
        for p in own:
            kill_tree(p)

    daemon = Daemon(specs, {"drainGrace": 600})
    bridges: list[subprocess.Popen[bytes]] = []
    try:
        exe = os.path.join(os.path.dirname(sys.executable), "mcpool")
        for _ in range(args.sessions):
            proc, conn = spawn(
                [exe, "attach", "--socket", daemon.sock, "--settings", daemon.config], daemon.env
            )
            bridges.append(proc)
            conn.handshake_and_list()
        n, rss, uss = tally([daemon.proc.pid, *(b.pid for b in bridges)])
        dn, drss, duss = tally([daemon.proc.pid])
        results["mcpool"] = {
            "processes": n,
            "rss": rss,
            "uss": uss,
            "daemon_and_upstreams": {"processes": dn, "rss": drss, "uss": duss},
        }
    finally:
        for b in bridges:
            kill_tree(b)
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    mb = 2**20
    o, m = results["own"], results["mcpool"]
    d = m["daemon_and_upstreams"]
    rows = [
        [
            "each session spawns its own",
            o["processes"],
            f"{o['rss'] / mb:.0f}",
            f"{o['uss'] / mb:.0f}",
        ],
        [
            "mcpool (daemon, upstreams, bridges)",
            m["processes"],
            f"{m['rss'] / mb:.0f}",
            f"{m['uss'] / mb:.0f}",
        ],
        [
            "  of which daemon + upstreams",
            d["processes"],
            f"{d['rss'] / mb:.0f}",
            f"{d['uss'] / mb:.0f}",
        ],
        [
            "ratio",
            f"{o['processes'] / m['processes']:.1f}x",
            f"{o['rss'] / m['rss']:.1f}x",
            f"{o['uss'] / m['uss']:.1f}x",
        ],
    ]
    print(table(["", "processes", "RSS MiB", "USS MiB"], rows))
    print(f"({args.sessions} sessions x {len(specs)} servers: {', '.join(specs)})")
    print(
        "wrote",
        write_result(
            "processes",
            {
                "sessions": args.sessions,
                "servers": list(specs),
                "fake": args.fake,
                "results": results,
            },
        ),
    )


if __name__ == "__main__":
    main()
