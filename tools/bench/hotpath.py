"""The synchronous work mcpool does per relayed tools/call, step by step, in-process.

Replays what `Daemon._run_session` -> `Requests._tools_call` -> `StdioUpstream.send_request`
and `StdioUpstream._read_stdout` -> `_dispatch` -> `_InFlight.__call__` do to one request and
its response, with the same functions and encoders, and times each step (best of 5 runs of
20,000). No I/O and no event loop: the difference between this sum and the latency benchmark's
"mcpool minus reference relay (trio)" is scheduling and allocation noise; the reference relay
itself covers the syscalls and wake-ups.

    .venv/bin/python tools/bench/hotpath.py
"""

from __future__ import annotations

import timeit
from typing import Any

from _common import table, write_result

from mcpool.protocol import LineFramer, decode, decode_params, request_line, response_line
from mcpool.session._flight import _encoder

REQUEST = (
    b'{"jsonrpc":"2.0","id":1234,"method":"tools/call",'
    b'"params":{"name":"f__echo","arguments":{"text":"x"}}}'
)
RESPONSE = b'{"jsonrpc":"2.0","id":17,"result":{"content":[{"type":"text","text":"x"}]}}'
N = 20_000


def main() -> None:
    framer = LineFramer()
    msg: Any = decode(REQUEST)
    params = decode_params(msg.params)
    routes = {f"f__tool{i}": ("view", f"tool{i}") for i in range(50)} | {
        "f__echo": ("view", "echo")
    }
    encoded_params = _encoder.encode(params)
    resp: Any = decode(RESPONSE)
    pending: dict[int, Any] = {}

    def route_and_rewrite() -> None:
        p = dict(params)
        route = routes.get(p["name"])
        assert route is not None
        p["name"] = route[1]
        p.get("_meta")

    def pending_roundtrip() -> None:
        pending[17] = route_and_rewrite
        pending.pop(17, None)

    steps = [
        ("request: frame (LineFramer.feed)", lambda: framer.feed(REQUEST + b"\n")),
        ("request: decode envelope", lambda: decode(REQUEST)),
        ("request: decode params to a dict", lambda: decode_params(msg.params)),
        ("request: route lookup + name rewrite", route_and_rewrite),
        ("request: re-encode params", lambda: _encoder.encode(params)),
        (
            "request: encode upstream request",
            lambda: request_line(17, "tools/call", encoded_params),
        ),
        ("response: frame", lambda: framer.feed(RESPONSE + b"\n")),
        ("response: decode envelope", lambda: decode(RESPONSE)),
        ("response: pending-id map", pending_roundtrip),
        ("response: encode for the client", lambda: response_line(1234, resp.result)),
    ]
    rows, results, total = [], {}, 0.0
    for name, fn in steps:
        us = min(timeit.repeat(fn, number=N, repeat=5)) / N * 1e6
        total += us
        results[name] = us
        rows.append([name, f"{us:.2f}"])
    rows.append(["total", f"{total:.2f}"])
    print(table(["step (per call)", "us"], rows))
    print("wrote", write_result("hotpath", {"steps_us": results, "total_us": total}))


if __name__ == "__main__":
    main()
