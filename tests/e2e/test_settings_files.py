"""Issue 12, items 5-7 end to end: settings files that are empty, cut short, deleted, in a folder
that is deleted and re-created, or symlinked; and the daemon log's mode.

Real daemon, real `mcpool attach` bridges, the real SDK client, the stdlib fake upstream; files
written the way editors and shells write them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import trio

from e2e.harness import DaemonProcess, fake_server, run_daemonctl, write_settings
from e2e.support import wait_until

WAIT = 20.0  # every wait below is bounded by this


async def names(session: Any) -> set[str]:
    return {t.name for t in (await session.list_tools()).tools}


async def pid_of(session: Any) -> int:
    return int((await session.call_tool("fake__pid", {})).structured_content["pid"])


async def file_status(d: DaemonProcess, path: Path) -> dict[str, Any]:
    status = await d.ctl("status")
    for f in status["config"]:
        if f["path"] == str(path):
            return f
    raise AssertionError(f"{path} not in status: {status['config']}")


async def wait_status(d: DaemonProcess, path: Path, status: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def reached() -> bool:
        found.update(await file_status(d, path))
        return found["status"] == status

    with trio.fail_after(WAIT):
        await wait_until(reached)
    return found


async def wait_tools(session: Any, expected: set[str]) -> None:
    async def reached() -> bool:
        return await names(session) == expected

    with trio.fail_after(WAIT):
        await wait_until(reached)


def in_place_write(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as f:  # truncates, then writes
        f.write(json.dumps(data))


def atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def log_records(d: DaemonProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.log_path.read_text().splitlines() if line.strip()]


async def test_an_empty_file_keeps_the_sessions_tools_until_a_good_write(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "empty") as session:
        before = await names(session)
        pid = await pid_of(session)
        settings.write_bytes(b"")  # what `cat s.json > s.json` leaves behind
        item = await wait_status(d, settings, "error")
        # The error names the file, the line and the column, and says what is kept.
        assert f"{settings}:1:1" in item["error"] and "empty" in item["error"], item
        assert item["error_at"] == {"path": str(settings), "line": 1, "column": 1}
        assert item["servers"] == 1 and item["applied_at"] is not None, item
        # No session lost anything: same tools, same process.
        assert await names(session) == before
        assert await pid_of(session) == pid
        logged = [r for r in log_records(d) if "not applied" in r["msg"]]
        assert logged and logged[-1]["path"] == str(settings) and logged[-1]["line"] == 1
        assert "stay in force" in logged[-1]["msg"]
        # The status table shows it too.
        table = await _ctl_text(d, "status")
        assert "error" in table and "previous servers kept" in table
        # A good write applies.
        in_place_write(settings, {"mcpServers": {"other": {**entry, "trust": True}}})
        item = await wait_status(d, settings, "ok")
        assert item["error"] is None and item["servers"] == 1
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "other__echo"))
        assert "fake__echo" not in await names(session)


async def _ctl_text(d: DaemonProcess, *args: str) -> str:
    done = await run_daemonctl(d.sock, *args, env={**d.env, "COLUMNS": "400"})
    return done.stdout.decode()


async def _has(session: Any, name: str) -> bool:
    return name in await names(session)


async def test_a_file_cut_short_mid_write_keeps_the_previous_generation(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "partial") as session:
        before = await names(session)
        pid = await pid_of(session)
        full = json.dumps({"mcpServers": {"fake": entry, "more": entry}}, indent=2)
        cut = full[: len(full) // 2]
        settings.write_text(cut)
        item = await wait_status(d, settings, "error")
        line = cut.count("\n") + 1
        assert item["error_at"]["line"] == line, item
        assert f"{settings}:{line}:" in item["error"], item
        assert await names(session) == before
        assert await pid_of(session) == pid


async def test_a_deleted_file_is_missing_and_its_servers_are_gone(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    settings = write_settings(d.root / "s.json", {"fake": entry})
    async with d.attach([settings], "deleted") as session:
        assert "fake__echo" in await names(session)
        settings.unlink()
        item = await wait_status(d, settings, "missing")
        assert item["servers"] == 0 and item["error"] is None, item
        await wait_tools(session, set())
        # Back again: applied again.
        atomic_write(settings, {"mcpServers": {"fake": entry}})
        await wait_status(d, settings, "ok")
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "fake__echo"))


async def test_an_empty_config_at_start_is_an_error_with_no_servers(daemon_factory):
    d = await daemon_factory(start=False)
    d.config_path.write_bytes(b"")
    await d.start()
    item = await file_status(d, d.config_path)
    assert item["status"] == "error" and item["servers"] == 0, item
    assert item["applied_at"] is None and "empty" in item["error"], item
    async with d.attach([d.config_path], "cold") as session:
        assert await names(session) == set()
        d.write_config({"fake": fake_server()})
        await wait_status(d, d.config_path, "ok")
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "fake__echo"))


async def test_a_write_applies_after_the_settings_folder_is_deleted_and_recreated(
    daemon_factory,
):
    d = await daemon_factory()
    entry = fake_server()
    project = d.root / "project"
    settings = write_settings(project / ".mcp.json", {"fake": entry})
    async with d.attach([settings], "folder") as session:
        assert "fake__echo" in await names(session)
        shutil.rmtree(project)
        await wait_status(d, settings, "missing")
        await wait_tools(session, set())
        project.mkdir()
        atomic_write(settings, {"mcpServers": {"fake": entry}})
        await wait_status(d, settings, "ok")
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "fake__echo"))
        # And later writes into the new folder are still seen (the watch follows it).
        for excluded in ("echo", "sleep"):
            in_place_write(
                settings, {"mcpServers": {"fake": {**entry, "excludeTools": [excluded]}}}
            )
            with trio.fail_after(WAIT):
                await wait_until(lambda e=excluded: _lacks(session, f"fake__{e}"))
        # Deleted and re-created at once, same name: the old watch died with the old folder.
        shutil.rmtree(project)
        project.mkdir()
        in_place_write(settings, {"mcpServers": {"renamed": entry}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "renamed__echo"))


async def _lacks(session: Any, name: str) -> bool:
    return name not in await names(session)


async def test_a_symlinked_settings_file_follows_target_edits_and_link_swaps(daemon_factory):
    d = await daemon_factory()
    entry = fake_server()
    first = write_settings(d.root / "dotfiles" / "mcp.json", {"fake": entry})
    link = d.root / "project" / ".mcp.json"
    link.parent.mkdir()
    link.symlink_to(first)
    async with d.attach([link], "linked") as session:
        assert "fake__echo" in await names(session)
        # The target edited in place, in a folder nobody named.
        in_place_write(first, {"mcpServers": {"fake": {**entry, "excludeTools": ["echo"]}}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _lacks(session, "fake__echo"))
        # The target replaced atomically in its own folder (a dotfiles manager's write).
        atomic_write(first, {"mcpServers": {"fake": {**entry, "excludeTools": ["sleep"]}}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "fake__echo"))
        assert "fake__sleep" not in await names(session)
        # The link re-pointed at a file in a third folder, as `ln -sfn` does.
        second = write_settings(d.root / "other" / "b.json", {"second": entry})
        new_link = link.with_name(".mcp.json.new")
        new_link.symlink_to(second)
        os.replace(new_link, link)
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "second__echo"))
        assert "fake__pid" not in await names(session)
        # ...and that new target's edits are seen too.
        in_place_write(second, {"mcpServers": {"third": entry}})
        with trio.fail_after(WAIT):
            await wait_until(lambda: _has(session, "third__echo"))
        assert (await file_status(d, link))["status"] == "ok"


async def test_the_daemon_log_is_0600(daemon_factory):
    old = os.umask(0)  # the daemon inherits it: a umask-dependent create would make 0666
    try:
        d = await daemon_factory()
    finally:
        os.umask(old)
    await d.ctl("status")
    assert stat.S_IMODE(d.log_path.stat().st_mode) == 0o600
