"""A client stand-in that ends its MCP server the way GitHub Copilot CLI and opencode do.

    python tree_killing_client.py SERVER_ARGV...

It launches SERVER_ARGV as its stdio MCP server (pipes, in the client's own process group and
session, as Node's `spawn` does by default), initializes, calls the `fake__pid` tool and prints
one JSON line: {"server": pid, "upstream": the tool's answer}. Then it waits for a line on its stdin
(the test's "exit now") and, as those clients do on exit, SIGTERMs its server's whole process
tree (every descendant found by walking /proc by parent pid), its server's process group and
every other process of its own session, prints {"killed": [pids]} and exits 0.

Stdlib only: it stands for a client, not for a part of mcpool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "tree-killing-client", "version": "1"},
    },
}


def processes() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) of every process, from /proc/<pid>/stat."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        # After the command's closing parenthesis: state, ppid, pgrp, session.
        found[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return found


def tree(root: int, table: dict[int, tuple[int, int, int]]) -> list[int]:
    """`root` and every descendant of it by parent pid."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def send(proc: subprocess.Popen[bytes], message: dict[str, object]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def answer(proc: subprocess.Popen[bytes], request_id: int) -> dict[str, object]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the server closed its stdout before answering {request_id}")
        message = json.loads(line)
        if message.get("id") == request_id and "method" not in message:
            return message  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    send(server, INIT)
    answer(server, 1)
    send(server, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"name": "fake__pid", "arguments": {}}
    send(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    result = answer(server, 2)["result"]
    upstream = int(result["content"][0]["text"])  # type: ignore[index]
    print(json.dumps({"server": server.pid, "upstream": upstream}), flush=True)

    sys.stdin.readline()  # the test says when to exit
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group and session kills reach us too
    table = processes()
    killed = []
    for pid in tree(server.pid, table):
        try:
            os.kill(pid, signal.SIGTERM)
            killed.append(pid)
        except ProcessLookupError:
            pass
    with contextlib.suppress(KeyError, ProcessLookupError):
        os.killpg(table[server.pid][1], signal.SIGTERM)
    me = os.getpid()
    own_session = os.getsid(0)
    for pid, (_, _, sid) in processes().items():
        if sid == own_session and pid != me:
            try:
                os.kill(pid, signal.SIGTERM)
                killed.append(pid)
            except ProcessLookupError:
                pass
    server.wait()
    print(json.dumps({"killed": sorted(set(killed))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
