"""The admin API's boundary (daemon/_admin.py): every command's params typed, a bad value an
invalid-params error naming its field. Pure: no daemon, no socket."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpool.daemon import _admin, _ctl
from mcpool.protocol import INVALID_PARAMS, InvalidParams, MethodNotFound


def decode(command: str, params: Any) -> Any:
    return _admin.decode_params(_admin.COMMANDS[command], msgspec.Raw(msgspec.json.encode(params)))


def test_good_params_decode_with_their_defaults() -> None:
    assert decode("logs", {}) == _admin.LogsParams(name=None, lines=_admin.LOG_LINES_DEFAULT)
    assert decode("logs", {"name": "fs", "lines": 0}) == _admin.LogsParams("fs", 0)
    assert decode("status", {"collect": True}).collect is True
    assert decode("tools", {"session": "s", "server": None}) == _admin.ToolsParams("s", None)
    assert decode("servers", {"anything": ["newer", "daemonctl"]}) == _admin.NoParams()
    absent = _admin.decode_params(_admin.COMMANDS["status"], msgspec.UNSET)
    assert absent == _admin.StatusParams()


@pytest.mark.parametrize(
    ("command", "params", "field"),
    [
        ("logs", {"lines": "x"}, "lines"),
        ("logs", {"lines": -1}, "lines"),
        ("logs", {"lines": _admin.LOG_LINES_MAX + 1}, "lines"),
        ("logs", {"lines": True}, "lines"),
        ("logs", {"name": 3}, "name"),
        ("status", {"collect": 1}, "collect"),
        ("restart", {}, "name"),
        ("restart", {"name": ""}, "name"),
        ("explain", {"session": "s"}, "name"),
        ("setServer", {"session": "s", "name": "n", "entry": "x"}, "entry"),
        ("set-server", {"session": [], "name": "n", "entry": {}}, "session"),
    ],
)
def test_a_bad_value_names_its_field(command: str, params: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as caught:
        decode(command, params)
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data["field"] == field
    assert caught.value.reason.startswith(f"{field}: ")


@pytest.mark.parametrize("params", [[1], "x", None, 5])
def test_params_that_are_not_an_object_are_invalid_params(params: Any) -> None:
    with pytest.raises(InvalidParams, match="params: Expected `object`"):
        decode("status", params)


@given(
    st.sampled_from(sorted(_admin.COMMANDS)),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    ),
)
def test_any_json_decodes_or_is_invalid_params(command: str, params: Any) -> None:
    with contextlib.suppress(InvalidParams):  # anything else (a crash) fails the test
        decode(command, params)


def test_lookup_knows_only_admin_commands() -> None:
    assert _admin.lookup("mcpool/admin/status", _admin.COMMANDS).handler == "status"
    assert _admin.lookup("mcpool/admin/set-server", _admin.COMMANDS).handler == "setServer"
    for method in ("mcpool/admin/testCrash", "mcpool/admin/__init__", "status", "mcpool/attach"):
        with pytest.raises(MethodNotFound):
            _admin.lookup(method, _admin.COMMANDS)
    hooks = {**_admin.COMMANDS, **_admin.TEST_COMMANDS}
    assert _admin.lookup("mcpool/admin/testCrash", hooks).handler == "testCrash"


def test_daemonctl_asks_for_no_more_lines_than_the_daemon_answers() -> None:
    assert _ctl.MAX_LOG_LINES == _admin.LOG_LINES_MAX
