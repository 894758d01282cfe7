"""Issue 12 acceptance: a hypothesis fuzzer against a real `mcpool daemon` process.

A real daemon with a real upstream (tools/fake_upstream.py) behind it. Each example opens a
fresh connection (attached, or an implicit session whose first line is hostile), sends it the
lines hypothesis drew (tests/hostile.py: wrong types in every field of every method mcpool
handles, hostile ids, batches, duplicate ids, responses to requests never sent, notifications
for unknown ids, raw bytes, long lines), and then checks:

- every request got exactly one answer under its id (a cancelled one at most one), and each
  line that is not a message one error with a null id; a line over `maxMessageBytes` gets the
  documented refusal (MESSAGE_TOO_LARGE, then the connection closes) and ends the example;
- a second session, attached once for the whole run, still answers a ping and a tools/call.

Hypothesis runs in a worker thread with blocking sockets (each receive bounded by a socket
timeout), so the daemon stays one process for the whole run. The example count is modest: the
run takes seconds on a 2-core CI machine.
"""

from __future__ import annotations

import collections
import itertools
import json
import socket
from typing import Any

import hostile
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from .harness import DaemonFactory, fake_server
from .support import PROTOCOL_VERSION, STEP_TIMEOUT

MAX_MESSAGE_BYTES = 16 * 1024  # hostile.lines draws lines past it: the refusal is exercised
MESSAGE_TOO_LARGE = -31004
EXAMPLES = 60
_TOOLS = ["fake__echo", "fake__fail", "fake__pid"]
_PROMPTS = ["fake__greet"]
_URIS = ["fake://readme", "fake://item/1"]
_serial = itertools.count(1)
_CANCEL = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%s}}'


class _Client:
    """Newline-delimited JSON on the daemon's socket, blocking, every receive bounded."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(STEP_TIMEOUT)
        self.sock.connect(path)
        self.buffer = b""
        self.received: list[Any] = []  # every message read, in order (batches as lists)
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> Any | None:
        """The next message, or None once the daemon closed the connection."""
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message = json.loads(line)
        self.received.append(message)
        return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        rid = f"check-{next(_serial)}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        self.send(hostile.encode(message) + b"\n")
        while True:
            got = self.receive()
            assert got is not None, "the daemon closed the connection"
            if isinstance(got, dict) and got.get("id") == rid and "method" not in got:
                return got

    def attach(self, settings: str, name: str, *, initialize: bool) -> None:
        attached = self.request("mcpool/attach", {"sources": [settings], "name": name})
        assert "result" in attached, attached
        if initialize:
            init = self.request(
                "initialize",
                {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {}},
            )
            assert "result" in init, init
            self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.received.clear()

    def close(self) -> None:
        self.sock.close()


def _check_bystander(bystander: _Client) -> None:
    assert "result" in bystander.request("ping")
    text = f"still here {next(_serial)}"
    called = bystander.request("tools/call", {"name": "fake__echo", "arguments": {"text": text}})
    assert called["result"]["content"][0]["text"] == text, called


def _run(sock: str, settings_path: str) -> None:
    bystander = _Client(sock)
    bystander.attach(settings_path, "bystander", initialize=True)
    _check_bystander(bystander)

    @settings(
        deadline=None,
        max_examples=EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        how=st.sampled_from(["attach", "attach+initialize", "implicit"]),
        lines=st.lists(hostile.lines(_TOOLS, _PROMPTS, _URIS), min_size=1, max_size=6),
    )
    # The one-liners, and an upstream-facing cousin, always run first.
    @example(how="attach+initialize", lines=[_CANCEL % b"{}", _CANCEL % b"[1]"])
    @example(how="implicit", lines=[_CANCEL % b"{}"])
    @example(how="attach", lines=[b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]' * 1, b"[" * 5000])
    def one(how: str, lines: list[bytes]) -> None:
        client = _Client(sock)
        try:
            if how != "implicit":
                client.attach(settings_path, "fuzz", initialize=how == "attach+initialize")
            _one_example(client, lines)
        finally:
            client.close()
        _check_bystander(bystander)

    try:
        one()
    finally:
        bystander.close()


def _one_example(client: _Client, lines: list[bytes]) -> None:
    want: collections.Counter[Any] = collections.Counter()
    nulls, cancelled = 0, set()
    for line in lines:
        w, n, c = hostile.expected_answers(line, framed=True)
        want += w
        nulls += n
        cancelled |= c
    client.send(b"".join(line + b"\n" for line in lines))
    end = f"end-{next(_serial)}"
    client.send(hostile.encode({"jsonrpc": "2.0", "id": end, "method": "ping"}) + b"\n")
    end_key = hostile.key(end)
    want[end_key] += 1

    def answers() -> list[dict[str, Any]]:
        return hostile.answers_in(b"\n".join(hostile.encode(m) for m in client.received))

    def settled() -> bool:
        got = collections.Counter(hostile.key(a["id"]) for a in answers() if a["id"] is not None)
        return all(got[k] >= n for k, n in want.items() if k not in cancelled)

    while not settled():
        if client.receive() is None:
            break
    done = answers()
    if client.closed:
        # The documented refusal of a line over the limit: its error, then the close.
        last = done[-1] if done else None
        assert last is not None and last["error"]["code"] == MESSAGE_TOO_LARGE, client.received
        return
    got = collections.Counter(hostile.key(a["id"]) for a in done if a["id"] is not None)
    assert sum(1 for a in done if a["id"] is None) == nulls, client.received
    for key in set(want) | set(got):
        if key in cancelled:
            assert got[key] <= want[key], (key, client.received)
        else:
            assert got[key] == want[key], (key, want, client.received)


async def test_hostile_json_rpc_never_takes_the_daemon_down(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(
        {"fake": fake_server()}, daemon={"maxMessageBytes": MAX_MESSAGE_BYTES}
    )
    await trio.to_thread.run_sync(_run, str(daemon.sock), str(daemon.config_path))
    assert daemon.process is not None and daemon.process.poll() is None, daemon.output()
    log = daemon.log_path.read_text()
    assert "internal error" not in log, log[-4000:]
    assert await daemon.stop() == 0
