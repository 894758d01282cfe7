"""The HTTP endpoint's pure parts: where a session's messages go and how many of their bytes wait
(SessionOutbox), request checks (Origin, Host, X-Mcpool-Settings, --http), which connections are
let in and how refusals are logged (daemon/_http_limits.py), and the `daemon` options for them.
No HTTP server here; tests/e2e/test_http*.py drive the real endpoint."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import trio
import trio.testing
from other_user import OtherUser

from mcpool.daemon._http import (
    HttpEndpoint,
    SessionOutbox,
    Stream,
    bind_is_loopback,
    is_loopback_host,
    origin_allowed,
    parse_bind,
    parse_settings_header,
)
from mcpool.daemon._http_limits import (
    Admission,
    BodyBudget,
    Peer,
    Verdict,
)
from mcpool.daemon._settings import DaemonOptions, parse_settings
from mcpool.pool import _peercred
from mcpool.pool._peercred import MAX_TALLIES, REFUSAL_LOG_PERIOD, RefusalTally, TallyLine
from mcpool.protocol import SettingsError, decode


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
        stream.taken(chunk)
        stream.sent(chunk)
        data = chunk if stream.json else chunk.split(b"\ndata: ", 1)[1].strip()
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
    assert a.ended and b.ended and box.streams == []
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


# -- bytes held for a session (X8) ---------------------------------------------------------------


def log_line(size: int, n: int = 0) -> bytes:
    params = {"level": "info", "logger": "t", "data": f"{n}:" + "x" * size}
    return line({"jsonrpc": "2.0", "method": "notifications/message", "params": params})


def test_a_streamless_session_keeps_few_log_messages_and_counts_the_rest() -> None:
    box = SessionOutbox(1 << 20, streamless_lossy=10_000)
    for n in range(20):
        box.write(log_line(2000, n))  # the session writes it as any message: never cut for it
    kept = len(box.backlog)
    assert kept == 4  # 4 x ~2,060 bytes fit in 10,000; the fifth would not
    assert box.dropped == 20 - kept
    assert box.buffered == box.backlog_bytes <= 10_000
    assert not box.write_lossy(log_line(2000, 99))  # dropped, counted, nothing raised
    assert box.dropped == 17
    # What cannot be lost is kept past the lossy bound (within sessionBufferBytes).
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    box.write(line(changed))
    get = Stream(box, kind="get")
    box.open_get(get)
    got = drain(get)
    assert [m["params"]["data"].partition(":")[0] for m in got[:-1]] == ["0", "1", "2", "3"]
    assert got[-1] == changed
    assert box.buffered == 0 and not box.backlog


def test_undelivered_bytes_count_against_the_session_buffer_and_cut_it() -> None:
    box = SessionOutbox(10_000)
    request_line = {"jsonrpc": "2.0", "id": "s", "method": "sampling/createMessage"}
    box.write(line({**request_line, "params": {"pad": "x" * 6000}}))  # no stream: kept
    assert box.buffered > 6000
    with pytest.raises(Exception, match=r"stopped reading.*sessionBufferBytes"):
        box.write(line({**request_line, "params": {"pad": "y" * 6000}}))
    assert box.buffered < 10_000


def test_lossy_messages_on_a_stream_are_dropped_before_the_session_would_be_cut() -> None:
    box = SessionOutbox(20_000)
    post = Stream(box, kind="post")
    box.open(post, [request(1, token="p")])
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "p", "progress": 1, "pad": "x" * 3000},
    }
    delivered = [box.write_lossy(line(progress)) for _ in range(10)]
    # Half the buffer is for what cannot be lost: 3 progress steps fit in 10,000 bytes.
    assert delivered == [True] * 3 + [False] * 7
    assert box.dropped == 7
    box.write(line({"jsonrpc": "2.0", "id": 1, "result": {"pad": "z" * 9000}}))  # still fits
    assert len(drain(post)) == 4 and post.ended
    assert box.buffered == 0


def test_an_ended_stream_gives_its_unsent_bytes_back_and_a_closed_outbox_keeps_nothing() -> None:
    box = SessionOutbox(1 << 20)
    post = Stream(box, kind="post", json=True)
    box.open(post, [request(1), request(2)])
    box.write(line({"jsonrpc": "2.0", "id": 1, "result": {"pad": "x" * 500}}))
    assert box.buffered > 500  # held for the JSON body, counted
    post.close()  # the client left before the body was made
    assert box.buffered == 0
    box.write(log_line(100))
    assert box.buffered > 0
    box.close()
    assert box.buffered == 0 and not box.backlog
    assert not box.write_lossy(log_line(100)) and box.buffered == 0


# -- admission and refusal lines (daemon/_http_limits.py) ----------------------------------------


def test_admission_serves_the_owner_within_its_caps_and_refuses_everyone_else() -> None:
    gate = Admission(owner=1000)
    assert gate.arrive(max_pending=2) and gate.arrive(max_pending=2)
    assert not gate.arrive(max_pending=2)  # a third waits for no lookup: closed at accept
    caps = {"max_open": 3, "max_per_peer": 2}
    owner, other = Peer(1000), Peer(1001)
    assert gate.identified(other, **caps) is Verdict.FOREIGN
    assert gate.identified(owner, **caps) is Verdict.SERVE
    assert gate.pending == 0 and gate.open == 1
    for _ in range(2):
        gate.arrive(max_pending=8)
    assert gate.identified(owner, **caps) is Verdict.SERVE
    assert gate.identified(owner, **caps) is Verdict.TOO_MANY_FROM_PEER
    assert gate.pending == 1  # an answered refusal holds its slot while it is sent
    gate.answered()
    remote = Peer(None, "10.0.0.9")
    gate.arrive(max_pending=8)
    assert gate.identified(remote, **caps) is Verdict.SERVE  # remote: per address
    gate.arrive(max_pending=8)
    assert gate.identified(Peer(None, "10.0.0.8"), **caps) is Verdict.TOO_MANY
    gate.answered()
    gate.arrive(max_pending=8)
    assert gate.identified(Peer(None), **caps) is Verdict.UNKNOWN
    gate.left(owner)
    gate.left(owner)
    gate.left(remote)
    assert gate.open == 0 and gate.by_peer == {} and gate.pending == 0


def test_refusals_are_one_line_per_peer_per_period_with_a_count() -> None:
    tally = RefusalTally(period=60.0)
    a, b = Peer(1001), Peer(1002)
    first = tally.refused(Verdict.FOREIGN, a, now=0.0)
    assert first == TallyLine(Verdict.FOREIGN, a, 1, first=True)
    assert all(tally.refused(Verdict.FOREIGN, a, now=t / 10) is None for t in range(1, 500))
    assert tally.refused(Verdict.FOREIGN, b, now=1.0) is not None  # another uid: its own line
    assert tally.due(now=59.0) == []
    assert tally.due(now=60.0) == [TallyLine(Verdict.FOREIGN, a, 499, first=False)]
    assert tally.due(now=61.0) == []  # b's window ended with nothing more: forgotten
    # A refusal after a window ended starts the next with its line.
    assert tally.refused(Verdict.FOREIGN, a, now=70.0) == TallyLine(Verdict.FOREIGN, a, 1, True)
    tally.refused(Verdict.FOREIGN, a, now=71.0)
    assert tally.flush() == [TallyLine(Verdict.FOREIGN, a, 1, first=False)]
    assert tally.total == 503


def test_refusal_kinds_past_the_tally_bound_are_counted_together() -> None:
    tally = RefusalTally()
    lines = [tally.refused(Verdict.TOO_MANY, Peer(None, f"10.0.{n // 256}.{n % 256}"), 0.0)
             for n in range(MAX_TALLIES + 50)]  # fmt: skip
    assert sum(line is not None for line in lines) == MAX_TALLIES + 1
    assert lines[MAX_TALLIES] == TallyLine(Verdict.TOO_MANY, None, 1, first=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("httpMaxConnections", 0),
        ("httpMaxConnectionsPerUid", "many"),
        ("httpMaxPendingLookups", -1),
        ("httpMaxSessions", 0),
        ("httpMaxPendingBodyBytes", 1.5),
        ("httpHeadTimeout", 0),
        ("httpBodyTimeout", -3),
    ],
)
def test_http_options_are_typed_and_an_error_names_the_file_and_field(
    field: str, value: Any
) -> None:
    data = json.dumps({"daemon": {field: value}}).encode()
    with pytest.raises(SettingsError) as caught:
        parse_settings(data, "/home/u/.config/mcpool/config.json")
    assert caught.value.path == "/home/u/.config/mcpool/config.json"
    assert caught.value.field == f"daemon.{field}"


def test_http_options_have_defaults_and_read_their_camel_case_names() -> None:
    doc = parse_settings(b'{"daemon": {"httpMaxSessions": 3, "httpHeadTimeout": 0.5}}', "f")
    assert doc.daemon is not None
    assert doc.daemon.http_max_sessions == 3 and doc.daemon.http_head_timeout == 0.5
    defaults = DaemonOptions()
    assert defaults.http_max_connections >= defaults.http_max_connections_per_uid > 0
    assert defaults.http_max_pending_body_bytes >= defaults.max_message_bytes


class RecordingHost:
    """A SessionHost that opens no session and keeps the log lines."""

    config_path = "/nonexistent/config.json"

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def open_session(self, out: Any, *, name: str, sources: list[str], peer: str, via: str) -> Any:
        raise AssertionError("no session here")

    async def apply_to_session(self, state: Any) -> Any:
        raise AssertionError("no session here")

    def close_session(self, state: Any, reason: str) -> None:
        raise AssertionError("no session here")

    def log(self, level: str, message: str, **fields: Any) -> None:
        self.lines.append((level, message, fields))


async def test_the_endpoint_logs_a_uids_refusals_once_a_minute_with_their_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = RecordingHost()
    endpoint = HttpEndpoint(host, ("127.0.0.1", 0))
    other = Peer(1001)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint._log_refusals)
        for _ in range(1000):
            endpoint._refused(Verdict.FOREIGN, other)
        assert [fields["count"] for _, _, fields in host.lines] == [1]
        assert "uid 1001" in host.lines[0][1] and host.lines[0][2]["uid"] == 1001
        await trio.sleep(REFUSAL_LOG_PERIOD - 1)
        for _ in range(5):
            endpoint._refused(Verdict.FOREIGN, other)
        assert len(host.lines) == 1
        await trio.sleep(REFUSAL_LOG_PERIOD / 4)  # the minute is over: its count falls due
        assert [fields["count"] for _, _, fields in host.lines] == [1, 1004]
        assert "refused 1004 more HTTP connections from uid 1001" in host.lines[1][1]
        await trio.sleep(10 * REFUSAL_LOG_PERIOD)  # nothing more refused: nothing more said
        assert len(host.lines) == 2
        nursery.cancel_scope.cancel()


REFUSED_PROBE = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
try:
    print("closed" if s.recv(1) == b"" else "answered", flush=True)
except ConnectionResetError:
    print("closed", flush=True)
"""


async def test_without_sock_diag_a_peers_uid_is_read_from_proc_off_the_loop(
    other_user: OtherUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel without sock_diag the endpoint still knows its peers: the owner is served and
    another uid's connection closed unread, the uid read from /proc/net/tcp in a thread."""
    host = RecordingHost()
    endpoint = HttpEndpoint(host, ("127.0.0.1", 0))
    endpoint._uids.available = False
    monkeypatch.setattr(_peercred._SHARED, "available", False)
    reads: list[object] = []
    real = _peercred.proc_peer_uid

    def counted(*args: Any) -> int | None:
        reads.append(args)
        return real(*args)

    monkeypatch.setattr(_peercred, "proc_peer_uid", counted)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(endpoint.serve)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 404")
            await stream.aclose()
        script = other_user.script("probe.py", REFUSED_PROBE)
        proc = other_user.popen(
            ["/usr/bin/python3", str(script), str(port)], stdout=subprocess.PIPE
        )
        with trio.fail_after(20):
            out, _ = await trio.to_thread.run_sync(proc.communicate)
        assert out == b"closed\n"
        assert len(reads) == 2  # both peers were looked up in /proc
        (refusal,) = [fields for _, _, fields in host.lines if "refusal" in fields]
        assert refusal["uid"] == other_user.uid and refusal["refusal"] == "foreign"
        nursery.cancel_scope.cancel()


def test_the_body_budget_refuses_past_its_cap_and_a_body_alone_always_fits() -> None:
    budget = BodyBudget()
    assert budget.reserve(700, cap=1000)
    assert not budget.reserve(301, cap=1000)
    assert budget.reserve(300, cap=1000)
    budget.release(1000)
    assert budget.reserve(5000, cap=1000)  # alone: maxMessageBytes bounds it
    assert budget.reserve(100, cap=1000, held=5000)  # and it may grow (a chunked body)
    assert not budget.reserve(1, cap=1000)
    budget.release(5100)
    assert budget.reserved == 0
