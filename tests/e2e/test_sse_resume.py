"""SEP-1699 on the daemon's HTTP endpoint (issue 29 item 2): a priming event with an id and the
`retry` field for clients of 2025-11-25, an id on every event, and a stream cut mid-call resumed
by `GET` with `Last-Event-ID`: what the client had not received, then the rest, nothing twice.

Real processes: the daemon with `--http`, the fake stdio upstream, httpx2 as the HTTP client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import trio

from mcpool.daemon._sse import RETRY_MS

from .harness import DaemonFactory
from .support import STEP_TIMEOUT
from .test_http_limits import http_daemon

RESUMABLE = "2025-11-25"
OLDER = "2025-06-18"


def parse_events(text: str) -> list[dict[str, str]]:
    """The SSE events of `text` (complete ones), each as its fields."""
    events = []
    for block in text.split("\n\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        events.append(fields)
    return events


class Client:
    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.sid = ""

    def headers(self, version: str, **more: str) -> dict[str, str]:
        head = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": version,
            **more,
        }
        if self.sid:
            head["mcp-session-id"] = self.sid
        return head

    async def initialize(self, version: str) -> None:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "resume-test", "version": "1"},
            },
        }
        r = await self.http.post(self.url, json=init, headers=self.headers(version))
        assert r.status_code == 200, r.text
        self.sid = r.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        r = await self.http.post(self.url, json=note, headers=self.headers(version))
        assert r.status_code == 202, r.text

    async def events(self, response: httpx2.Response) -> AsyncIterator[dict[str, str]]:
        """The events of a streamed response, as they arrive."""
        text = ""
        async for chunk in response.aiter_text():
            text += chunk
            done, _, text = text.rpartition("\n\n")
            for event in parse_events(done + "\n\n") if done else []:
                yield event


def call(msg_id: int, tool: str, args: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": args}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params}


async def test_a_stream_cut_mid_call_resumes_with_last_event_id(
    daemon_factory: DaemonFactory,
) -> None:
    _, port = await http_daemon(daemon_factory)
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as http:
        client = Client(http, f"http://127.0.0.1:{port}/mcp")
        await client.initialize(RESUMABLE)
        body = call(2, "fake__progress", {"steps": 3, "delay": 0.3}, token="t")
        seen: list[dict[str, str]] = []
        with trio.fail_after(STEP_TIMEOUT):
            async with http.stream(
                "POST", client.url, json=body, headers=client.headers(RESUMABLE)
            ) as r:
                assert r.headers["content-type"] == "text/event-stream"
                async for event in client.events(r):
                    seen.append(event)
                    if "progress" in event.get("data", ""):
                        break  # the connection goes, mid-call, after one progress event
        priming, progress = seen
        # The priming event comes first: an id, empty data, and how long to wait.
        assert priming["data"] == "" and priming["retry"] == str(RETRY_MS), priming
        stream, zero = priming["id"].split("-")
        assert zero == "0"
        assert progress["id"] == f"{stream}-1"

        resumed: list[dict[str, str]] = []
        with trio.fail_after(STEP_TIMEOUT):
            async with http.stream(
                "GET",
                client.url,
                headers=client.headers(RESUMABLE, **{"last-event-id": progress["id"]}),
            ) as r:
                assert r.status_code == 200
                async for event in client.events(r):
                    resumed.append(event)
        messages = [json.loads(e["data"]) for e in resumed]
        # The two progress steps it missed and the answer: nothing it had, nothing lost.
        assert [m.get("params", {}).get("progress") for m in messages[:-1]] == [2, 3]
        assert messages[-1]["id"] == 2 and messages[-1]["result"]["content"][0]["text"] == "done"
        assert [e["id"] for e in resumed] == [f"{stream}-{n}" for n in (2, 3, 4)]


async def test_older_clients_get_ids_and_no_priming_and_an_unknown_stream_is_refused(
    daemon_factory: DaemonFactory,
) -> None:
    _, port = await http_daemon(daemon_factory)
    async with httpx2.AsyncClient(timeout=STEP_TIMEOUT) as http:
        client = Client(http, f"http://127.0.0.1:{port}/mcp")
        await client.initialize(OLDER)
        r = await http.post(
            client.url, json=call(2, "fake__echo", {"text": "hi"}), headers=client.headers(OLDER)
        )
        (event,) = parse_events(r.text)
        assert "retry" not in event and json.loads(event["data"])["id"] == 2
        assert event["id"].endswith("-1"), event
        # A stream that ended whole is not resumable; nor is one that never was.
        for last in (event["id"], "9999-1", "not-an-id"):
            r = await http.get(client.url, headers=client.headers(OLDER, **{"last-event-id": last}))
            assert r.status_code == 400, (last, r.text)
            assert "Last-Event-ID" in r.json()["error"]["data"]["reason"], r.text
