"""mcpool's own tool search, for clients that have none (issue 31). Pure: which sessions get
it, the two tools it lists, and the ranking; the session serves and routes them.

When a session's search is on, its `tools/list` holds the tools its settings mark
`alwaysLoadTools` and two of mcpool's: SEARCH_TOOL (a query in words; the best matches over
names, titles and descriptions, each with its whole definition) and CALL_TOOL (an exposed name
and its arguments, forwarded as a call of that tool would be). Both work over the session's own
view, so what the session may not see is never found and never callable.

Ranking is BM25 over words: a tool's name (split at `_`, `-`, `.` and case changes) counts three
times, its title twice, its description once; a query word also matches a word it begins
(`repo` finds `repository`). Ties keep the view's order.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._clients import traits_of

ToolSearchMode = Literal["auto", "on", "off"]
SEARCH_TOOL = "mcpool_search_tools"
CALL_TOOL = "mcpool_call_tool"
# "auto" turns the search on past either threshold (daemon options toolSearchTools and
# toolSearchBytes): about 2 tools per server of a busy setup, or some 10,000 tokens.
DEFAULT_MIN_TOOLS = 40
DEFAULT_MIN_BYTES = 40_000
DEFAULT_RESULTS = 5
MAX_RESULTS = 20
MAX_QUERY_CHARS = 500

NAME_WEIGHT, TITLE_WEIGHT, TEXT_WEIGHT = 3.0, 2.0, 1.0
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^\W\d_A-Za-z]+")


def words(text: str) -> list[str]:
    """Lowercased words: split at punctuation and case changes (`listPullRequests` is list,
    pull, requests; `get_file` is get, file)."""
    return [w.lower() for w in _WORD.findall(text)]


def search_on(
    mode: ToolSearchMode,
    client_name: str | None,
    tool_count: int,
    definition_bytes: int,
    *,
    min_tools: int = DEFAULT_MIN_TOOLS,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> bool:
    """Does this session get mcpool's search instead of its whole list?"""
    if mode != "auto":
        return mode == "on"
    traits = traits_of(client_name)
    if traits is None or traits.tool_search:
        # Its own search serves it better than ours; and a client mcpool does not know (an
        # IDE with a tool picker, say) keeps the list it had, as before the search existed.
        return False
    return tool_count > min_tools or definition_bytes > min_bytes


def search_tools_definition(count: int) -> dict[str, Any]:
    return {
        "name": SEARCH_TOOL,
        "title": "Search tools",
        "description": (
            f"Find tools among the {count} this session can call, by what they do. Returns "
            f"the best matches with their input schemas; call one with {CALL_TOOL}."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the tool should do, in words"},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_RESULTS,
                    "description": f"At most this many tools (default {DEFAULT_RESULTS})",
                },
            },
            "required": ["query"],
        },
        "annotations": {"readOnlyHint": True},
    }


def call_tool_definition() -> dict[str, Any]:
    return {
        "name": CALL_TOOL,
        "title": "Call a tool",
        "description": (
            f"Call a tool found with {SEARCH_TOOL}: its name and its arguments, as its input "
            "schema describes them."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The tool's name, as found"},
                "arguments": {"type": "object", "description": "The tool's arguments"},
            },
            "required": ["name"],
        },
    }


@dataclass(frozen=True, slots=True)
class _Doc:
    index: int
    weights: dict[str, float]  # word -> weighted count
    length: float


class ToolIndex:
    """The words of a session's tools, built once per list it serves."""

    def __init__(self, tools: Sequence[Mapping[str, Any]]) -> None:
        self.tools = tools
        docs = []
        frequency: dict[str, int] = {}
        for i, tool in enumerate(tools):
            weights: dict[str, float] = {}
            for text, weight in (
                (str(tool.get("name", "")), NAME_WEIGHT),
                (str(tool.get("title", "") or ""), TITLE_WEIGHT),
                (str(tool.get("description", "") or ""), TEXT_WEIGHT),
            ):
                for w in words(text):
                    weights[w] = weights.get(w, 0.0) + weight
            for w in weights:
                frequency[w] = frequency.get(w, 0) + 1
            docs.append(_Doc(i, weights, sum(weights.values())))
        self._docs = docs
        self._frequency = frequency
        self._average = (sum(d.length for d in docs) / len(docs)) if docs else 1.0
        self._vocabulary = sorted(frequency)

    def _expand(self, word: str) -> Iterable[str]:
        """The index's words a query word matches: itself, and those it begins."""
        start = bisect.bisect_left(self._vocabulary, word)
        for known in self._vocabulary[start:]:
            if not known.startswith(word):
                break
            yield known

    def search(self, query: str, limit: int = DEFAULT_RESULTS) -> list[Mapping[str, Any]]:
        terms = {w for w in words(query[:MAX_QUERY_CHARS])}
        if not terms or not self._docs:
            return []
        n = len(self._docs)
        scores = [0.0] * n
        for term in terms:
            for word in self._expand(term):
                df = self._frequency[word]
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                exact = 1.0 if word == term else 0.5
                for doc in self._docs:
                    tf = doc.weights.get(word)
                    if tf:
                        norm = (
                            tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * doc.length / self._average))
                        )
                        scores[doc.index] += exact * idf * norm
        ranked = sorted((i for i in range(n) if scores[i] > 0), key=lambda i: (-scores[i], i))
        return [self.tools[i] for i in ranked[: max(1, min(limit, MAX_RESULTS))]]


# Found tools that join a re-listing client's list (item 3): at most this many, the newest.
MAX_JOINED = 20


@dataclass(frozen=True, slots=True)
class ToolSearchSettings:
    """A session's search settings: the daemon's `toolSearch` options, or its attach's
    `--tool-search`."""

    mode: ToolSearchMode = "auto"
    min_tools: int = DEFAULT_MIN_TOOLS
    min_bytes: int = DEFAULT_MIN_BYTES


def is_always_loaded(tool: Mapping[str, Any]) -> bool:
    meta = tool.get("_meta")
    return isinstance(meta, dict) and meta.get("mcpool/alwaysLoad") is True


class SessionSearch:
    """One session's search: whether it is on for the list it serves, what that list holds,
    and the index its searches read. Cached per served list (the registry's `tools` tuple,
    shared while nothing changes), so a session lists and searches without rebuilding."""

    __slots__ = ("_index", "_listed", "_sizes", "joined", "settings", "spared_bytes")

    def __init__(self, settings: ToolSearchSettings) -> None:
        self.settings = settings
        # The full list's (tools, encoded size); the search list made from it; its index.
        self._sizes: tuple[tuple[Mapping[str, Any], ...], int] | None = None
        self._listed: tuple[Any, tuple[dict[str, Any], ...]] | None = None
        self._index: tuple[tuple[Mapping[str, Any], ...], ToolIndex] | None = None
        self.joined: dict[str, None] = {}  # exposed names found, in order (item 3)
        self.spared_bytes = 0  # definition bytes not sent, over the lists served

    def definition_bytes(
        self, tools: tuple[Mapping[str, Any], ...], size: Callable[[Any], int]
    ) -> int:
        if self._sizes is None or self._sizes[0] is not tools:
            self._sizes = (tools, size(tools))
        return self._sizes[1]

    def on(
        self,
        client_name: str | None,
        tools: tuple[Mapping[str, Any], ...],
        size: Callable[[Any], int],
    ) -> bool:
        s = self.settings
        count = len(tools)
        # (The size is taken only when the count alone does not decide.)
        size_now = self.definition_bytes(tools, size) if count <= s.min_tools else 0
        return search_on(
            s.mode, client_name, count, size_now, min_tools=s.min_tools, min_bytes=s.min_bytes
        )

    def listed(self, tools: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        """What the session lists: its always-loaded tools, those found that joined it, and
        mcpool's two (whose description counts the tools behind them)."""
        joined_now = tuple(self.joined)
        last = self._listed
        if last is not None and last[0][0] is tools and last[0][1] == joined_now:
            return last[1]
        joined = self.joined
        kept = tuple(t for t in tools if is_always_loaded(t) or t.get("name") in joined)
        out = (*kept, search_tools_definition(len(tools)), call_tool_definition())
        self._listed = ((tools, joined_now), out)
        return out

    def find(
        self, tools: tuple[dict[str, Any], ...], query: str, limit: int
    ) -> list[Mapping[str, Any]]:
        if self._index is None or self._index[0] is not tools:
            self._index = (tools, ToolIndex(tools))
        return self._index[1].search(query, limit)

    def join(self, names: Iterable[str]) -> bool:
        """Found tools join the list (the newest MAX_JOINED); True when the list changed."""
        before = tuple(self.joined)
        for name in names:
            self.joined.pop(name, None)
            self.joined[name] = None
        while len(self.joined) > MAX_JOINED:
            del self.joined[next(iter(self.joined))]
        return tuple(self.joined) != before
