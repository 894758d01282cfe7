"""A modern HTTP upstream's subscriptions/listen stream, against a real SDK server
(tools/conformance_server.py over streamable HTTP, a child process on 127.0.0.1).

The listen request carries the standard headers like every 2026-07-28 request (its id is a
string, which the POST path once took for "not a request": the SDK refused it with -32020), and
its response stream is read for as long as it is open (it was closed after the first event), so
a list change the server announces on it reaches the pool's snapshot.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpool.pool import Handle, Pool, PoolEntry, PoolOptions, ServerSettings, identity_of
from mcpool.protocol import Message

WAIT = 10.0  # loopback only; this turns a hang into a failure
POLL = 0.05  # while the server process starts listening
SERVER = Path(__file__).resolve().parents[2] / "tools" / "conformance_server.py"


class Listener:
    def __init__(self) -> None:
        self.changed = trio.Event()

    def snapshot_changed(self, entry: PoolEntry) -> None:
        self.changed.set()

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Any, msg: Message) -> str | None:
        return "not in this test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _served(port: int, proc: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(WAIT):
        while True:
            assert proc.poll() is None, "the conformance server exited"
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(POLL)
                continue
            await stream.aclose()
            return


async def _call(handle: Handle, tool: str) -> None:
    upstream = handle.entry.upstream
    assert upstream is not None
    done = trio.Event()
    handle.in_flight += 1

    def answered(msg: Message) -> None:
        assert msg.result is not msgspec.UNSET, bytes(msg.error)
        handle.in_flight -= 1
        done.set()

    params = upstream.prepare({"name": tool, "arguments": {}}, {})  # the modern envelope
    upstream.send_request("tools/call", msgspec.json.encode(params), answered)
    with trio.fail_after(WAIT):
        await done.wait()


def _names(items: Any) -> list[str]:
    return [item["name"] for item in items]


async def test_a_list_change_announced_on_the_listen_stream_reaches_the_snapshot(
    nursery: trio.Nursery,
) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _served(port, proc)
        pool = Pool(nursery, PoolOptions())
        settings = ServerSettings(type="http", url=f"http://127.0.0.1:{port}/mcp")
        listener = Listener()
        with trio.fail_after(WAIT):
            handle = await pool.acquire(identity_of("ref", settings), settings, "a", listener)
        entry = handle.entry
        assert entry.upstream is not None and entry.upstream.era == "modern", entry.last_error
        assert "test_toggled_prompt" not in _names(entry.snapshot.prompts)
        for tool, kind, name in (
            ("test_trigger_prompt_change", "prompts", "test_toggled_prompt"),
            ("test_trigger_tool_change", "tools", "test_toggled_tool"),
        ):
            listener.changed = trio.Event()
            await _call(handle, tool)
            with trio.fail_after(WAIT):
                while name not in _names(getattr(entry.snapshot, kind)):
                    await listener.changed.wait()
                    listener.changed = trio.Event()
        await pool.aclose()
    finally:
        proc.kill()
        proc.wait()
