"""Issue 29 items 5 and 7 with real processes: a daemon, the fake upstream, a raw socket session.

Item 5: what a session asked of a server (its subscriptions, its log level) follows it to the
process that replaces that server's connection after a transport change, as it already did after
`daemonctl restart`.
Item 7: a URI that no current server of the session lists or matches by template is answered
"resource not found" by mcpool, naming it, and never reaches a server.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from e2e.harness import DaemonFactory, DaemonProcess, RawSocketClient, fake_server, write_settings
from e2e.test_startup import attach_raw

STEP = 15.0  # bounds a hang
README = "fake://readme"


async def open_session(
    client: RawSocketClient,
    d: DaemonProcess,
    settings: Any,
    name: str = "follower",
    version: str = "1",
) -> str:
    """A raw socket session attached to `settings` and initialized as client `name`: its id."""
    sid = await attach_raw(client, d, settings, name)
    await client.request(
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": name, "version": version},
        },
    )
    await client.notify("notifications/initialized")
    return sid


def by_process(lines: list[str]) -> dict[str, list[str]]:
    """The server's stderr lines, split by the process that wrote them (its "started pid=")."""
    chunks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        if "started pid=" in line:
            current = chunks.setdefault(line.rsplit("=", 1)[1], [])
        current.append(line)
    return chunks


async def test_a_transport_change_takes_the_subscriptions_and_level_to_the_new_process(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    path = d.root / "s.json"
    settings = write_settings(path, {"up": fake_server(FAKE_TAG=1)})
    async with d.raw() as client:
        with trio.fail_after(STEP):
            await open_session(client, d, settings)
            assert "result" in await client.request("resources/subscribe", {"uri": README})
            assert "result" in await client.request("logging/setLevel", {"level": "debug"})
            first = by_process((await d.ctl("logs", "up"))["lines"])
            assert len(first) == 1, first
            # Another environment: another transport identity, so another process.
            write_settings(path, {"up": fake_server(FAKE_TAG=2)})
            while True:
                chunks = by_process((await d.ctl("logs", "up"))["lines"])
                new = [lines for pid, lines in chunks.items() if pid not in first]
                if new and any("subscribe" in ln for ln in new[0]):
                    break
                await trio.sleep(0.05)
            await trio.sleep(0.2)  # anything told late would show too
            new = [
                lines
                for pid, lines in by_process((await d.ctl("logs", "up"))["lines"]).items()
                if pid not in first
            ]
    told = [ln.split(": ", 1)[1] for ln in new[0] if "subscribe" in ln or "setLevel" in ln]
    assert sorted(told) == ["setLevel debug", f"subscribe {README}"], new[0]


async def test_a_uri_no_server_lists_is_not_forwarded(daemon_factory: DaemonFactory) -> None:
    d = await daemon_factory()
    # The only server with resources: the old fallback sent every unlisted URI to it.
    settings = write_settings(d.root / "s.json", {"up": fake_server()})
    stray = "gone://server/doc.md"
    async with d.raw() as client:
        with trio.fail_after(STEP):
            await open_session(client, d, settings)
            read = await client.request("resources/read", {"uri": stray})
            subscribed = await client.request("resources/subscribe", {"uri": stray})
            listed = await client.request("resources/read", {"uri": README})
            lines = (await d.ctl("logs", "up"))["lines"]
    for reply in (read, subscribed):
        assert "error" in reply, reply
        assert stray in json.dumps(reply["error"]), reply
    assert "result" in listed, listed
    assert not [ln for ln in lines if stray in ln], lines
