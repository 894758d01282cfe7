"""Reading a settings file: empty, cut-short, invalid and missing files, without a daemon."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpool.daemon._settings import (
    MAX_SETTINGS_BYTES,
    LoadedFile,
    parse_settings,
    read_settings_file,
)
from mcpool.protocol import SettingsError

GOOD = {"mcpServers": {"a": {"command": "x"}, "b": {"command": "y", "args": ["1"]}}}


def _good(tmp_path: Path) -> tuple[Path, LoadedFile]:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(GOOD))
    loaded = read_settings_file(str(path), now=1.0, previous=None)
    assert (loaded.status, set(loaded.servers), loaded.applied_at) == ("ok", {"a", "b"}, 1.0)
    return path, loaded


def test_an_empty_file_is_an_error_that_keeps_the_previous_generation(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    for empty in (b"", b"  \n\t\n"):
        path.write_bytes(empty)
        loaded = read_settings_file(str(path), now=2.0, previous=good)
        assert loaded.status == "error"
        assert loaded.servers == good.servers
        assert loaded.applied_at == 1.0  # what is in force, and since when
        assert loaded.error is not None and "empty" in loaded.error and str(path) in loaded.error
        assert loaded.error_at == {"path": str(path), "line": 1, "column": 1}
        assert loaded.signature is not None  # read: an attach does not read it again


def test_an_empty_file_at_start_is_an_error_with_no_servers(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"")
    loaded = read_settings_file(str(path), now=1.0, previous=None)
    assert (loaded.status, loaded.servers, loaded.applied_at) == ("error", {}, None)


def test_an_empty_object_is_a_valid_file_with_no_servers(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.write_text("{}")
    loaded = read_settings_file(str(path), now=2.0, previous=good)
    assert (loaded.status, loaded.servers, loaded.error) == ("ok", {}, None)


def test_a_file_cut_short_mid_write_names_line_and_column(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    text = json.dumps(GOOD, indent=2)
    for cut in (1, len(text) // 2, len(text) - 1):
        path.write_text(text[:cut])
        loaded = read_settings_file(str(path), now=2.0, previous=good)
        assert loaded.status == "error", cut
        assert loaded.servers == good.servers
        assert loaded.error_at is not None and loaded.error_at["line"] >= 1, loaded.error_at
        assert "column" in loaded.error_at
        assert f"{path}:{loaded.error_at['line']}:" in (loaded.error or "")


def test_an_invalid_field_names_server_and_field(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "args": "no"}}}))
    loaded = read_settings_file(str(path), now=2.0, previous=good)
    assert loaded.status == "error"
    assert loaded.error_at == {"path": str(path), "server": "a", "field": "args"}
    assert loaded.servers == good.servers


def test_errors_in_a_row_keep_the_last_good_generation(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.write_text("{")
    first = read_settings_file(str(path), now=2.0, previous=good)
    path.write_text("")
    second = read_settings_file(str(path), now=3.0, previous=first)
    assert (second.status, second.servers, second.applied_at) == ("error", good.servers, 1.0)


def test_a_deleted_file_is_missing_and_has_no_servers(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.unlink()
    loaded = read_settings_file(str(path), now=2.0, previous=good)
    assert (loaded.status, loaded.servers, loaded.error) == ("missing", {}, None)
    # A file that comes back empty after being missing has nothing to keep.
    path.write_text("")
    again = read_settings_file(str(path), now=3.0, previous=loaded)
    assert (again.status, again.servers) == ("error", {})


def test_a_fifo_or_a_folder_is_an_error_not_a_hang(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.unlink()
    os.mkfifo(path)  # opening it blocking would wait for a writer forever
    loaded = read_settings_file(str(path), now=2.0, previous=good)
    assert loaded.status == "error" and "regular file" in (loaded.error or "")
    assert loaded.servers == good.servers
    folder = tmp_path / "dir.json"
    folder.mkdir()
    assert read_settings_file(str(folder), now=2.0, previous=None).status == "error"


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    path, good = _good(tmp_path)
    path.write_bytes(b" " * (MAX_SETTINGS_BYTES + 1) + b"{}")
    loaded = read_settings_file(str(path), now=2.0, previous=good)
    assert loaded.status == "error" and "larger than" in (loaded.error or "")


def test_reading_a_small_file_allocates_for_its_size_not_the_bound(tmp_path: Path) -> None:
    # Each read of a settings file used to allocate MAX_SETTINGS_BYTES twice (the read and the
    # one that finds the end): glibc then grew the daemon's heap by kilobytes per file read.
    path, _ = _good(tmp_path)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        loaded = read_settings_file(str(path), now=2.0, previous=None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded.status == "ok"
    assert peak - before < MAX_SETTINGS_BYTES // 8, peak - before


def test_a_nul_byte_in_a_path_is_an_error(tmp_path: Path) -> None:
    loaded = read_settings_file(str(tmp_path / "a\0b.json"), now=1.0, previous=None)
    assert loaded.status == "error"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_field_names = st.sampled_from(
    ["command", "args", "env", "cwd", "url", "httpUrl", "headers", "type", "timeout", "trust"]
)
_entries = st.dictionaries(_field_names, _json, max_size=5) | _json


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        _json.map(lambda v: msgspec.json.encode(v)),
        st.dictionaries(st.text(max_size=5), _entries, max_size=3).map(
            lambda s: msgspec.json.encode({"mcpServers": s})
        ),
        _json.map(lambda v: msgspec.json.encode({"daemon": v})),
    )
)
def test_any_bytes_either_parse_or_raise_a_settings_error(data: bytes) -> None:
    error: SettingsError | None = None
    try:
        parse_settings(data, "/x/s.json")
    except SettingsError as exc:
        error = exc
    assert error is None or error.path == "/x/s.json"


def test_deep_nesting_is_a_settings_error() -> None:
    nested = b"[" * 100_000
    for data in (nested, b'{"a":' * 100_000, b'{"mcpServers": {"a": {"args": ' + nested):
        with pytest.raises(SettingsError, match=r"deep|JSON"):
            parse_settings(data, "/x/s.json")
