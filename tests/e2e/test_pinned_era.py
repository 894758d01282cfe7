"""Issue 29 item 1, its setting: `protocolVersion` pins the revision mcpool speaks to a server.

Real processes: a daemon; the SDK 2.x asking upstream (tests/e2e/sdk_asking_upstream.py), which
serves both eras, so mcpool speaks 2026-07-28 to it unless pinned; the fake upstream, which
speaks only the handshake era; an SDK client.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio

from e2e.harness import DaemonFactory, fake_server, write_settings
from e2e.support import wait_until
from e2e.test_input_required_sdk import ASKING_UPSTREAM, EXPECTED, _call_through_mcpool

WAIT = 30.0


@pytest.mark.parametrize(
    ("pin", "era", "version"),
    [
        # Unpinned, a 2025 session of this dual-era server gets a connection at its revision.
        (None, "handshake", "2025-11-25"),
        ("2025-06-18", "handshake", "2025-06-18"),
        ("2026-07-28", "modern", "2026-07-28"),
    ],
)
async def test_a_pinned_server_is_spoken_to_at_its_revision(
    daemon_factory: DaemonFactory, pin: str | None, era: str, version: str
) -> None:
    upstream: dict[str, Any] = {"command": sys.executable, "args": [str(ASKING_UPSTREAM)]}
    if pin is not None:
        upstream["protocolVersion"] = pin
    # A handshake-era client: asked mid-call by the server itself on a handshake connection,
    # through mcpool's input rounds on the modern one; the same answer either way.
    text, kinds, _client_version, found_era = await _call_through_mcpool(
        daemon_factory, client_mode="legacy", upstream_args=[], tool="ask_name", upstream=upstream
    )
    assert (text, kinds) == EXPECTED["ask_name"]
    assert found_era == era


async def test_a_server_pinned_to_2026_that_does_not_speak_it_fails_saying_so(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    settings = write_settings(
        d.root / "s.json", {"up": {**fake_server(), "protocolVersion": "2026-07-28"}}
    )
    async with d.raw() as client:
        reply = await client.request(
            "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": "p"}
        )
        assert "result" in reply, reply

        async def failed() -> bool:
            servers = await d.ctl("servers")
            return bool(servers) and servers[0]["state"] == "failed"

        with trio.fail_after(WAIT):
            await wait_until(failed)
    (server,) = await d.ctl("servers")
    assert "protocolVersion" in server["last_error"] and "2026-07-28" in server["last_error"]


async def test_an_unknown_revision_is_refused_naming_the_file_server_and_field(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory()
    settings = write_settings(
        d.root / "s.json", {"up": {**fake_server(), "protocolVersion": "2099-01-01"}}
    )
    async with d.raw() as client:
        reply = await client.request(
            "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": "p"}
        )
        assert "result" in reply, reply
        servers = await d.ctl("servers")
        lines = (await d.ctl("logs"))["lines"]
    assert servers == []
    [refused] = [ln for ln in lines if "not applied" in ln]
    for named in (str(settings), "server 'up'", "field 'protocolVersion'", "2099-01-01"):
        assert named in refused, refused
