"""daemon/_desired.py: what a session desires from its files, overrides and environment, as a
table of inputs and the desired and skipped servers they give (pure: no files, no log)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec
import pytest

from mcpool.daemon._desired import RUNTIME_SOURCE, desired
from mcpool.pool import ServerSettings

CONFIG = "/home/u/.config/mcpool/config.json"
PROJECT = "/work/p/.mcp.json"


def is_folder(path: str) -> bool:
    """The disk as the table sees it: every folder exists but one named `nowhere`."""
    return not path.endswith("/nowhere")


def entry(**fields: Any) -> ServerSettings:
    return msgspec.convert(fields, ServerSettings)


class Case(NamedTuple):
    layers: list[tuple[str, Mapping[str, ServerSettings]]]
    overrides: dict[str, tuple[ServerSettings, str]]
    env: dict[str, str]
    pooling: bool
    # name -> (source, command, scope) of each desired server, in order
    want: dict[str, tuple[str, str | None, str]]
    # name -> the start of why it was skipped
    skipped: dict[str, str]
    loops: frozenset[str] = frozenset()


CASES = {
    "one file": Case(
        [(CONFIG, {"a": entry(command="srv-a")})],
        {},
        {},
        True,
        {"a": (CONFIG, "srv-a", "shared")},
        {},
    ),
    "a later file overrides an earlier one and moves it last": Case(
        [
            (CONFIG, {"a": entry(command="old"), "b": entry(command="b")}),
            (PROJECT, {"a": entry(command="new")}),
        ],
        {},
        {},
        True,
        {"b": (CONFIG, "b", "shared"), "a": (PROJECT, "new", "shared")},
        {},
    ),
    "a runtime override wins over every file": Case(
        [(CONFIG, {"a": entry(command="file")})],
        {"a": (entry(command="runtime"), RUNTIME_SOURCE)},
        {},
        True,
        {"a": (RUNTIME_SOURCE, "runtime", "shared")},
        {},
    ),
    "a disabled entry is neither desired nor skipped": Case(
        [(CONFIG, {"a": entry(command="a", disabled=True)})],
        {},
        {},
        True,
        {},
        {},
    ),
    "variables expand from the session's environment": Case(
        [(PROJECT, {"a": entry(command="${TOOL}")})],
        {},
        {"TOOL": "expanded"},
        True,
        {"a": (PROJECT, "expanded", "shared")},
        {},
    ),
    "an unset variable skips the entry": Case(
        [(PROJECT, {"a": entry(command="${MISSING}"), "b": entry(command="b")})],
        {},
        {},
        True,
        {"b": (PROJECT, "b", "shared")},
        {"a": "server 'a'"},
    ),
    "a self-launch is skipped and marked as a loop": Case(
        [(PROJECT, {"me": entry(command="mcpool", args=["attach"])})],
        {},
        {},
        True,
        {},
        {"me": "server 'me'"},
        frozenset({"me"}),
    ),
    "a cwd that is no folder skips the entry": Case(
        [(PROJECT, {"a": entry(command="a", cwd="nowhere"), "b": entry(command="b", cwd="sub")})],
        {},
        {},
        True,
        {"b": (PROJECT, "b", "shared")},
        {"a": "server 'a'"},
    ),
    "without pooling every server is the session's own": Case(
        [(CONFIG, {"a": entry(command="a")})],
        {},
        {},
        False,
        {"a": (CONFIG, "a", "session")},
        {},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_desired(case: Case) -> None:
    out = desired(
        case.layers,
        case.overrides,
        env=case.env,
        from_session=True,
        pooling=case.pooling,
        config_path=CONFIG,
        cwd="/work/p",
        is_folder=is_folder,
    )
    got = {
        name: (d.source, d.settings.command, d.settings.scope) for name, d in out.desired.items()
    }
    assert list(got.items()) == list(case.want.items())
    assert {name: source for name, (source, _) in out.skipped.items()} == {
        name: PROJECT if name in dict(case.layers[-1][1]) else CONFIG for name in case.skipped
    }
    for name, start in case.skipped.items():
        assert start in out.skipped[name][1]
    assert out.loops == case.loops


def test_a_relative_cwd_resolves_against_its_file_and_policy_joins_the_identity_unpooled() -> None:
    layers = [(PROJECT, {"a": entry(command="a", cwd="sub", includeTools=["x"])})]
    kwargs: dict[str, Any] = {
        "env": {},
        "from_session": True,
        "config_path": CONFIG,
        "cwd": "/work/p",
        "is_folder": is_folder,
    }
    pooled = desired(layers, {}, pooling=True, **kwargs).desired["a"]
    alone = desired(layers, {}, pooling=False, **kwargs).desired["a"]
    assert pooled.identity.cwd == "/work/p/sub"
    assert pooled.identity != alone.identity  # the policy key is part of an unpooled identity
