"""The daemon's pin book and its file (daemon/_pinkeeper.py), with real files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio
import trio.testing

from mcpool.daemon import _pinkeeper, _pinstore
from mcpool.daemon._pinkeeper import PinKeeper
from mcpool.pool import Snapshot
from mcpool.protocol import InvalidParams


def snapshot(generation: int, description: str) -> Snapshot:
    tool = {"name": "read", "description": description, "inputSchema": {"type": "object"}}
    return Snapshot(generation, available=True, tools=(tool,))


async def test_the_book_is_written_after_a_change_and_read_by_the_next_daemon(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "pins"
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
    (written,) = path.iterdir()
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    again = PinKeeper(path, lambda: "hold", lambda level, text: None)
    again.load()
    assert again.state("/p/.mcp.json", "fs", None, snapshot(2, "Reads. Obey.")).held == {"read"}
    # Another settings file's server of the same name is pinned on its own.
    assert not again.state("/q/.mcp.json", "fs", None, snapshot(2, "Reads. Obey.")).held


async def test_the_last_change_is_written_when_the_daemon_ends(tmp_path: Path) -> None:
    path = tmp_path / "pins"
    keeper = PinKeeper(path, lambda: "warn", lambda level, text: None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            await trio.testing.wait_all_tasks_blocked()
            keeper.state(None, "fs", None, snapshot(1, "Reads."))
            nursery.cancel_scope.cancel()  # before the writer ran
    ((key, _, _),), _ = _pinstore.index(path)
    assert key == ("", "fs")


def test_an_unreadable_pin_file_is_named_and_moved_aside(tmp_path: Path) -> None:
    bad = tmp_path / _pinstore.file_name(("/p", "fs"))
    bad.write_text("{not json")
    logged: list[tuple[str, str]] = []
    keeper = PinKeeper(tmp_path, lambda: "hold", lambda level, text: logged.append((level, text)))
    keeper.load()
    ((level, text),) = logged
    assert level == "error" and str(bad) in text and "moved to" in text
    assert not bad.exists() and len(list(tmp_path.glob("*.unreadable-*"))) == 1
    assert keeper.book == {} and keeper.status_json()["servers"] == 0


def test_approving_nothing_pending_is_an_error_naming_the_server() -> None:
    keeper = PinKeeper(None, lambda: "hold", lambda level, text: None)
    keeper.state(None, "fs", None, snapshot(1, "Reads."))
    with pytest.raises(InvalidParams, match="server 'fs' has no pending change of read"):
        keeper.approve("fs", ["read"])


def test_servers_not_judged_lately_are_read_again_and_the_book_is_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_pinkeeper, "MAX_DECODED", 2)
    monkeypatch.setattr(_pinkeeper, "MAX_SERVERS", 5)
    logged: list[str] = []
    folder = tmp_path / "pins"
    keeper = PinKeeper(folder, lambda: "hold", lambda lv, text: logged.append(text))
    keeper.state("/p0", "fs", None, snapshot(1, "Reads."))
    keeper.state("/p0", "fs", None, snapshot(2, "Reads. Obey."))  # a change, pending
    keeper.save_now()
    for n in range(1, 5):
        keeper.state(f"/p{n}", "fs", None, snapshot(1, "Reads."))
    # Decoded: the two judged last; the rest indexed (on disk, or owed to it), pending counted.
    assert set(keeper.book) == {("/p3", "fs"), ("/p4", "fs")}
    assert keeper.status_json()["servers"] == 5 and keeper.status_json()["pending"] == 1
    keeper.save_now()
    assert len(list(folder.iterdir())) == 5
    # One read again is the same book: its change is still held.
    assert keeper.state("/p0", "fs", None, snapshot(3, "Reads. Obey.")).held == {"read"}
    assert [(r["source"], r["pending"]) for r in keeper.changes_json()] == [("/p0", True)]
    # One server more than MAX_SERVERS: the least recently judged is forgotten, its file gone.
    keeper.state("/p5", "fs", None, snapshot(1, "Reads."))
    keeper.save_now()
    assert keeper.status_json()["servers"] == 5
    assert any("forgotten" in text and "/p1" in text for text in logged)
    assert not (folder / _pinstore.file_name(("/p1", "fs"))).exists()
    assert len(list(folder.iterdir())) == 5


async def test_the_daemon_indexes_its_pin_files_in_its_writer_task(tmp_path: Path) -> None:
    """Not on the way to serving: `run` reads the folder in a thread; what was judged before
    it is done is read from its own file all the same."""
    folder = tmp_path / "pins"
    first = PinKeeper(folder, lambda: "hold", lambda level, text: None)
    first.state("/p", "fs", None, snapshot(1, "Reads."))
    first.state("/p", "fs", None, snapshot(2, "Reads. Obey."))
    first.state("/r", "fs", None, snapshot(1, "Reads."))
    first.save_now()
    keeper = PinKeeper(folder, lambda: "hold", lambda level, text: None)
    assert keeper.status_json()["servers"] == 0  # nothing read yet
    assert keeper.state("/p", "fs", None, snapshot(3, "Reads. Obey.")).held == {"read"}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            while keeper.status_json()["servers"] < 2:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert keeper.status_json() | {"warnings": []} == {
        "mode": "hold",
        "folder": str(folder),
        "servers": 2,
        "pending": 1,
        "warnings": [],
    }
