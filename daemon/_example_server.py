"""A small example MCP server over stdio, shipped for `mcpool demo` and for trying mcpool out.

Standard library only, so it starts on any machine with the interpreter and nothing else; run it
as `python path/to/_example_server.py` (mcpool never imports it). It keeps notes in memory and
speaks the handshake era (`initialize`), newline-delimited JSON-RPC on stdin/stdout.

Tools: add_note, list_notes, search_notes, delete_note, server_info (its pid, so one can see
which process answered). Prompt: summarize_notes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STARTED = time.time()

Json = dict[str, Any]


def _schema(**properties: str) -> Json:
    return {
        "type": "object",
        "properties": {
            name: {"type": "string", "description": d} for name, d in properties.items()
        },
        "required": list(properties),
    }


TOOLS: list[Json] = [
    {"name": "add_note", "description": "Add a note.", "inputSchema": _schema(text="the note")},
    {"name": "list_notes", "description": "List every note.", "inputSchema": _schema()},
    {
        "name": "search_notes",
        "description": "Notes containing a word.",
        "inputSchema": _schema(word="what to look for"),
    },
    {
        "name": "delete_note",
        "description": "Delete a note by number.",
        "inputSchema": _schema(number="the note's number"),
    },
    {
        "name": "server_info",
        "description": "This server's process id and uptime.",
        "inputSchema": _schema(),
    },
]
PROMPTS: list[Json] = [{"name": "summarize_notes", "description": "Summarize the notes."}]


class Server:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def handle(self, msg: Json) -> Json | None:
        method = msg.get("method")
        params = msg.get("params") or {}
        if "id" not in msg:
            return None  # notifications (initialized, cancelled): nothing to answer
        try:
            result = self.dispatch(str(method), params)
        except LookupError as exc:
            return {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32601, "message": str(exc)},
            }
        except ValueError as exc:
            return {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32602, "message": str(exc)},
            }
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}

    def dispatch(self, method: str, params: Json) -> Json:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
                "capabilities": {"tools": {}, "prompts": {}},
                "serverInfo": {"name": "mcpool-example-notes", "version": "1.0"},
                "instructions": "A notebook shared by every session attached to it.",
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "prompts/list":
            return {"prompts": PROMPTS}
        if method == "prompts/get":
            text = "Summarize these notes:\n" + "\n".join(self.notes)
            return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}]}
        if method == "tools/call":
            return _text(self.call(str(params.get("name")), params.get("arguments") or {}))
        raise LookupError(f"method not found: {method}")

    def call(self, name: str, args: Json) -> str:
        if name == "add_note":
            self.notes.append(str(args.get("text", "")))
            return f"note {len(self.notes)} added"
        if name == "list_notes":
            return "\n".join(f"{i}. {n}" for i, n in enumerate(self.notes, 1)) or "no notes"
        if name == "search_notes":
            word = str(args.get("word", "")).lower()
            found = [n for n in self.notes if word in n.lower()]
            return "\n".join(found) or "nothing found"
        if name == "delete_note":
            try:
                removed = self.notes.pop(int(args.get("number", 0)) - 1)
            except (ValueError, IndexError):
                raise ValueError("no such note") from None
            return f"deleted: {removed}"
        if name == "server_info":
            return json.dumps({"pid": os.getpid(), "uptime": round(time.time() - STARTED, 3)})
        raise ValueError(f"unknown tool {name}")


def _text(text: str) -> Json:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def main() -> int:
    server = Server()
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            reply: Json | None = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "parse error"},
            }
        else:
            reply = server.handle(msg) if isinstance(msg, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
