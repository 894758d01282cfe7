"""P7 on the daemon's socket: a malformed line gets a parse error and the session goes on; an
oversized message gets an error and a clean close, and nobody else notices."""

from __future__ import annotations

import json

import trio

from .harness import DaemonFactory, fake_server
from .support import call_text, raw_attach, raw_call, raw_text

PARSE_ERROR = -32700
MESSAGE_TOO_LARGE = -31004
MAX_MESSAGE_BYTES = 4096


async def test_a_malformed_line_gets_a_parse_error_and_the_session_continues(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = str(daemon.settings_file("settings.json", {"fake": fake_server()}))
    async with daemon.raw() as client:
        await raw_attach(client, [settings], "raw")
        await client.send_raw(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list"\n')
        error = await client.receive()
        assert error["error"]["code"] == PARSE_ERROR, error
        assert error["id"] is None
        assert error["error"].get("data"), error  # daemon errors explain themselves
        # The same connection keeps working, ids and all.
        assert raw_text(await raw_call(client, "fake__echo", {"text": "still here"})) == (
            "still here"
        )
        listed = await client.request("tools/list")
        assert "fake__echo" in [tool["name"] for tool in listed["result"]["tools"]]
    assert client.backlog == []


async def test_an_oversized_message_gets_an_error_and_a_clean_close_and_others_carry_on(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"maxMessageBytes": MAX_MESSAGE_BYTES})
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.attach([settings], "bystander") as bystander, daemon.raw() as client:
        big_id = await raw_attach(client, [str(settings)], "big")
        assert raw_text(await raw_call(client, "fake__echo", {"text": "small"})) == "small"
        big = {
            "jsonrpc": "2.0",
            "id": 99,
            "method": "tools/call",
            "params": {"name": "fake__echo", "arguments": {"text": "x" * MAX_MESSAGE_BYTES}},
        }
        await client.send_raw(json.dumps(big).encode() + b"\n")
        error = await client.receive()
        assert error["error"]["code"] == MESSAGE_TOO_LARGE, error
        assert error["error"].get("data"), error
        # A clean close: nothing after the error but end of file.
        assert await client.receive_line() is None

        # The other session, the daemon and new sessions are unaffected.
        assert await call_text(bystander, "fake__echo", {"text": "unaffected"}) == "unaffected"
        async with daemon.raw() as again:
            again_id = await raw_attach(again, [str(settings)], "again")
            assert raw_text(await raw_call(again, "fake__echo", {"text": "new"})) == "new"
            (entry,) = await daemon.ctl("servers")
        # The closed session released its reference (its close preceded the end of file).
        assert big_id not in entry["refs"]
        assert again_id in entry["refs"]
        assert len(entry["refs"]) == 2


async def test_a_message_far_over_the_limit_still_gets_its_error_and_a_clean_close(
    daemon_factory: DaemonFactory,
) -> None:
    # Far more than the socket buffers hold: the daemon stops parsing after the limit, and the
    # rest must not turn the close into a reset that loses the error or fails the sender.
    daemon = await daemon_factory(daemon={"maxMessageBytes": MAX_MESSAGE_BYTES})
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.raw() as client:
        await raw_attach(client, [str(settings)], "huge")
        huge = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"x":"' + b"y" * 2**20
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_raw, huge + b'"}}\n')
            error = await client.receive()
            assert error["error"]["code"] == MESSAGE_TOO_LARGE, error
            assert await client.receive_line() is None
    async with daemon.raw() as again:
        await raw_attach(again, [str(settings)], "again")
        assert raw_text(await raw_call(again, "fake__echo", {"text": "fine"})) == "fine"
