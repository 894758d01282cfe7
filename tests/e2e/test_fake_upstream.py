"""The fake upstream peer itself, driven by the real SDK client (and raw stdio where the SDK
hides what matters), so every test that relies on it relies on something known good."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import psutil
import pytest
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError

from .harness import FAKE_UPSTREAM, fake_server

# Every exchange with the fake is local and sub-second; this only turns a hang into a failure.
STEP_TIMEOUT = 10.0


@asynccontextmanager
async def fake_session(
    message_handler: Any = None, **env: str | int | float
) -> AsyncIterator[ClientSession]:
    entry = fake_server(**env)
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=message_handler) as session,
    ):
        with trio.fail_after(STEP_TIMEOUT):
            await session.initialize()
        yield session


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_handshake_tools_and_pid() -> None:
    async with fake_session(FAKE_INSTRUCTIONS="be nice", FAKE_TOOLS="a,b") as session:
        assert session.server_info is not None
        assert session.server_info.name == "fake-upstream"
        assert session.instructions == "be nice"
        caps = session.server_capabilities
        assert caps is not None
        assert caps.tools is not None
        assert caps.tools.list_changed
        with trio.fail_after(STEP_TIMEOUT):
            names = [tool.name for tool in (await session.list_tools()).tools]
            pid_result = await session.call_tool("pid")
            echoed = await session.call_tool("echo", {"text": "hi"})
            a = await session.call_tool("a")
            failed = await session.call_tool("fail")
            with pytest.raises(MCPError) as unknown:
                await session.call_tool("nope")
        assert names[:9] == [
            "pid", "echo", "env", "sleep", "progress", "crash", "set_tools", "log", "fail",
        ]  # fmt: skip
        assert names[9:] == ["a", "b"]
        pid = int(text_of(pid_result))
        assert pid_result.structured_content == {"pid": pid}
        assert pid != os.getpid()
        assert text_of(echoed) == "hi"
        assert text_of(a) == "a"
        assert failed.is_error
        assert text_of(failed) == "failed on purpose"
        assert unknown.value.code == -32602


async def test_progress_notifications_arrive_in_order() -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with fake_session() as session:
        with trio.fail_after(STEP_TIMEOUT):
            result = await session.call_tool(
                "progress", {"steps": 3, "delay": 0.01}, progress_callback=on_progress
            )
    assert text_of(result) == "done"
    assert seen == [(1, 3), (2, 3), (3, 3)]


async def test_set_tools_sends_list_changed() -> None:
    changed = trio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with fake_session(message_handler=on_message) as session:
        with trio.fail_after(STEP_TIMEOUT):
            await session.call_tool("set_tools", {"names": ["alpha", "beta"]})
            await changed.wait()
            names = {tool.name for tool in (await session.list_tools()).tools}
            beta = await session.call_tool("beta")
    assert {"alpha", "beta"} <= names
    assert text_of(beta) == "beta"


async def test_prompts_resources_completion_and_pagination() -> None:
    async with fake_session(FAKE_PAGE_SIZE=4, FAKE_TOOL_COUNT=5) as session:
        with trio.fail_after(STEP_TIMEOUT):
            names: list[str] = []
            cursor: str | None = None
            pages = 0
            while True:
                page = await session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                pages += 1
                names += [tool.name for tool in page.tools]
                if (cursor := page.next_cursor) is None:
                    break
            prompts = await session.list_prompts()
            greeting = await session.get_prompt("greet", {"name": "Ada"})
            resources = await session.list_resources()
            templates = await session.list_resource_templates()
            readme = await session.read_resource("fake://readme")
            item = await session.read_resource("fake://item/42")
            with pytest.raises(MCPError) as missing:
                await session.read_resource("fake://nothing")
            completion = await session.complete(
                types.PromptReference(name="greet"), {"name": "name", "value": "a"}
            )
            # Not set_logging_level(): it warns (deprecated in 2026-07-28); the fake is legacy-era.
            await session.send_request(
                types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug")),
                types.EmptyResult,
            )
            await session.send_ping()
    assert pages == 4  # 9 builtins + 5 counted tools, 4 per page
    assert names[-5:] == [f"tool_{i}" for i in range(5)]
    assert len(set(names)) == 14
    assert [p.name for p in prompts.prompts] == ["greet"]
    content = greeting.messages[0].content
    assert isinstance(content, types.TextContent)
    assert content.text == "Hello, Ada!"
    assert [str(r.uri) for r in resources.resources] == ["fake://readme"]
    assert [t.uri_template for t in templates.resource_templates] == ["fake://item/{id}"]
    readme_text = readme.contents[0]
    assert isinstance(readme_text, types.TextResourceContents)
    assert readme_text.text.startswith("hello from ")
    item_text = item.contents[0]
    assert isinstance(item_text, types.TextResourceContents)
    assert item_text.text == "item 42"
    assert missing.value.code == -32002
    assert completion.completion.values == ["alpha", "beta"]


class RawFake:
    """The fake over plain pipes, for what the SDK client hides: cancellation without a
    response, exit codes, stdin EOF, process groups."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def call(self, request_id: int, name: str, arguments: dict[str, Any]) -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            }
        )

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while (end := self._buffer.find(b"\n")) < 0:
            chunk = await self.process.stdout.receive_some()
            assert chunk, "fake upstream closed stdout"
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        message: dict[str, Any] = json.loads(line)
        return message


@asynccontextmanager
async def raw_fake(tmp_path: Path, **env: str) -> AsyncIterator[RawFake]:
    stderr = (tmp_path / "fake.stderr").open("wb")
    process = await trio.lowlevel.open_process(
        [sys.executable, str(FAKE_UPSTREAM)],
        stdin=-1,  # subprocess.PIPE
        stdout=-1,
        stderr=stderr,
        env={**os.environ, **env},
        # Its own process group, as the daemon spawns upstreams, so killpg reaches the tree.
        start_new_session=True,
    )
    try:
        yield RawFake(process)
    finally:
        with trio.move_on_after(STEP_TIMEOUT, shield=True):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    await pipe.aclose()
        stderr.close()


async def test_cancelled_call_gets_no_response(tmp_path: Path) -> None:
    async with raw_fake(tmp_path) as fake:
        with trio.fail_after(STEP_TIMEOUT):
            await fake.call(1, "sleep", {"seconds": 0.2})
            await fake.send(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 1},
                }
            )
            # Outlives the cancelled sleep: had id 1 been answered, it would arrive first.
            await fake.call(2, "sleep", {"seconds": 0.4})
            await fake.call(3, "echo", {"text": "not blocked"})
            first = await fake.receive()
            second = await fake.receive()
    assert first["id"] == 3
    assert first["result"]["content"][0]["text"] == "not blocked"
    assert second["id"] == 2


async def test_crash_exit_code_and_stdin_eof(tmp_path: Path) -> None:
    async with raw_fake(tmp_path) as fake:
        with trio.fail_after(STEP_TIMEOUT):
            await fake.call(1, "crash", {"code": 7})
            assert await fake.process.wait() == 7
    async with raw_fake(tmp_path) as fake:
        assert fake.process.stdin is not None
        with trio.fail_after(STEP_TIMEOUT):
            await fake.process.stdin.aclose()
            assert await fake.process.wait() == 0


async def test_child_shares_the_process_group(tmp_path: Path) -> None:
    spawn_log = tmp_path / "spawns"
    async with raw_fake(tmp_path, FAKE_CHILD="1", FAKE_SPAWN_LOG=str(spawn_log)) as fake:
        with trio.fail_after(STEP_TIMEOUT):
            await fake.call(1, "pid", {})
            await fake.receive()
        # The pid answer comes after start-up, so the child line is already written.
        stderr = (tmp_path / "fake.stderr").read_text()
        child_pid = int(stderr.split("fake-upstream: child=")[1].split()[0])
        child = psutil.Process(child_pid)
        assert child.ppid() == fake.process.pid
        assert os.getpgid(child_pid) == fake.process.pid
        assert spawn_log.read_text() == f"{fake.process.pid}\n"
        os.killpg(fake.process.pid, signal.SIGTERM)
        with trio.fail_after(STEP_TIMEOUT):
            await fake.process.wait()
        # psutil.wait_procs blocks the thread; the child is SIGTERMed already, so it is short.
        _gone, alive = psutil.wait_procs([child], timeout=STEP_TIMEOUT)
        assert not alive
