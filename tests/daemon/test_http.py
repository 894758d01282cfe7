"""The HTTP endpoint's pure parts: where a session's messages go (SessionOutbox), request checks
(Origin, Host, X-Mcpool-Settings, --http), and the loopback peer's uid. No HTTP server here;
tests/e2e/test_http.py drives the real endpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from mcpool.daemon._http import (
    SessionOutbox,
    Stream,
    bind_is_loopback,
    is_loopback_host,
    origin_allowed,
    parse_bind,
    parse_settings_header,
)
from mcpool.protocol import decode


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def request(msg_id: Any, method: str = "tools/call", token: Any = None) -> Any:
    params: dict[str, Any] = {"name": "x"}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return decode(line({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))


def drain(stream: Stream) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            chunk = stream.receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return out
        stream.sent(chunk)
        data = chunk.removeprefix(b"event: message\ndata: ").strip() if not stream.json else chunk
        out.append(json.loads(data))


def test_responses_go_to_the_stream_of_their_request_and_close_it() -> None:
    box = SessionOutbox(1 << 20)
    a, b = Stream(box, kind="post"), Stream(box, kind="post")
    box.open(a, [request(1)])
    box.open(b, [request("1")])  # same number, other type: another request
    box.write(line({"jsonrpc": "2.0", "id": "1", "result": {"b": True}}))
    box.write(line({"jsonrpc": "2.0", "id": 1, "result": {"a": True}}))
    assert drain(a) == [{"jsonrpc": "2.0", "id": 1, "result": {"a": True}}]
    assert drain(b) == [{"jsonrpc": "2.0", "id": "1", "result": {"b": True}}]
    assert a.closed and b.closed and box.streams == []
    assert box.buffered == 0


def test_progress_follows_its_token_and_other_messages_the_latest_waiting_stream() -> None:
    box = SessionOutbox(1 << 20)
    a, b = Stream(box, kind="post"), Stream(box, kind="post")
    box.open(a, [request(1, token="tok-a")])
    box.open(b, [request(2)])
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "tok-a", "progress": 1},
    }
    sampling = {
        "jsonrpc": "2.0",
        "id": "mcpool-1",
        "method": "sampling/createMessage",
        "params": {},
    }
    box.write(line(progress))
    box.write(line(sampling))
    assert drain(a) == [progress]
    assert drain(b) == [sampling]


def test_unrelated_messages_wait_for_the_get_stream_and_json_streams_get_responses_only() -> None:
    box = SessionOutbox(1 << 20)
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    box.write(line(changed))
    assert list(box.backlog)
    get = Stream(box, kind="get")
    box.open_get(get)
    assert drain(get) == [changed]
    js = Stream(box, kind="post", json=True)
    box.open(js, [request(7), request(8)])
    box.write(line({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}))
    box.write(line({"jsonrpc": "2.0", "id": 7, "result": {}}))
    box.write(line({"jsonrpc": "2.0", "id": 8, "result": {}}))
    assert drain(js) == [
        [{"jsonrpc": "2.0", "id": 7, "result": {}}, {"jsonrpc": "2.0", "id": 8, "result": {}}]
    ]
    assert len(drain(get)) == 1  # the log message went to the GET stream


def test_a_client_that_stops_reading_makes_the_writer_fail() -> None:
    box = SessionOutbox(100)
    get = Stream(box, kind="get")
    box.open_get(get)
    box.write(line({"jsonrpc": "2.0", "method": "x", "params": {"pad": "x" * 200}}))
    with pytest.raises(Exception, match="stopped reading"):
        box.write(line({"jsonrpc": "2.0", "method": "x"}))


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8080", True),
        ("localhost", True),
        ("[::1]:9", True),
        ("127.9.9.9", True),
        ("evil.example", False),
        ("10.0.0.1:80", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, ok: bool) -> None:
    assert is_loopback_host(host) is ok


def test_origins() -> None:
    assert origin_allowed(None)
    assert origin_allowed("http://localhost:3000")
    assert origin_allowed("https://127.0.0.1")
    assert not origin_allowed("http://evil.example")
    assert not origin_allowed("null")
    assert not origin_allowed("file://")


def test_settings_header_and_bind() -> None:
    assert parse_settings_header(None) is None
    assert parse_settings_header("/a/b.json, /c.json") == ["/a/b.json", "/c.json"]
    with pytest.raises(ValueError, match="absolute"):
        parse_settings_header("rel.json")
    assert parse_bind("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_bind("[::1]:1") == ("::1", 1)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_bind("8765")
    assert bind_is_loopback("127.0.0.1") and bind_is_loopback("::1")
    assert not bind_is_loopback("0.0.0.0")
