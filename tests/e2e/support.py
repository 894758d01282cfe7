"""Small helpers shared by the acceptance tests of issue 2 (the daemon end to end).

Everything is bounded: each wait runs under `trio.fail_after`. Where the thing awaited happens
in another process with no event to wait on (a process exiting, the pool closing an entry),
`wait_until` polls a condition at a short interval, still bounded.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import psutil
import trio
from mcp import ClientSession

from .harness import DaemonProcess, RawSocketClient

# One MCP round trip through bridge, daemon and a local upstream takes milliseconds; this only
# turns a hang into a failure on a loaded machine.
STEP_TIMEOUT = 10.0
# A process, or a pool entry, going away in another process: there is no event to wait on, so
# the condition is polled at this interval (bounded by the caller's timeout).
POLL_INTERVAL = 0.02
# The handshake-era version the raw-socket tests speak.
PROTOCOL_VERSION = "2025-06-18"


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent), block
    return block.text


async def call_text(session: ClientSession, tool: str, args: dict[str, Any] | None = None) -> str:
    """Call a tool through the SDK session and return its first text block (must not fail)."""
    with trio.fail_after(STEP_TIMEOUT):
        result = await session.call_tool(tool, args or {})
    assert not result.is_error, result
    return text_of(result)


async def tool_names(session: ClientSession) -> list[str]:
    with trio.fail_after(STEP_TIMEOUT):
        return [tool.name for tool in (await session.list_tools()).tools]


async def wait_until(condition: Callable[[], bool | Awaitable[bool]]) -> None:
    """Poll `condition` (sync or async) until it holds; the caller bounds it with fail_after."""
    while True:
        outcome = condition()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        await trio.sleep(POLL_INTERVAL)


def process(pid: int) -> psutil.Process:
    """The psutil handle of a live process; it remembers the start time, so pid reuse is seen."""
    # psutil.Process(None) is the calling process: never let a missing pid mean "us".
    assert pid is not None, "no pid (the process has not started)"
    proc = psutil.Process(pid)
    assert alive(proc), f"pid {pid} is not running"
    return proc


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an exited child that nobody has reaped yet is gone for us)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


class Inbox:
    """A `message_handler` for the SDK ClientSession that keeps every server notification.

    `wait_for` waits (bounded) until a notification of a given type has arrived; it wakes on
    each arrival instead of polling.
    """

    def __init__(self) -> None:
        self.items: list[types.ServerNotification | Exception] = []
        self._arrived = trio.Event()

    async def __call__(self, message: types.ServerNotification | Exception) -> None:
        self.items.append(message)
        self._arrived.set()
        self._arrived = trio.Event()

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [item for item in self.items if isinstance(item, kind)]

    async def wait_for(self, kind: type[Any]) -> Any:
        """The latest notification of this type, waiting (up to STEP_TIMEOUT) for the first."""
        with trio.fail_after(STEP_TIMEOUT):
            while True:
                arrived = self._arrived
                found = self.of_type(kind)
                if found:
                    return found[-1]
                await arrived.wait()


async def raw_attach(
    client: RawSocketClient, settings: list[str], name: str, *, initialize: bool = True
) -> str:
    """Attach a raw socket connection (and do the MCP handshake); returns the session id."""
    attached = await client.request(
        "mcpool/attach",
        {"sources": settings, "cwd": None, "name": name, "clientPid": os.getpid()},
    )
    assert "result" in attached, attached
    session_id = attached["result"]["session"]
    assert isinstance(session_id, str)
    if initialize:
        init = await client.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": name, "version": "0"},
            },
        )
        assert init.get("result", {}).get("protocolVersion") == PROTOCOL_VERSION, init
        await client.notify("notifications/initialized")
    return session_id


async def raw_call(client: RawSocketClient, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """tools/call over a raw connection; returns the whole response."""
    return await client.request("tools/call", {"name": tool, "arguments": args})


def raw_text(response: dict[str, Any]) -> str:
    assert "result" in response, response
    text = response["result"]["content"][0]["text"]
    assert isinstance(text, str)
    return text


async def servers_of(daemon: DaemonProcess) -> list[dict[str, Any]]:
    servers = await daemon.ctl("servers")
    assert isinstance(servers, list), servers
    return servers
