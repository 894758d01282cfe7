#!/usr/bin/env python3
"""mcpool as the client of the MCP conformance suite's client scenarios.

    conformance client --command "python tools/conformance_client.py" --scenario NAME

The suite starts its own test server and runs this script with that server's URL last. The
script starts a private daemon (temporary HOME, XDG folders, socket and config) whose only
upstream is that URL (`"prefix": false`, so tool names are the server's own), then drives one
session through `mcpool attach` with the `mcp` SDK's stdio client: initialize, list the tools,
call each one with arguments its input schema asks for. Exit status 0 when every step got an
answer (the suite's checks say whether mcpool did the right thing on the wire).

Every wait is bounded; the daemon is stopped (SIGTERM, then SIGKILL) and the folder removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

DAEMON_START_TIMEOUT = 15.0  # a cold daemon imports trio and msgspec and binds one socket
SESSION_TIMEOUT = 20.0  # initialize + list + calls; the suite's own timeout is 30 s
CALL_TIMEOUT = 10.0  # one tool call (sse-retry answers after a 0.5 s reconnect)
DAEMON_STOP_TIMEOUT = 10.0  # the daemon's bounded shutdown (L5) plus interpreter exit


def _arguments(schema: Any) -> dict[str, Any]:
    """Arguments for a tool: a small number for each numeric property, a word for strings."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    args: dict[str, Any] = {}
    for name, prop in (props or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        if kind in ("number", "integer"):
            args[name] = 2 if not args else 3
        elif kind == "boolean":
            args[name] = True
        elif kind == "string":
            args[name] = "mcpool"
    return args


def _planned_calls() -> list[tuple[str, dict[str, Any]]]:
    """The tool calls the scenario's context asks for, if any."""
    try:
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT", "{}"))
    except ValueError:
        return []
    calls = context.get("toolCalls") if isinstance(context, dict) else None
    if not isinstance(calls, list):
        return []
    return [
        (c["name"], c.get("arguments") or {})
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    ]


async def _drive(sock: Path, config: Path, env: dict[str, str]) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcpool", "attach", "--socket", str(sock), "--settings", str(config)],
        env=env,
    )
    with anyio.fail_after(SESSION_TIMEOUT):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            print(f"initialized: {init.server_info.name} {init.protocol_version}")
            tools = (await session.list_tools()).tools
            print(f"tools: {[t.name for t in tools]}")
            # A scenario may name the calls it wants (MCP_CONFORMANCE_CONTEXT's toolCalls, e.g.
            # http-custom-headers' values to encode); otherwise each tool is called once.
            planned = _planned_calls()
            calls = planned or [(tool.name, _arguments(tool.input_schema)) for tool in tools]
            for name, arguments in calls:
                result = await session.call_tool(name, arguments, read_timeout_seconds=CALL_TIMEOUT)
                text = [getattr(c, "text", "") for c in result.content]
                print(f"called {name}: is_error={result.is_error} {text}")
                if result.is_error:
                    raise SystemExit(f"{name} failed: {text}")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: conformance_client.py URL", file=sys.stderr)
        return 2
    url = argv[-1]
    work = Path(tempfile.mkdtemp(prefix="mcpool-conf-client."))
    try:
        home = work / "home"
        run = work / "run"
        home.mkdir()
        run.mkdir(mode=0o700)
        config = work / "config.json"
        config.write_text(
            json.dumps(
                {"mcpServers": {"conformance": {"type": "http", "url": url, "prefix": False}}}
            )
        )
        env = {
            **os.environ,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_STATE_HOME": str(home / ".state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_RUNTIME_DIR": str(run),
        }
        sock = run / "d.sock"
        log = (work / "daemon.log").open("wb")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mcpool", "daemon", "--socket", str(sock),
             "--config", str(config), "--log-level", "debug"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + DAEMON_START_TIMEOUT
            while not sock.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.02)
            anyio.run(_drive, sock, config, env)
            return 0
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(DAEMON_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            log.close()
            sys.stderr.write((work / "daemon.log").read_text(errors="replace")[-6000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
