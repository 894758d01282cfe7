#!/usr/bin/env python3
"""A client for the MCP conformance suite's client scenarios: mcpool, or the SDK directly.

    conformance client --command "python tools/conformance_client.py" --scenario NAME
    conformance client --command "python tools/conformance_client.py --direct" --scenario NAME

The suite starts its own test server and runs this script with that server's URL last
(`MCP_CONFORMANCE_SCENARIO` names the scenario, `MCP_CONFORMANCE_CONTEXT` carries its values).

Through mcpool (the default): a private daemon (temporary HOME, XDG folders, socket and config)
whose only upstream is that URL (`"prefix": false`, so tool names are the server's own), and one
session through `mcpool attach`, driven by the `mcp` SDK's `Client`. With `--direct`: the same
`Client`, with the same callbacks and the same per-scenario actions, connected to the URL itself.
So the suite's checks of the two runs compare mcpool as an upstream client with the SDK's own
client (tools/conformance_clients.sh prints them side by side). The direct client uses
`mode="auto"` (probe `server/discover`, fall back to `initialize`, as mcpool does upstream);
the session through mcpool speaks the era of the revision under test
(`MCP_CONFORMANCE_PROTOCOL_VERSION`).

The actions, per scenario (the suite's checks say whether the wire was right):
- `json-schema-ref-no-deref`: list the tools only (the scenario serves nothing else);
- `json-schema-2020-12-preservation`: list, then call `json_schema_echo` with the focal tool's
  input schema as listed;
- `sep-2322-client-request-state`: call the MRTR tools in the scenario's order, answering each
  elicitation with `{"confirmed": true}`;
- `auth/*` (`--direct` only; through mcpool, tests/e2e/oauth_client.py logs in as a user does):
  the SDK's OAuth provider with a browser that approves at once, then list and call `test-tool`;
- otherwise: the calls the context's `toolCalls` names, else every listed tool once with
  arguments its input schema asks for (a client that leaves out invalid tools calls only the
  valid ones); `http-standard-headers` also reads the first resource and gets the first prompt.
Elicitation requests are accepted with each field's schema `default` (SEP-1034) and any value
the scenario wants. Exit status 0 when every step got an answer.

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
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

DAEMON_START_TIMEOUT = 15.0  # a cold daemon imports trio and msgspec and binds one socket
SESSION_TIMEOUT = 45.0  # connect + list + calls on a busy box (conformance_clients.sh gives 60 s)
CALL_TIMEOUT = 10.0  # one tool call (sse-retry answers after a 0.5 s reconnect)
STARTUP_BUDGET = 15.0  # the first list waits this long for the upstream on a busy machine
DAEMON_STOP_TIMEOUT = 10.0  # the daemon's bounded shutdown (L5) plus interpreter exit
HTTP_TIMEOUT = 10.0  # one request of the OAuth flow to the suite's authorization server
CIMD_URL = "https://conformance-test.local/client-metadata.json"  # the suite's fixed CIMD id
REDIRECT_URI = "http://localhost:3000/callback"  # never listened on: the browser stops there

SCENARIO = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
# sep-2322-client-request-state: the MRTR tools, in the order the scenario checks them.
MRTR_TOOLS = [
    "test_mrtr_echo_state",
    "test_mrtr_unrelated",
    "test_mrtr_no_state",
    "test_mrtr_no_result_type",
]


def _context() -> dict[str, Any]:
    try:
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    except ValueError:
        return {}
    return context if isinstance(context, dict) else {}


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
    calls = _context().get("toolCalls")
    if not isinstance(calls, list):
        return []
    return [
        (c["name"], c.get("arguments") or {})
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    ]


async def _elicit(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """Accept: each field's schema default (SEP-1034), `confirmed: true` for MRTR's question."""
    schema = getattr(params, "requested_schema", None) or {}
    content: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict) and "default" in prop:
            content[name] = prop["default"]
        elif isinstance(prop, dict) and prop.get("type") == "boolean":
            content[name] = True
    return types.ElicitResult(action="accept", content=content)


async def _call(client: Client, name: str, arguments: dict[str, Any]) -> None:
    result = await client.call_tool(name, arguments, read_timeout_seconds=CALL_TIMEOUT)
    text = [getattr(c, "text", "") for c in getattr(result, "content", [])]
    print(f"called {name}: is_error={getattr(result, 'is_error', None)} {text}")
    if getattr(result, "is_error", False):
        raise SystemExit(f"{name} failed: {text}")


async def _actions(client: Client) -> None:
    print(f"connected at {client.protocol_version}")
    tools = (await client.list_tools()).tools
    print(f"tools: {[t.name for t in tools]}")
    if SCENARIO == "json-schema-ref-no-deref":
        return
    if SCENARIO == "json-schema-2020-12-preservation":
        focal = next(t for t in tools if t.name == "json_schema_2020_12_tool")
        await _call(client, "json_schema_echo", {"schema": focal.input_schema})
        return
    if SCENARIO == "sep-2322-client-request-state":
        for name in MRTR_TOOLS:
            await _call(client, name, {})
        return
    if SCENARIO.startswith("auth/"):
        await _call(client, "test-tool", {})
        return
    calls = _planned_calls() or [(t.name, _arguments(t.input_schema)) for t in tools]
    for name, arguments in calls:
        await _call(client, name, arguments)
    if SCENARIO == "http-standard-headers":
        # Its checks are per method: Mcp-Name on resources/read and prompts/get too.
        for resource in (await client.list_resources()).resources[:1]:
            await client.read_resource(str(resource.uri))
            print(f"read {resource.uri}")
        for prompt in (await client.list_prompts()).prompts[:1]:
            await client.get_prompt(prompt.name, {})
            print(f"got {prompt.name}")


class _Memory:
    """Token storage for one run; pre-registered credentials come from the context."""

    def __init__(self, client_info: Any = None) -> None:
        self.tokens: Any = None
        self.client_info = client_info

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info


def _oauth(url: str) -> httpx2.Auth:
    """The SDK's OAuth provider with a browser that approves at once: the authorization
    endpoint's redirect is read, not followed, and its code handed to the callback."""
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import (
        AuthorizationCodeResult,
        OAuthClientInformationFull,
        OAuthClientMetadata,
    )

    redirect: dict[str, Any] = {}

    async def browse(authorization_url: str) -> None:
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            response = await http.get(authorization_url, follow_redirects=False)
        redirect.update(parse_qs(urlsplit(response.headers.get("location", "")).query))

    async def callback() -> AuthorizationCodeResult:
        def one(key: str) -> str | None:
            values = redirect.get(key)
            return values[0] if values else None

        return AuthorizationCodeResult(code=one("code") or "", state=one("state"), iss=one("iss"))

    context = _context()
    metadata = OAuthClientMetadata(
        client_name="mcpool-conformance-direct",
        redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    info = None
    if context.get("client_id"):
        info = OAuthClientInformationFull(
            client_id=context["client_id"],
            client_secret=context.get("client_secret"),
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            # A pre-registered confidential client: its secret goes in the Basic header.
            token_endpoint_auth_method=(
                "client_secret_basic" if context.get("client_secret") else "none"
            ),
        )
    return OAuthClientProvider(
        server_url=url,
        client_metadata=metadata,
        storage=_Memory(info),
        redirect_handler=browse,
        callback_handler=callback,
        client_metadata_url=CIMD_URL if SCENARIO == "auth/basic-cimd" else None,
    )


async def _run(target: Any, mode: str = "auto") -> None:
    with anyio.fail_after(SESSION_TIMEOUT):
        async with Client(
            target, mode=mode, elicitation_callback=_elicit, read_timeout_seconds=CALL_TIMEOUT
        ) as client:
            await _actions(client)


async def _direct(url: str) -> None:
    if SCENARIO.startswith("auth/"):
        async with httpx2.AsyncClient(auth=_oauth(url), timeout=HTTP_TIMEOUT) as http:
            await _run(streamable_http_client(url, http_client=http))
    else:
        await _run(url)


def _through_mcpool(url: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="mcpool-conf-client."))
    try:
        home = work / "home"
        run = work / "run"
        home.mkdir()
        run.mkdir(mode=0o700)
        config = work / "config.json"
        # The scenario measures the wire, not start-up: the first list waits for the upstream
        # however busy the machine (instead of the 1.5 s a client gets by default).
        server = {"type": "http", "url": url, "prefix": False}
        daemon_options = {"startupBudget": STARTUP_BUDGET}
        config.write_text(
            json.dumps({"mcpServers": {"conformance": server}, "daemon": daemon_options})
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
            attach = StdioServerParameters(
                command=sys.executable,
                args=["-m", "mcpool", "attach", "--socket", str(sock), "--settings", str(config)],
                env=env,
            )
            # The session speaks the era of the revision under test (the suite's
            # MCP_CONFORMANCE_PROTOCOL_VERSION), as the direct client ends up doing with the
            # suite's server; which era mcpool speaks upstream is mcpool's own choice.
            modern = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "") >= "2026"
            anyio.run(_run, attach, "auto" if modern else "legacy")
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


def main(argv: list[str]) -> int:
    direct = "--direct" in argv
    urls = [a for a in argv if a != "--direct"]
    if not urls:
        print("usage: conformance_client.py [--direct] URL", file=sys.stderr)
        return 2
    if direct:
        anyio.run(_direct, urls[-1])
        return 0
    return _through_mcpool(urls[-1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
