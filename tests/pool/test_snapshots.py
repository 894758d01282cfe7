"""Stored discovery snapshots (issue 14, point 2): the pool side on a fake upstream and a
MockClock, the record's pure decisions, and the daemon's file store on real files."""

from __future__ import annotations

import json
import os
import stat
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from fakes import FakeNet, FakeServer, make_pool, stdio, tool
from hypothesis import given
from hypothesis import strategies as st

from mcpool.daemon._snapshots import (
    MAX_SNAPSHOT_FILE_BYTES,
    FileSnapshotStore,
    describe_snapshot,
    encode_record,
    eviction,
    snapshot_file_name,
)
from mcpool.pool import (
    SNAPSHOT_FORMAT,
    MemorySnapshotStore,
    Pool,
    PoolEntry,
    Snapshot,
    StoredSnapshot,
    identity_of,
)
from mcpool.pool._snapshots import from_record, invalidation, to_record

START_TIMEOUT_MS = 4000  # the entry's `timeout`: how long a call waits for a cached server


async def when_up(entry: PoolEntry) -> str | None:
    """Park like a session's request for a starting server (`PoolEntry.when_up`): None once the
    upstream is up, else the error the start ended with."""
    settled = trio.Event()
    outcome: list[str | None] = []

    def resume(error: str | None) -> None:
        outcome.append(error)
        settled.set()

    entry.when_up(resume)
    await settled.wait()
    return outcome[0]


class Listener:
    def __init__(self) -> None:
        self.seen: list[Snapshot] = []

    def snapshot_changed(self, entry: PoolEntry) -> None:
        self.seen.append(entry.snapshot)

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> None:
        return None


class Logs:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, level: str, message: str, **fields: Any) -> None:
        self.lines.append(f"{level}: {message}")


def _pool(nursery: trio.Nursery, net: FakeNet, store: MemorySnapshotStore, log: Logs) -> Pool:
    pool = make_pool(nursery, net)
    pool._snapshots = store
    pool.log = log
    return pool


def _record(fingerprint: str, *names: str, version: str = "1.0") -> StoredSnapshot:
    return StoredSnapshot(
        fingerprint=fingerprint,
        server_name="srv",
        server_version=version,
        tools=tuple(tool(n) for n in names),
        capabilities={"tools": {}},
    )


SETTINGS = stdio("srv", timeout=START_TIMEOUT_MS)
IDENTITY = identity_of("srv", SETTINGS)


async def test_a_stored_snapshot_is_the_first_snapshot_and_a_request_waits_for_the_server(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    server = FakeServer(tools=[tool("alpha"), tool("beta")])
    server.start_gate = gate
    net = FakeNet(srv=server)
    store = MemorySnapshotStore()
    store.save(_record(IDENTITY.fingerprint, "alpha"))
    log = Logs()
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, net, store, log)
        listener = Listener()
        # Returns at once: the stored snapshot stands in while the server starts.
        with trio.fail_after(0.001):
            handle = await pool.acquire(IDENTITY, SETTINGS, "s1", listener)
        entry = handle.entry
        assert entry.snapshot.cached and entry.snapshot.available
        assert [t["name"] for t in entry.snapshot.tools] == ["alpha"]
        assert describe_snapshot(entry.snapshot) == "cached"

        got: list[object] = []

        async def request() -> None:
            got.append(await when_up(entry))

        nursery.start_soon(request)
        await trio.sleep(1.0)
        assert got == []  # still waiting for the server
        server.current.server_info = {"name": "srv", "version": "1.0"}
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert got == [None]  # up: the parked request goes on
        assert entry.upstream is server.current
        assert not entry.snapshot.cached
        assert [t["name"] for t in entry.snapshot.tools] == ["alpha", "beta"]
        assert describe_snapshot(entry.snapshot) == "live"
        assert [s.cached for s in listener.seen] == [False]  # one change: cached -> live
        # The live discovery is what the store keeps now.
        saved = store.load(IDENTITY.fingerprint)
        assert saved is not None
        assert [t["name"] for t in saved.tools] == ["alpha", "beta"]
        assert not any("invalidated" in line for line in log.lines)
        nursery.cancel_scope.cancel()


async def test_a_request_waits_no_longer_than_the_entrys_start_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer(tools=[tool("alpha")])
    server.start_gate = trio.Event()  # never opens
    store = MemorySnapshotStore()
    store.save(_record(IDENTITY.fingerprint, "alpha"))
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, FakeNet(srv=server), store, Logs())
        handle = await pool.acquire(IDENTITY, SETTINGS, "s1", Listener())
        start = trio.current_time()
        error = await when_up(handle.entry)
        assert error is not None and "did not start within 4 s" in error, error
        assert trio.current_time() - start == pytest.approx(START_TIMEOUT_MS / 1000)
        nursery.cancel_scope.cancel()


async def test_a_changed_server_version_drops_the_stored_record(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    server = FakeServer(tools=[tool("new")])
    server.start_gate = gate
    store = MemorySnapshotStore()
    store.save(_record(IDENTITY.fingerprint, "old", version="1.0"))
    log = Logs()
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, FakeNet(srv=server), store, log)
        handle = await pool.acquire(IDENTITY, SETTINGS, "s1", Listener())
        await trio.testing.wait_all_tasks_blocked()
        server.current.server_info = {"name": "srv", "version": "2.0"}
        gate.set()
        assert await when_up(handle.entry) is None
        assert handle.entry.upstream is server.current
        await trio.testing.wait_all_tasks_blocked()
        assert [t["name"] for t in handle.entry.snapshot.tools] == ["new"]
        saved = store.load(IDENTITY.fingerprint)
        assert saved is not None and saved.server_version == "2.0"
        assert [t["name"] for t in saved.tools] == ["new"]
        assert any(
            "stored snapshot invalidated: the server's version changed ('1.0' -> '2.0')" in line
            for line in log.lines
        )
        nursery.cancel_scope.cancel()


async def test_without_a_stored_snapshot_the_first_start_is_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    server = FakeServer(tools=[tool("alpha")])
    server.start_gate = gate
    store = MemorySnapshotStore()
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, FakeNet(srv=server), store, Logs())
        handle = pool.lease(IDENTITY, SETTINGS, "s1", Listener())
        await trio.testing.wait_all_tasks_blocked()
        assert not handle.entry.ready.is_set()
        assert describe_snapshot(handle.entry.snapshot) == "none"
        gate.set()
        await handle.entry.ready.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert store.load(IDENTITY.fingerprint) is not None
        nursery.cancel_scope.cancel()


# -- the record ----------------------------------------------------------------------------------


def test_a_record_round_trips_the_snapshot_and_names_the_server() -> None:
    snap = Snapshot(
        generation=7,
        available=True,
        tools=(tool("a"),),
        prompts=({"name": "p"},),
        resources=({"uri": "x://1", "name": "one"},),
        resource_templates=({"uriTemplate": "x://{id}", "name": "t"},),
        instructions="use it",
        capabilities={"tools": {"listChanged": True}},
    )
    record = to_record(
        snap,
        fingerprint="fp",
        server_info={"name": "srv", "version": "3.1"},
        era="handshake",
        protocol_version="2025-06-18",
        saved_at=1.0,
    )
    back = from_record(msgspec.json.decode(msgspec.json.encode(record), type=StoredSnapshot), 2)
    assert back == msgspec.structs.replace(snap, generation=2, cached=True)
    assert invalidation(record, {"name": "srv", "version": "3.1"}) is None
    assert invalidation(record, {"name": "srv", "version": "3.2"}) is not None
    assert invalidation(record, {"name": "other", "version": "3.1"}) is not None
    assert invalidation(record, {"name": 5}) is not None  # hostile serverInfo: absent
    assert record.same_content(msgspec.structs.replace(record, saved_at=2.0))


def test_a_record_read_back_is_checked_as_a_listing_is() -> None:
    """A cache file is anyone-with-our-uid's: its unusable items are left out (said in the
    snapshot's notes) and its items lose mcpool's own `_meta` keys (DESIGN X9)."""
    spoof = {"mcpool/trust": True, "mcpool/server": "x", "anthropic/alwaysLoad": True, "v": 1}
    record = StoredSnapshot(
        fingerprint="fp",
        tools=({**tool("a"), "_meta": dict(spoof)}, {"description": "no name"}, {"name": 3}),
        prompts=({"name": "p", "_meta": dict(spoof)},),
        resources=({"uri": "x://1", "_meta": dict(spoof)}, {"name": "no uri"}),
        resource_templates=({"uriTemplate": "x://{id}", "_meta": dict(spoof)},),
    )
    data = msgspec.json.encode(record)
    back = from_record(msgspec.json.decode(data, type=StoredSnapshot), 2)
    assert [t["name"] for t in back.tools] == ["a"]
    assert [r["uri"] for r in back.resources] == ["x://1"]
    for item in (*back.tools, *back.prompts, *back.resources, *back.resource_templates):
        assert item["_meta"] == {"v": 1}, item
    assert back.notes == ("stored snapshot: 3 unusable item(s) left out",)


def test_eviction_drops_the_oldest_until_the_folder_fits_never_the_new_one() -> None:
    files = [("a", 1.0, 40), ("b", 2.0, 40), ("c", 3.0, 40), ("new", 0.5, 40)]
    assert eviction(files, limit=100, keep="new") == ["a", "b"]
    assert eviction(files, limit=200, keep="new") == []


# -- the daemon's file store ---------------------------------------------------------------------


async def test_the_file_store_writes_0600_and_bounds_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "snapshots"
    store = FileSnapshotStore(folder, Logs(), max_bytes=1500)
    for i in range(4):
        store.save(_record(f"fp{i}", *(f"tool{j}" for j in range(5))))
        await store.settled()
        path = folder / snapshot_file_name(f"fp{i}")
        os.utime(path, (1000.0 + i, 1000.0 + i))
    remaining = sorted(p.name for p in folder.glob("*.json"))
    assert snapshot_file_name("fp3") in remaining
    assert snapshot_file_name("fp0") not in remaining
    assert sum(p.stat().st_size for p in folder.glob("*.json")) <= 1500
    for p in folder.glob("*.json"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    loaded = store.load("fp3")
    assert loaded is not None and loaded.tools[0]["name"] == "tool0"


async def test_the_file_store_writes_in_order_the_newest_of_each_and_never_undoes_a_forget(
    tmp_path: Path,
) -> None:
    """Saves are handed to the store's writer thread and not awaited: saves of one fingerprint
    waiting together are one write of the newest, and a forget asked for after a save is done
    after it (the file is gone, not written back by the earlier save)."""
    store = FileSnapshotStore(tmp_path, Logs())
    for i in range(50):
        store.save(_record("fp", f"tool{i}"))
    store.save(_record("gone", "x"))
    store.forget("gone")
    store.forget("never")  # nothing to remove: not an error
    with trio.fail_after(5):
        await store.settled()
    loaded = store.load("fp")
    assert loaded is not None and [t["name"] for t in loaded.tools] == ["tool49"]
    assert not (tmp_path / snapshot_file_name("gone")).exists()
    store.save(_record("gone", "back"))  # a save after the forget is written
    with trio.fail_after(5):
        await store.settled()
    again = store.load("gone")
    assert again is not None and [t["name"] for t in again.tools] == ["back"]


async def test_a_snapshot_write_that_fails_is_a_warning_logged_on_the_loop_thread(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    said: list[tuple[str, str, int]] = []

    def log(level: str, message: str, **fields: Any) -> None:
        said.append((level, message, threading.get_ident()))

    store = FileSnapshotStore(blocker / "snapshots", log)
    store.save(_record("fp", "a"))
    with trio.fail_after(5):
        await store.settled()
        while not said:
            await trio.sleep(0.01)
    level, message, thread = said[0]
    assert level == "warning" and "not written" in message and "not-a-folder" in message
    assert thread == threading.get_ident()  # the loop's thread, not the writer's


async def test_loading_a_record_allocates_for_its_size_not_the_bound(tmp_path: Path) -> None:
    # A load per entry made used to allocate MAX_SNAPSHOT_FILE_BYTES to read a few KiB, which
    # grew the daemon's heap by kilobytes per session-scoped entry (glibc's mmap threshold).
    store = FileSnapshotStore(tmp_path, Logs())
    store.save(_record("fp", "one", "two"))
    await store.settled()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        loaded = store.load("fp")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded is not None and [t["name"] for t in loaded.tools] == ["one", "two"]
    assert peak - before < MAX_SNAPSHOT_FILE_BYTES // 8, peak - before


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "corrupt"),
        (b'{"format": 1, "fingerprint": "fp", "tools": "nope"}', "corrupt"),
        (json.dumps({"format": SNAPSHOT_FORMAT + 1, "fingerprint": "fp"}).encode(), "format"),
        (json.dumps({"format": SNAPSHOT_FORMAT, "fingerprint": "other"}).encode(), "another"),
        # Nested past the decoder's depth (the interpreter's recursion limit): RecursionError.
        (
            b'{"format": 1, "fingerprint": "fp", "tools": [{"name": "t", "x": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}]}",
            "nested too deeply",
        ),
        (b'{"format": 1, "fingerprint": "fp", "capabilities": [1]}', "corrupt"),
        (b'{"format": "1", "fingerprint": "fp"}', "corrupt"),
    ],
)
def test_a_bad_cache_file_is_ignored_with_a_log_line(
    tmp_path: Path, content: bytes, why: str
) -> None:
    log = Logs()
    store = FileSnapshotStore(tmp_path, log)
    (tmp_path / snapshot_file_name("fp")).write_bytes(content)
    assert store.load("fp") is None
    assert len(log.lines) == 1 and "ignored" in log.lines[0] and why in log.lines[0]


def test_an_unreadable_or_missing_cache_file_is_not_fatal(tmp_path: Path) -> None:
    log = Logs()
    store = FileSnapshotStore(tmp_path, log)
    assert store.load("missing") is None and log.lines == []
    (tmp_path / snapshot_file_name("fp")).mkdir()  # reading a folder fails
    assert store.load("fp") is None
    assert "unreadable" in log.lines[0]
    store.forget("fp")  # a folder is not unlinked; forgetting it is not fatal either


async def test_a_relisted_snapshot_is_written_with_the_lists_as_listed(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The lists whose pages are the snapshot's are written as the upstream's own bytes
    (`KnownItems.encoded`): the file still loads to exactly the snapshot's lists."""
    server = FakeServer([tool("a"), tool("b")])
    store = FileSnapshotStore(tmp_path / "snapshots", Logs())
    pool = make_pool(nursery, FakeNet(srv=server))
    pool._snapshots = store
    with trio.fail_after(5):
        handle = await pool.acquire(IDENTITY, SETTINGS, "s1", Listener())
    entry = handle.entry

    async def written(names: list[str]) -> StoredSnapshot:
        with trio.fail_after(5):
            while True:
                loaded = store.load(entry.identity.fingerprint)
                if loaded is not None and [t["name"] for t in loaded.tools] == names:
                    return loaded
                await trio.sleep(0.01)

    assert (await written(["a", "b"])).tools == entry.snapshot.tools
    server.tools = [tool("a"), tool("b", "changed"), tool("c")]
    server.upstreams[-1].list_changed()
    loaded = await written(["a", "b", "c"])
    assert loaded.tools == entry.snapshot.tools
    assert loaded.tools[1]["description"] == "changed"
    assert from_record(loaded, 0).tools == entry.snapshot.tools


_json_items = st.lists(
    st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=8), st.integers()), max_size=3),
    max_size=4,
)


@given(
    name=st.text(max_size=8),
    instructions=st.one_of(st.none(), st.text(max_size=8)),
    lists=st.dictionaries(
        st.sampled_from(["tools", "prompts", "resources", "resource_templates"]), _json_items
    ),
    cut=st.integers(0, 3),
)
def test_a_record_written_in_pieces_is_the_record_encoded_with_its_lists_joined(
    name: str, instructions: str | None, lists: dict[str, list[Any]], cut: int
) -> None:
    """`encode_record`'s pieces (the lists as views of their bytes, never copied on the loop)
    join to exactly the record encoded with each list as one Raw, whatever the strings hold
    (NULs included: the slot is a raw NUL, which an encoded string never holds)."""
    record = StoredSnapshot(
        fingerprint="fp\x00" + name, server_name=name, instructions=instructions
    )
    encoded = {}
    for field, items in lists.items():
        raw = msgspec.json.encode(items)
        # Pieces as a page's would be: views into a larger buffer, cut anywhere.
        data = b"xx" + raw + b"yy"
        view = memoryview(data)[2 : 2 + len(raw)]
        at = min(cut, len(raw))
        encoded[field] = (view[:at], view[at:])
    joined = b"".join(encode_record(record, encoded))
    whole = {f: msgspec.Raw(b"".join(p)) for f, p in encoded.items()}
    assert joined == msgspec.json.encode(msgspec.structs.replace(record, **whole))
    assert msgspec.json.decode(joined, type=StoredSnapshot) == msgspec.structs.replace(
        record, **{field: tuple(items) for field, items in lists.items()}
    )


async def test_a_server_never_up_in_time_is_remembered_slow_across_runs_until_seen_up(
    tmp_path: Path,
) -> None:
    """Issue 28: the file store keeps a slow mark per fingerprint (a file beside the records,
    outside the folder's bound), read by a new store (the next run) and dropped once up."""
    store = FileSnapshotStore(tmp_path, Logs())
    assert not store.slow("fp")
    store.mark_slow("fp", True)
    store.mark_slow("fp", True)  # said once
    with trio.fail_after(5):
        await store.settled()
    next_run = FileSnapshotStore(tmp_path, Logs())
    assert next_run.slow("fp") and not next_run.slow("other")
    next_run.mark_slow("fp", False)
    with trio.fail_after(5):
        await next_run.settled()
    assert not FileSnapshotStore(tmp_path, Logs()).slow("fp")
    assert list(tmp_path.iterdir()) == []


async def test_the_pool_marks_an_entry_never_up_in_time_and_clears_it_once_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    server = FakeServer(tools=[tool("alpha")])
    server.start_gate = gate
    store = MemorySnapshotStore()
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, FakeNet(srv=server), store, Logs())
        handle = pool.lease(IDENTITY, SETTINGS, "s1", Listener())
        entry = handle.entry
        assert not entry.known_slow
        pool.note_not_up(entry)  # a session's first list went on without it
        assert entry.known_slow and store.slow(IDENTITY.fingerprint)
        gate.set()
        with trio.fail_after(5):
            await entry.ready.wait()
        assert not entry.known_slow and not store.slow(IDENTITY.fingerprint)
        pool.note_not_up(entry)  # up now: nothing to remember
        assert not store.slow(IDENTITY.fingerprint)
        pool.release(handle)
        await pool.aclose()


async def test_a_new_entry_of_a_server_remembered_slow_starts_known_slow(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer(tools=[tool("alpha")])
    server.start_gate = trio.Event()
    store = MemorySnapshotStore()
    store.mark_slow(IDENTITY.fingerprint, True)
    async with trio.open_nursery() as nursery:
        pool = _pool(nursery, FakeNet(srv=server), store, Logs())
        handle = pool.lease(IDENTITY, SETTINGS, "s1", Listener())
        assert handle.entry.known_slow
        pool.release(handle)
        await pool.aclose()
