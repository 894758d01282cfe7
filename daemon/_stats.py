"""Per-server and per-tool statistics since the daemon started (`daemonctl stats`).

A `CallObserver` (session/_observe.py): each answered request adds to its server's and its
tool's counters (calls, errors, bytes each way) and to a duration histogram, and to its
session's count. Durations go into buckets about 4% wide on a logarithmic scale (a dict of the
buckets seen), so the percentiles are read to that precision at a cost that does not grow with
the number of calls. What sessions did is kept while they live; servers' and tools' counters
until the daemon stops, at most MAX_TOOLS tools (later ones are counted under their server only).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import log2
from operator import attrgetter
from typing import Any

from mcpool.session._observe import CallDone, Outcome

# Buckets per doubling of a duration: 2^(1/16) is 4.4 % wide.
BUCKETS_PER_DOUBLING = 16
# Below this, a duration falls in the first bucket (a microsecond).
FLOOR_MS = 0.001
MAX_TOOLS = 10_000
PERCENTILES = (50, 95, 99)
_FLOOR_LOG = math.log2(FLOOR_MS)


def bucket_of(duration_ms: float) -> int:
    # The same float operations as `_Batch`'s, so the two agree at every boundary.
    return int(
        (log2(duration_ms if duration_ms > FLOOR_MS else FLOOR_MS) - _FLOOR_LOG)
        * BUCKETS_PER_DOUBLING
    )


def bucket_top(bucket: int) -> float:
    """The longest duration (ms) bucket `bucket` holds: what a percentile in it is read as."""
    return float(FLOOR_MS * 2 ** ((bucket + 1) / BUCKETS_PER_DOUBLING))


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
        self.calls += 1
        self.errors += failed
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        bucket = bucket_of(duration_ms)
        self.histogram[bucket] = self.histogram.get(bucket, 0) + 1

    def add_batch(self, batch: _Batch) -> None:
        """`add` of each call of `batch` (a property test checks they agree)."""
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


class _Batch:
    """One server's or tool's calls of a batch, summed once for both (`Counters.add_batch`)."""

    __slots__ = ("buckets", "bytes_in", "bytes_out", "calls", "errors")

    def __init__(self, calls: list[CallDone]) -> None:
        self.calls = len(calls)
        self.errors = self.calls - list(map(_outcome, calls)).count(Outcome.RESULT)
        self.bytes_in = sum(map(_bytes_in, calls))
        self.bytes_out = sum(map(_bytes_out, calls))
        # `bucket_of` of each, inlined (the same float operations: a property test checks that
        # a batch counts what its calls one by one count).
        self.buckets = Counter(
            [
                int(
                    (log2(c.duration_ms if c.duration_ms > FLOOR_MS else FLOOR_MS) - _FLOOR_LOG)
                    * BUCKETS_PER_DOUBLING
                )
                for c in calls
            ]
        )


_session = attrgetter("session")
_outcome = attrgetter("outcome")
_bytes_in = attrgetter("bytes_in")
_bytes_out = attrgetter("bytes_out")


class Stats:
    """Counters by server, by (server, method, name) and by session."""

    def __init__(self, max_tools: int = MAX_TOOLS) -> None:
        self.max_tools = max_tools
        self.servers: dict[str, Counters] = {}
        self.tools: dict[tuple[str, str, str], Counters] = {}
        self.sessions: dict[str, int] = {}
        self.tools_not_kept = 0  # calls of tools past max_tools (in their server's counters)

    def call_done(self, call: CallDone) -> None:
        self.add_batch([call])

    def add_batch(self, calls: list[CallDone]) -> None:
        """Count a batch of answered requests (the ledger's, about once a second): grouped by
        tool in one pass, each group summed once for its tool and its server (`_Batch`)."""
        sessions = self.sessions
        for sid, n in Counter(map(_session, calls)).items():
            sessions[sid] = sessions.get(sid, 0) + n
        groups: dict[tuple[str, str, str], list[CallDone]] = {}
        for call in calls:
            key = (call.server, call.method, call.name)
            group = groups.get(key)
            if group is None:
                groups[key] = [call]
            else:
                group.append(call)
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
