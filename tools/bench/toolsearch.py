"""Context budget (issue 31): the tool definitions a 50-server session sends the model each turn,
with mcpool's tool search and without it.

50 fake stdio servers of `--tools` tools each (tools/fake_upstream.py; every description padded
to about `--description` bytes, as real servers' are), one daemon, two sessions: one that says it
is Codex (no search of its own: served mcpool's search under "toolSearch": "auto") and one that
says it is Claude Code (its own search: the whole list). Per session: the tools listed, the bytes
of the encoded list (what a client puts in every model request), about a quarter of that in
tokens; and, for the search, the bytes one search answer adds when the model looks for a tool.

    .venv/bin/python tools/bench/toolsearch.py [--servers 50] [--tools 20] [--description 400]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from _common import INIT, Daemon, LineConn, fake, table, write_result

BYTES_PER_TOKEN = 4  # a rough figure for English prose and JSON with OpenAI-style tokenizers


def session(daemon: Daemon, client: str) -> LineConn:
    _, conn = daemon.connect(client)
    # The bench's initialize, as `client` (which decides whether the search is served).
    conn.send(
        {**INIT, "params": {**INIT["params"], "clientInfo": {"name": client, "version": "1"}}}
    )
    conn.recv()
    conn.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return conn


def listed(conn: LineConn) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"cursor": cursor} if cursor else {}
        reply = conn.call({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": params})
        tools += reply["result"]["tools"]
        cursor = reply["result"].get("nextCursor")
        if not cursor:
            return tools


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--description", type=int, default=400)
    args = parser.parse_args()
    pad = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for i in range(args.tools):
            text = f"Tool number {i}: does its own thing well. {pad}"[: args.description]
            f.write(f"tool_{i}={text}\n")
        descriptions = f.name
    servers = {
        f"s{n}": fake(FAKE_TOOL_COUNT=args.tools, FAKE_DESCRIPTION_FILE=descriptions)
        for n in range(args.servers)
    }
    daemon = Daemon(servers, {"startupBudget": 30, "toolSearch": "auto"}, start_timeout=60)
    try:
        rows = []
        data: dict[str, Any] = {}
        for client, label in (("claude-code", "without (whole list)"), ("codex", "with search")):
            conn = session(daemon, client)
            tools = listed(conn)
            size = len(json.dumps(tools, separators=(",", ":")).encode())
            extra = ""
            if any(t["name"] == "mcpool_search_tools" for t in tools):
                found = conn.call(
                    {
                        "jsonrpc": "2.0",
                        "id": 3,
                        "method": "tools/call",
                        "params": {
                            "name": "mcpool_search_tools",
                            "arguments": {"query": "tool number 7"},
                        },
                    }
                )
                extra = str(len(found["result"]["content"][0]["text"].encode()))
            rows.append([label, len(tools), size, size // BYTES_PER_TOKEN, extra or "-"])
            data[client] = {"tools": len(tools), "bytes": size, "search_answer_bytes": extra}
        print(
            f"{args.servers} servers x {args.tools} tools (+9 built-in each), descriptions "
            f"about {args.description} B"
        )
        print(
            table(
                ["session", "tools listed", "bytes per turn", "~tokens", "one search answer B"],
                rows,
            )
        )
        write_result("toolsearch", data)
    finally:
        daemon.stop()
        os.unlink(descriptions)


if __name__ == "__main__":
    main()
