"""What mcpool knows of each client, by the `clientInfo.name` it sends: one table.

Matched by a substring of the lowercased name (the first row that matches). Each fact was seen
with the real client (tests/e2e/test_real_clients.py):
- `prefix` and `limit`: what the client puts in front of an exposed name and the limit it (or
  its model API) holds the whole name to, assuming the client calls mcpool "mcpool" (what
  `mcpool setup-client` writes); session/_names.py derives each session's name budget;
- `relists`: whether it lists again on `list_changed` (a client that does not sees only its
  first list, so that list waits longer for servers never seen up: issue 28);
- `tool_search`: whether it has a tool search of its own (deferred tools, or a meta-tool), so
  mcpool's own search is not needed (issue 31).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientTraits:
    needle: str
    prefix: str
    limit: int
    relists: bool
    tool_search: bool


CLIENTS: tuple[ClientTraits, ...] = (
    # Claude Code: the Anthropic API's 64; defers MCP tools behind its tool search.
    ClientTraits("claude", "mcp__mcpool__", 64, relists=True, tool_search=True),
    # Qwen Code cuts names to 63; calls deferred tools through its `tool_call` meta-tool.
    ClientTraits("qwen", "mcp__mcpool__", 63, relists=False, tool_search=True),
    # gemini-cli cuts names over 63 in the middle.
    ClientTraits("gemini", "mcp_mcpool_", 63, relists=True, tool_search=False),
    # Codex: its OpenAI tool names, 64; lists once.
    ClientTraits("codex", "mcpool__", 64, relists=False, tool_search=False),
    # GitHub Copilot CLI re-cuts names over 64.
    ClientTraits("copilot-cli", "mcpool-", 64, relists=True, tool_search=False),
    # opencode: the model API's 64 (it cuts nothing).
    ClientTraits("opencode", "mcpool_", 64, relists=True, tool_search=False),
    # Cline CLI (@cline/core) re-cuts names over 64; lists once (3.0.65 ignored list_changed).
    ClientTraits("@cline/", "mcpool__", 64, relists=False, tool_search=False),
)


def traits_of(client_name: str | None) -> ClientTraits | None:
    """The row for this client; None: a client mcpool knows nothing of."""
    if not client_name:
        return None
    lowered = client_name.lower()
    for row in CLIENTS:
        if row.needle in lowered:
            return row
    return None


def lists_once(client_name: str | None, more: Sequence[str] = ()) -> bool:
    """Does this client see only its first list (no re-list on list_changed)? `more`: parts
    of client names the daemon's `listOnceClients` adds."""
    traits = traits_of(client_name)
    if traits is not None and not traits.relists:
        return True
    lowered = (client_name or "").lower()
    return any(needle.lower() in lowered for needle in more if needle)


def first_list_wait(
    *,
    startup_deadline: float,
    since: float,
    list_once_budget: float,
    lists_once: bool,
    known_slow: bool,
) -> float:
    """Until when a session's first list waits for a server never seen up (trio time): the
    entry's startup budget; for a client that lists once, up to `list_once_budget` from when
    the session began waiting, since it will never see the server otherwise; not at all for a
    server remembered slow (not up within that budget before, not seen up since)."""
    if known_slow:
        return -math.inf
    if lists_once:
        return max(startup_deadline, since + list_once_budget)
    return startup_deadline
