"""The bridge's start-up imports (issue 17): its JSON (daemon/_jsonlite.py) answers as `json`
does, its string paths (daemon/_paths.py) are the Path forms, and nothing heavy is imported."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpool.daemon import _jsonlite

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=30,
)


@given(values)
def test_dumps_is_json_dumps(value: Any) -> None:
    assert _jsonlite.dumps(value, separators=(",", ":")) == json.dumps(value, separators=(",", ":"))
    assert _jsonlite.dumps(value) == json.dumps(value)


@given(values, st.sampled_from(["", " ", "\n", " \t\r\n"]))
def test_loads_is_json_loads(value: Any, space: str) -> None:
    text = space + json.dumps(value) + space
    assert _jsonlite.loads(text) == json.loads(text)
    assert _jsonlite.loads(text.encode()) == json.loads(text.encode())


def test_constants_and_floats() -> None:
    assert math.isnan(_jsonlite.loads("NaN"))  # type: ignore[arg-type]
    assert _jsonlite.loads("[Infinity, -Infinity, 1e400]") == json.loads(
        "[Infinity, -Infinity, 1e400]"
    )
    assert _jsonlite.dumps([float("inf"), 1.5, -0.0]) == json.dumps([float("inf"), 1.5, -0.0])


@pytest.mark.parametrize(
    "text", ["", "  ", "{", "[1,]", "1 2", '{"a":1}x', "\ufeff{}", '"\x01"', "nan", b"\xff"]
)
def test_what_json_refuses_is_a_value_error(text: str | bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (json's own errors vary by the text)
        json.loads(text)
    with pytest.raises(ValueError):  # noqa: PT011
        _jsonlite.loads(text)


def test_what_json_cannot_encode_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        _jsonlite.dumps({"a": object()})


# What the bridge must not import at start-up (issue 17): each is milliseconds of every client
# launch. The subprocess forgets them first (the venv's editable-install hook loads some at
# interpreter start), then imports the bridge and sees which came back.
HEAVY = (
    *("json", "pathlib", "contextlib", "re", "fnmatch", "urllib", "typing"),
    # `signal` builds enum classes (with `enum`, about 8 ms); the others are not needed by a
    # hand-off to the shell waiter.
    *("enum", "signal", "select", "fcntl", "__future__"),
)


def test_the_bridge_imports_no_heavy_stdlib_module() -> None:
    code = (
        "import sys\n"
        f"heavy = {HEAVY!r}\n"
        "for m in [m for m in sys.modules if m.split('.')[0] in heavy]: del sys.modules[m]\n"
        "import mcpool.daemon._cli, mcpool.daemon._attach\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_mcpool_command_imports_no_heavy_stdlib_module() -> None:
    # bin/mcpool is what clients launch (an installer's console script would import `re`).
    script = Path(__file__).resolve().parents[2] / "bin" / "mcpool"
    code = (
        "import sys\n"
        f"heavy = {HEAVY!r}\n"
        "for m in [m for m in sys.modules if m.split('.')[0] in heavy]: del sys.modules[m]\n"
        f"sys.argv = [{str(script)!r}, 'attach', '--help']\n"
        f"source = open({str(script)!r}).read()\n"
        "try:\n"
        "    exec(compile(source, sys.argv[0], 'exec'), {'__name__': '__main__'})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("usage: mcpool attach")
    assert out.stdout.splitlines()[-1] == ""


def test_the_string_paths_are_the_path_forms(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcpool.daemon import _paths

    for env in ({}, {"XDG_RUNTIME_DIR": str(tmp_path) + "//run/./"}, {"MCPOOL_SOCKET": "rel/s"}):
        for key in ("XDG_RUNTIME_DIR", "MCPOOL_SOCKET", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert str(_paths.socket_path()) == _paths.socket_path_str()
        assert str(_paths.socket_path("x/../y")) == _paths.socket_path_str("x/../y")
        assert str(_paths.config_path()) == _paths.config_path_str()
        assert str(_paths.state_dir()) == _paths.state_dir_str()
        sock = _paths.socket_path()
        assert str(_paths.daemon_log_path(sock)) == _paths.daemon_log_path_str(sock)


parts = st.text(alphabet="/.ab", max_size=8)


@given(st.lists(parts, max_size=4))
def test_join_and_parent_are_purepath_s(values: list[str]) -> None:
    from pathlib import Path, PurePosixPath

    from mcpool.daemon._paths import _join, _parent

    assert _join(*values) == str(PurePosixPath(*values))
    assert _parent(_join(*values)) == str(Path(*values).parent)
