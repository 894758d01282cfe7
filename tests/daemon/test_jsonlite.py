"""The bridge's JSON (daemon/_jsonlite.py) answers as `json` does, bytes for bytes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
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


def test_the_bridge_does_not_import_json() -> None:
    code = (
        "import sys; before = set(sys.modules); import mcpool.daemon._attach; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.replace("'", '"')))
    assert "json" not in loaded
    assert "json.decoder" not in loaded
