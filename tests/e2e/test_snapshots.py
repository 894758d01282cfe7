"""Discovery snapshots persist (issue 14, point 2): a cold daemon serves what it knew.

A slow server's tools are listed from the snapshot the previous daemon kept, before the server
is up; a call to one waits for it; a changed server version invalidates the snapshot; a
corrupt cache file is ignored with a log line.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpool.daemon._snapshots import snapshot_file_name

from .harness import DaemonFactory, DaemonProcess, fake_server, run_daemonctl
from .support import raw_attach, raw_call, raw_text, servers_of, wait_until

# The slow server's handshake delay: long enough that "listed before it is up" is not a race
# with a loaded machine, short enough for a test.
SLOW_START = 4.0
# The call that waits for the slow server: its start delay plus a spawn on a busy machine.
CALL_TIMEOUT = SLOW_START + 20.0
STEP_TIMEOUT = 30.0


def _cache_dir(daemon: DaemonProcess) -> Path:
    return Path(daemon.env["XDG_CACHE_HOME"]) / "mcpool" / "snapshots"


async def _first_run(daemon: DaemonProcess, settings: Path) -> None:
    """A session that sees the server live (its discovery is saved), then the daemon stops."""
    async with daemon.raw() as client:
        client.receive_timeout = STEP_TIMEOUT
        await raw_attach(client, [str(settings)], "first")
        listed = await client.request("tools/list")
        assert any(t["name"] == "slow__echo" for t in listed["result"]["tools"]), listed
    folder = _cache_dir(daemon)

    def saved() -> bool:
        return folder.is_dir() and any(folder.glob("*.json"))

    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(saved)
    assert await daemon.stop() == 0


def _entry(servers: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (entry,) = [s for s in servers if s.get("name") == name]
    return entry


async def test_a_cold_daemon_lists_a_slow_server_from_its_snapshot_and_a_call_waits_for_it(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file(
        "settings.json", {"slow": fake_server(FAKE_STARTUP_DELAY=SLOW_START)}
    )
    await _first_run(daemon, settings)
    (record_path,) = _cache_dir(daemon).glob("*.json")
    assert stat.S_IMODE(record_path.stat().st_mode) == 0o600
    record = json.loads(record_path.read_bytes())
    assert record["serverName"] == "fake-upstream"
    assert record["serverVersion"] == "1.0"

    await daemon.start()
    async with daemon.raw() as client:
        client.receive_timeout = STEP_TIMEOUT
        await raw_attach(client, [str(settings)], "second")
        listed = await client.request("tools/list")
        # Listed while the server is still in its start-up delay: from the snapshot.
        (entry,) = await servers_of(daemon)
        assert entry["snapshot"] == "cached", entry
        assert entry["state"] == "spawning", entry
        assert entry["pid"] is None or entry["uptime"] is None, entry
        names = {t["name"] for t in listed["result"]["tools"]}
        assert {"slow__echo", "slow__pid"} <= names, names

        client.receive_timeout = CALL_TIMEOUT
        answer = await raw_call(client, "slow__echo", {"text": "hello"})
        assert raw_text(answer) == "hello"
        (entry,) = await servers_of(daemon)
        assert entry["snapshot"] == "live", entry
        assert entry["state"] == "active", entry
    table = await _servers_table(daemon)
    assert "SNAPSHOT" in table and "live" in table, table


async def _servers_table(daemon: DaemonProcess) -> str:
    done = await run_daemonctl(daemon.sock, "servers", env=daemon.env)
    return done.stdout.decode()


async def test_a_changed_server_version_invalidates_the_snapshot(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    version_file = tmp_path / "version"
    version_file.write_text("1.0\nold_tool\n")
    daemon = await daemon_factory()
    settings = daemon.settings_file(
        "settings.json", {"slow": fake_server(FAKE_VERSION_FILE=version_file)}
    )
    await _first_run(daemon, settings)
    # The server is "upgraded" in place: same command, same environment, same fingerprint.
    version_file.write_text("2.0\nnew_tool\n")
    await daemon.start()
    async with daemon.raw() as client:
        client.receive_timeout = STEP_TIMEOUT
        await raw_attach(client, [str(settings)], "second")

        async def live_and_new() -> bool:
            entry = _entry(await servers_of(daemon), "slow")
            if entry.get("snapshot") != "live":
                return False
            listed = await client.request("tools/list")
            return "slow__new_tool" in {t["name"] for t in listed["result"]["tools"]}

        with trio.fail_after(STEP_TIMEOUT):
            await wait_until(live_and_new)
        listed = await client.request("tools/list")
        assert "slow__old_tool" not in {t["name"] for t in listed["result"]["tools"]}
    (record_path,) = _cache_dir(daemon).glob("*.json")

    def rewritten() -> bool:
        record = json.loads(record_path.read_bytes())
        return bool(record.get("serverVersion") == "2.0")

    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(rewritten)
    record = json.loads(record_path.read_bytes())
    assert "new_tool" in {t["name"] for t in record["tools"]}
    assert "old_tool" not in {t["name"] for t in record["tools"]}
    log = daemon.log_path.read_text()
    assert "stored snapshot invalidated: the server's version changed ('1.0' -> '2.0')" in log


# Not JSON; and one nested deeper than the decoder goes (issue 26: a RecursionError reached
# the session that acquired the server, as an internal error).
CORRUPT = {
    "undecodable": b'{"format": 1, "fingerprint": ' + b"\xff" * 10,
    "nested": b'{"format": 1, "fingerprint": "F", "tools": [{"name": "deep", "x": '
    + b"[" * 50_000
    + b"]" * 50_000
    + b"}]}",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
async def test_a_corrupt_cache_file_is_ignored_with_a_log_line(
    daemon_factory: DaemonFactory, kind: str
) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    async with daemon.raw() as client:
        client.receive_timeout = STEP_TIMEOUT
        await raw_attach(client, [str(settings)], "first")
        (entry,) = await servers_of(daemon)
        fingerprint = entry["fingerprint"]
    assert await daemon.stop() == 0
    folder = _cache_dir(daemon)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / snapshot_file_name(fingerprint)
    path.write_bytes(CORRUPT[kind].replace(b'"F"', json.dumps(fingerprint).encode()))
    await daemon.start()
    async with daemon.raw() as client:
        client.receive_timeout = STEP_TIMEOUT
        await raw_attach(client, [str(settings)], "second")
        answer = await raw_call(client, "fake__echo", {"text": "still works"})
        assert raw_text(answer) == "still works"
        listed = await client.request("tools/list")
        assert "fake__echo" in [t["name"] for t in listed["result"]["tools"]], listed
    log = daemon.log_path.read_text()
    assert f"snapshot cache file {path} ignored: corrupt" in log
    assert "internal error" not in log

    def replaced() -> bool:
        try:
            return bool(json.loads(path.read_bytes())["fingerprint"] == fingerprint)
        except (ValueError, RecursionError):  # (not replaced yet: the corrupt one)
            return False

    with trio.fail_after(STEP_TIMEOUT):
        await wait_until(replaced)
