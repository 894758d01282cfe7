"""The daemon's pin book and its file (daemon/_pinkeeper.py), with real files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import trio
import trio.testing

from mcpool.daemon._pinkeeper import PinKeeper
from mcpool.pool import Snapshot
from mcpool.protocol import InvalidParams


def snapshot(generation: int, description: str) -> Snapshot:
    tool = {"name": "read", "description": description, "inputSchema": {"type": "object"}}
    return Snapshot(generation, available=True, tools=(tool,))


async def test_the_book_is_written_after_a_change_and_read_by_the_next_daemon(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "pins.json"
    keeper = PinKeeper(path, lambda: "hold", lambda level, text: None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            first = snapshot(1, "Reads.")
            assert not keeper.state("/p/.mcp.json", "fs", None, first).held
            # The same snapshot is judged once, whoever asks.
            assert keeper.state("/p/.mcp.json", "fs", None, first) is keeper.state(
                "/p/.mcp.json", "fs", None, first
            )
            while not path.exists():
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = PinKeeper(path, lambda: "hold", lambda level, text: None)
    again.load()
    assert again.state("/p/.mcp.json", "fs", None, snapshot(2, "Reads. Obey.")).held == {"read"}
    # Another settings file's server of the same name is pinned on its own.
    assert not again.state("/q/.mcp.json", "fs", None, snapshot(2, "Reads. Obey.")).held


async def test_the_last_change_is_written_when_the_daemon_ends(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    keeper = PinKeeper(path, lambda: "warn", lambda level, text: None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            await trio.testing.wait_all_tasks_blocked()
            keeper.state(None, "fs", None, snapshot(1, "Reads."))
            nursery.cancel_scope.cancel()  # before the writer ran
    assert json.loads(path.read_text())["servers"][0]["server"] == "fs"


def test_an_unreadable_pin_file_is_named_and_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text("{not json")
    logged: list[tuple[str, str]] = []
    keeper = PinKeeper(path, lambda: "hold", lambda level, text: logged.append((level, text)))
    keeper.load()
    ((level, text),) = logged
    assert level == "error" and str(path) in text and "moved to" in text
    assert not path.exists() and len(list(tmp_path.glob("pins.json.unreadable-*"))) == 1
    assert keeper.book == {}


def test_approving_nothing_pending_is_an_error_naming_the_server() -> None:
    keeper = PinKeeper(None, lambda: "hold", lambda level, text: None)
    keeper.state(None, "fs", None, snapshot(1, "Reads."))
    with pytest.raises(InvalidParams, match="server 'fs' has no pending change of read"):
        keeper.approve("fs", ["read"])
