"""mcpool's own tool search (session/_toolsearch.py): who gets it, and what a query finds."""

from __future__ import annotations

from typing import Any

import pytest

from mcpool.session._toolsearch import (
    CALL_TOOL,
    MAX_JOINED,
    SEARCH_TOOL,
    SessionSearch,
    ToolIndex,
    ToolSearchSettings,
    call_tool_definition,
    search_on,
    search_tools_definition,
    words,
)


def test_words_split_names_as_people_read_them() -> None:
    assert words("listPullRequests") == ["list", "pull", "requests"]
    assert words("git__get_file-v2.json") == ["git", "get", "file", "v", "2", "json"]
    assert words("HTTPServer") == ["http", "server"]


@pytest.mark.parametrize(
    ("mode", "client", "tools", "size", "expected"),
    [
        ("auto", "codex-mcp-client", 300, 10, True),
        ("auto", "codex-mcp-client", 3, 10, False),
        ("auto", "codex-mcp-client", 3, 10**6, True),  # few tools, huge definitions
        ("auto", "claude-code", 300, 10**6, False),  # it has its own search
        ("auto", "qwen-code-mcp-client", 300, 10**6, False),
        ("auto", None, 300, 10, False),  # an unknown client keeps its list
        ("auto", "vscode", 300, 10**6, False),
        ("auto", "opencode", 300, 10, True),
        ("on", "claude-code", 1, 1, True),
        ("off", "codex-mcp-client", 5000, 10**7, False),
    ],
)
def test_who_gets_the_search(
    mode: Any, client: str | None, tools: int, size: int, expected: bool
) -> None:
    assert search_on(mode, client, tools, size) is expected


def tool(name: str, description: str, title: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object"},
    }
    if title:
        out["title"] = title
    return out


TOOLS = [
    tool("git__log", "Show the commit history of a repository"),
    tool("git__diff", "Show changes between commits"),
    tool("fs__read_file", "Read a file from disk and return its text", title="Read file"),
    tool("fs__write_file", "Write text to a file"),
    tool("web__fetch", "Fetch a URL and return the page as markdown"),
    *(tool(f"filler__t{n}", f"An unrelated tool number {n}") for n in range(300)),
]


def test_a_query_finds_the_tool_its_words_describe_first() -> None:
    index = ToolIndex(TOOLS)
    assert index.search("commit history")[0]["name"] == "git__log"
    assert index.search("read a file")[0]["name"] == "fs__read_file"
    assert index.search("download web page as markdown")[0]["name"] == "web__fetch"
    # A word a tool's word begins with finds it too.
    assert index.search("repo")[0]["name"] == "git__log"
    # Whole definitions come back, schema included.
    assert index.search("fetch url")[0]["inputSchema"] == {"type": "object"}


def test_limits_and_nothing_found() -> None:
    index = ToolIndex(TOOLS)
    assert len(index.search("tool", limit=3)) == 3
    assert len(index.search("tool", limit=10_000)) == 20
    assert index.search("zzzz") == [] and index.search("") == [] and ToolIndex([]).search("x") == []


def test_the_meta_tools_are_well_formed() -> None:
    search = search_tools_definition(305)
    assert search["name"] == SEARCH_TOOL and "305" in search["description"]
    assert search["inputSchema"]["required"] == ["query"]
    call = call_tool_definition()
    assert call["name"] == CALL_TOOL and call["inputSchema"]["required"] == ["name"]
    assert SEARCH_TOOL in call["description"] and CALL_TOOL in search["description"]


def test_a_session_lists_its_always_loaded_and_found_tools_and_the_two_of_mcpool() -> None:
    eager = {**tool("fs__stat", "File status"), "_meta": {"mcpool/alwaysLoad": True}}
    served = (*TOOLS, eager)
    search = SessionSearch(ToolSearchSettings("on"))
    listed = search.listed(served)
    assert [t["name"] for t in listed] == ["fs__stat", SEARCH_TOOL, CALL_TOOL]
    assert search.listed(served) is listed  # made once per served list
    assert search.join(["git__log"]) and not search.join(["git__log"])
    assert [t["name"] for t in search.listed(served)][:2] == ["git__log", "fs__stat"]
    # At most MAX_JOINED found tools stay, the newest.
    search.join(f"filler__t{n}" for n in range(MAX_JOINED + 5))
    assert len(search.joined) == MAX_JOINED and "git__log" not in search.joined


def test_auto_decides_by_client_count_and_size() -> None:
    search = SessionSearch(ToolSearchSettings("auto", min_tools=40, min_bytes=1_000))
    few = tuple(TOOLS[:3])
    size = len  # (any size function: the settings' bytes are compared with what it says)
    assert search.on("codex-mcp-client", tuple(TOOLS), size)  # many tools
    assert not search.on("claude-code", tuple(TOOLS), size)  # it has its own search
    assert not search.on("codex-mcp-client", few, lambda tools: 10)
    assert SessionSearch(ToolSearchSettings("auto", 40, 5)).on("codex", few, lambda t: 10)
    assert not search.on("bench", tuple(TOOLS), size)  # unknown: the whole list
    assert not SessionSearch(ToolSearchSettings("off")).on("codex", tuple(TOOLS), size)
