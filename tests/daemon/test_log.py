"""JsonLinesLog: JSON lines, level filtering, size-based rotation, never raising."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mcpool.daemon._log import JsonLinesLog, normalize_level


def test_records_are_json_lines_with_fields(tmp_path: Path) -> None:
    log = JsonLinesLog(tmp_path / "state" / "daemon.log")
    line = log.record("info", "session attached", session="s-1", peer=42)
    log.close()
    assert line is not None
    (written,) = (tmp_path / "state" / "daemon.log").read_text().splitlines()
    assert written == line
    record = json.loads(written)
    assert record["level"] == "info"
    assert record["msg"] == "session attached"
    assert (record["session"], record["peer"]) == ("s-1", 42)
    assert isinstance(record["ts"], float)


def test_level_filters_below_threshold(tmp_path: Path) -> None:
    log = JsonLinesLog(tmp_path / "daemon.log", level="warning")
    assert log.record("info", "quiet") is None
    assert log.record("debug", "quieter") is None
    assert log.record("error", "loud") is not None
    log.set_level("debug")
    assert log.record("debug", "now shown") is not None
    log.close()
    messages = [json.loads(x)["msg"] for x in (tmp_path / "daemon.log").read_text().splitlines()]
    assert messages == ["loud", "now shown"]


def test_enabled_follows_the_level_set_later_aliases_too_and_keeps_unknown_levels() -> None:
    """`enabled`, bound once (sessions keep it), answers for the level set after: the table it
    looks up is changed in place. A level a caller made up is kept as an error is."""
    log = JsonLinesLog(None, level="warning")
    enabled = log.enabled
    assert [enabled(x) for x in ("debug", "info", "warning", "warn", "error", "err")] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    assert enabled("made-up")
    log.set_level("debug")
    assert enabled("debug") and enabled("info")
    log.set_level("error")
    assert not enabled("warn") and enabled("err") and enabled("made-up")


def test_levels_are_normalized_and_unknown_ones_rejected() -> None:
    assert normalize_level("WARN") == "warning"
    assert normalize_level(" Debug ") == "debug"
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        normalize_level("loud")


def test_rotation_keeps_the_newest_backups(tmp_path: Path) -> None:
    path = tmp_path / "daemon.log"
    log = JsonLinesLog(path, max_bytes=400, backups=2)
    for n in range(40):
        log.record("info", f"message {n:02d}", pad="x" * 20)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 400
    newest = [json.loads(x)["msg"] for x in path.read_text().splitlines()]
    older = [json.loads(x)["msg"] for x in (tmp_path / "daemon.log.1").read_text().splitlines()]
    assert newest[-1] == "message 39"
    assert older[-1] < newest[0]  # .1 holds what came just before the current file


def test_reopens_an_existing_file_and_counts_its_size(tmp_path: Path) -> None:
    path = tmp_path / "daemon.log"
    path.write_text("x" * 390 + "\n")
    log = JsonLinesLog(path, max_bytes=400, backups=1)
    log.record("info", "after a restart")
    log.close()
    assert (tmp_path / "daemon.log.1").read_text() == "x" * 390 + "\n"
    assert json.loads(path.read_text())["msg"] == "after a restart"


def test_an_unwritable_log_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = JsonLinesLog(blocker / "daemon.log")  # its folder is a file
    assert log.record("error", "still returned") is not None
    memory_only = JsonLinesLog(None)
    assert memory_only.record("info", "no file") is not None


def test_the_log_and_its_rotations_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state" / "daemon.log"
    old = os.umask(0)
    try:
        log = JsonLinesLog(path, max_bytes=300, backups=2)
        for n in range(20):
            log.record("info", f"message {n:02d}", pad="x" * 20)
        log.close()
    finally:
        os.umask(old)
    files = sorted(tmp_path.joinpath("state").iterdir())
    assert [p.name for p in files] == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_an_existing_readable_log_is_made_private_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "daemon.log"
    path.write_text("")
    path.chmod(0o644)
    log = JsonLinesLog(path)
    log.record("info", "first")
    log.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
