"""Per-server and per-tool statistics since the daemon started (`daemonctl stats`).

Fed by the ledger (daemon/_ledger.py) a session's records at a time: each answered request adds
to its server's and its tool's counters (calls, errors, bytes each way) and to a duration
histogram, and to its session's count. Durations go into buckets about 4% wide on a logarithmic
scale (a dict of the buckets seen), so the percentiles are read to that precision at a cost that
does not grow with the number of calls. What sessions did is kept while they live; servers' and
tools' counters until the daemon stops, at most MAX_TOOLS tools (later ones are counted under
their server only).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mcpool.session._observe import RESULT, CallRecord

# Buckets per doubling of a duration: 2^(1/16) is 4.4 % wide.
BUCKETS_PER_DOUBLING = 16
# Below the first edge, a duration falls in the first bucket (about a microsecond); past the
# last (2^40 us, 12.7 days), in the last.
FLOOR_MS = 0.001
DOUBLINGS = 40
MAX_TOOLS = 10_000
PERCENTILES = (50, 95, 99)
# The buckets' tops: bucket k holds the durations from EDGES[k - 1] (0 for the first) up to,
# not including, EDGES[k]. The one copy of where a bucket starts and ends: `bucket_of` and the
# batches' count (`_histogram`) both compare with these floats, so they agree at every edge.
EDGES = [
    FLOOR_MS * 2 ** ((k + 1) / BUCKETS_PER_DOUBLING)
    for k in range(DOUBLINGS * BUCKETS_PER_DOUBLING)
]
_LAST = len(EDGES)


def bucket_of(duration_ms: float) -> int:
    return bisect_right(EDGES, duration_ms)


def bucket_top(bucket: int) -> float:
    """The longest duration (ms) bucket `bucket` holds: what a percentile in it is read as."""
    return EDGES[min(bucket, _LAST - 1)]


def percentiles(histogram: dict[int, int], wanted: Iterable[int] = PERCENTILES) -> dict[str, float]:
    """`{"p50": ms, ...}` from a histogram of buckets (empty: no keys)."""
    total = sum(histogram.values())
    if not total:
        return {}
    ordered = sorted(histogram.items())
    out: dict[str, float] = {}
    for p in wanted:
        rank = math.ceil(total * p / 100)
        seen = 0
        for bucket, count in ordered:
            seen += count
            if seen >= rank:
                out[f"p{p}"] = round(bucket_top(bucket), 3)
                break
    return out


@dataclass(slots=True)
class Counters:
    calls: int = 0
    errors: int = 0  # JSON-RPC errors and isError results
    bytes_in: int = 0
    bytes_out: int = 0
    histogram: dict[int, int] = field(default_factory=dict)

    def add(self, duration_ms: float, failed: bool, bytes_in: int, bytes_out: int) -> None:
        """One call (the rule the batches follow: a property test holds them to it)."""
        self.calls += 1
        self.errors += failed
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        bucket = bucket_of(duration_ms)
        self.histogram[bucket] = self.histogram.get(bucket, 0) + 1

    def add_batch(self, batch: _Batch) -> None:
        self.calls += batch.calls
        self.errors += batch.errors
        self.bytes_in += batch.bytes_in
        self.bytes_out += batch.bytes_out
        histogram = self.histogram
        for bucket, count in batch.buckets.items():
            histogram[bucket] = histogram.get(bucket, 0) + count

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            **{f"{k}_ms": v for k, v in percentiles(self.histogram).items()},
        }


def _histogram(durations: list[float]) -> dict[int, int]:
    """`bucket_of` of each duration, counted, in steps per bucket rather than per duration:
    sorted (in C), each bucket's run found by one bisection for its top edge."""
    durations.sort()
    counts: dict[int, int] = {}
    i, n = 0, len(durations)
    while i < n:
        bucket = bisect_right(EDGES, durations[i])
        j = n if bucket >= _LAST else bisect_left(durations, EDGES[bucket], i)
        counts[bucket] = j - i
        i = j
    return counts


class _Batch:
    """One tool's calls of a batch, summed once for it and its server (`Counters.add_batch`).
    Each figure is read in a comprehension of its own: a Struct's field is read faster by
    bytecode than by `attrgetter`, and one loop summing four figures costs more than four."""

    __slots__ = ("buckets", "bytes_in", "bytes_out", "calls", "errors")

    def __init__(self, records: list[CallRecord[Any]]) -> None:
        self.calls = len(records)
        self.errors = self.calls - [r.outcome for r in records].count(RESULT)
        self.bytes_in = sum([r.bytes_in for r in records])
        self.bytes_out = sum([r.bytes_out for r in records])
        self.buckets = _histogram([r.duration_ms for r in records])


class Stats:
    """Counters by server, by (server, method, name) and by session."""

    def __init__(self, max_tools: int = MAX_TOOLS) -> None:
        self.max_tools = max_tools
        self.servers: dict[str, Counters] = {}
        self.tools: dict[tuple[str, str, str], Counters] = {}
        self.sessions: dict[str, int] = {}
        self.tools_not_kept = 0  # calls of tools past max_tools (in their server's counters)

    def add(self, session: str, records: list[CallRecord[Any]]) -> None:
        """Count a batch of one session's answered requests (the ledger's, about once a
        second): grouped by tool in one pass, each group summed once for its tool and its
        server (`_Batch`)."""
        if not records:
            return
        self.sessions[session] = self.sessions.get(session, 0) + len(records)
        keys = [(r.server, r.method, r.name) for r in records]
        groups: dict[tuple[str, str, str], list[CallRecord[Any]]]
        if keys.count(keys[0]) == len(keys):
            groups = {keys[0]: records}  # one tool's, as a session's second of calls often is
        else:
            groups = {}
            for key, r in zip(keys, records, strict=True):
                group = groups.get(key)
                if group is None:
                    groups[key] = [r]
                else:
                    group.append(r)
        for key, group in groups.items():
            batch = _Batch(group)
            server = self.servers.get(key[0])
            if server is None:
                server = self.servers[key[0]] = Counters()
            server.add_batch(batch)
            tool = self.tools.get(key)
            if tool is None:
                if len(self.tools) >= self.max_tools:
                    self.tools_not_kept += batch.calls
                    continue
                tool = self.tools[key] = Counters()
            tool.add_batch(batch)

    def session_closed(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def as_json(self, in_flight: dict[str, int] | None = None) -> dict[str, Any]:
        """What `daemonctl stats --json` prints; `in_flight`: requests in flight now, by
        server (the pool's)."""
        in_flight = in_flight or {}
        servers: dict[str, Any] = {}
        for name in sorted(set(self.servers) | set(in_flight)):
            counters = self.servers.get(name) or Counters()
            servers[name] = {
                **counters.as_json(),
                "in_flight": in_flight.get(name, 0),
                "tools": {},
            }
        for (server, method, name), counters in sorted(self.tools.items()):
            label = name if method == "tools/call" else f"{method} {name}".strip()
            servers[server]["tools"][label] = counters.as_json()
        return {
            "servers": servers,
            "sessions": dict(sorted(self.sessions.items())),
            "tools_not_kept": self.tools_not_kept,
        }
