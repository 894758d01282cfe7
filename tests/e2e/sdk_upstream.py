"""A 2026-era upstream for the era tests: a small `mcp` SDK 2.x server over stdio.

The SDK's server decides each connection's era from its first request, so mcpool's
`server/discover` probe makes this a 2026-07-28 upstream: no `initialize`, every request carries
the envelope, list changes reach mcpool only on a `subscriptions/listen` stream.

Tools: `pid` (this process's pid), `add_tool` (registers a tool named by its argument and
announces the change), `count` (a non-object structured output: an int, which the handshake era
cannot carry unwrapped), `touch` (announces an update of the `note://pad` resource).
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("sdk-upstream", instructions="a 2026-era test upstream")
NOTE = "note://pad"


@server.tool()
def pid() -> str:
    """This upstream's process id."""
    return str(os.getpid())


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a tool called `name` (it returns its own name) and announce the change."""

    def added() -> str:
        return name

    server.add_tool(added, name=name, description=f"added at run time: {name}")
    await ctx.notify_tools_changed()
    return f"added {name}"


@server.tool()
def count(items: list[str]) -> int:
    """How many items: a structured output that is not an object."""
    return len(items)


@server.tool()
async def touch(ctx: Context) -> str:
    """Announce that the note resource changed."""
    await ctx.notify_resource_updated(NOTE)
    return "touched"


@server.resource(NOTE)
def note() -> str:
    """A resource to subscribe to."""
    return "a note"


if __name__ == "__main__":
    server.run("stdio")
