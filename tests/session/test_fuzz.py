"""Fuzzing policy-key normalization with hypothesis (issue 9; DESIGN policy-key table).

The example-based rules live in test_policy.py; here they hold for arbitrary settings: a key is
insensitive to order and duplicates in includeTools/excludeTools and to `foo(args)` spellings,
normalization is idempotent (a key rebuilt from its own canonical form is the same key), the
encoded form identifies the key exactly, and `allows` follows the table for every name.

Hypothesis deadlines are off (`deadline=None`): timing is no property here, and a slow example on
a loaded CI machine must not fail the run.
"""

from __future__ import annotations

import random
from typing import Any

from fakes import stdio
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpool.session import PolicyKey, normalize_include

_tool_names = st.text(
    st.characters(codec="ascii", categories=["L", "N"], include_characters="_-."),
    min_size=1,
    max_size=8,
)
# What people write in includeTools: plain names, gemini-cli's `name(args)`, stray spaces.
_include_items = st.one_of(
    _tool_names,
    st.builds(
        lambda n, a: f"{n}({a})", _tool_names, st.text(max_size=8).filter(lambda a: ")" not in a)
    ),
    st.builds(lambda n: f"  {n} ", _tool_names),
)
_absent = st.just(None)


@st.composite
def _policies(draw: st.DrawFn) -> dict[str, Any]:
    """Settings fields of one server's policy; None means the field is absent."""
    fields: dict[str, Any] = {}
    for key, strategy in (
        ("trust", st.booleans()),
        ("includeTools", st.lists(_include_items, max_size=6)),
        ("excludeTools", st.lists(_tool_names, max_size=6)),
        ("alwaysLoadTools", st.booleans()),
    ):
        value = draw(_absent | strategy)
        if value is not None:
            fields[key] = value
    return fields


def _key(fields: dict[str, Any]) -> PolicyKey:
    return PolicyKey.from_settings(stdio(**fields))


def _shuffled_with_duplicates(items: list[str], rnd: random.Random) -> list[str]:
    out = items + [rnd.choice(items) for _ in range(rnd.randint(0, 3))] if items else []
    rnd.shuffle(out)
    return out


@settings(deadline=None)
@given(_policies(), st.randoms(use_true_random=False))
def test_order_and_duplicates_never_change_the_key(
    fields: dict[str, Any], rnd: random.Random
) -> None:
    other = dict(fields)
    for name in ("includeTools", "excludeTools"):
        if name in other:
            other[name] = _shuffled_with_duplicates(other[name], rnd)
    a, b = _key(fields), _key(other)
    assert a == b
    assert hash(a) == hash(b)
    assert a.encoded() == b.encoded()


@settings(deadline=None)
@given(_policies())
def test_normalization_is_idempotent(fields: dict[str, Any]) -> None:
    key = _key(fields)
    canon = key.canonical()
    rebuilt: dict[str, Any] = {
        "excludeTools": canon["excludeTools"],
        "alwaysLoadTools": canon["alwaysLoadTools"],
    }
    if canon["trust"] is not None:
        rebuilt["trust"] = canon["trust"]
    if canon["includeTools"] is not None:
        rebuilt["includeTools"] = canon["includeTools"]
    again = _key(rebuilt)
    assert again == key
    assert again.encoded() == key.encoded()
    assert again.canonical() == canon


@settings(deadline=None)
@given(_include_items | st.text(max_size=12))
def test_include_name_normalization_is_idempotent(item: str) -> None:
    once = normalize_include(item)
    assert normalize_include(once) == once
    assert once == once.strip()


@settings(deadline=None)
@given(_tool_names, st.text(max_size=10).filter(lambda a: ")" not in a))
def test_include_with_arguments_is_the_bare_name(name: str, args: str) -> None:
    assert _key({"includeTools": [f"{name}({args})"]}) == _key({"includeTools": [name]})


@settings(deadline=None)
@given(_policies(), _policies())
def test_encoded_form_identifies_the_key(a: dict[str, Any], b: dict[str, Any]) -> None:
    ka, kb = _key(a), _key(b)
    assert (ka == kb) == (ka.encoded() == kb.encoded())


@settings(deadline=None)
@given(_policies(), st.lists(_tool_names, max_size=10))
def test_allows_follows_the_table(fields: dict[str, Any], names: list[str]) -> None:
    key = _key(fields)
    include = fields.get("includeTools")
    exclude = set(fields.get("excludeTools") or ())
    included = None if include is None else {normalize_include(n) for n in include}
    for name in [*names, *exclude, *(included or ())]:
        expected = name not in exclude and (included is None or name in included)
        assert key.allows(name) == expected, (name, fields)
        assert key.explain(name)[0] == expected


@settings(deadline=None)
@given(_policies())
def test_trust_stays_three_valued_and_always_load_two_valued(fields: dict[str, Any]) -> None:
    key = _key(fields)
    assert key.trust is fields.get("trust")  # None when absent, else the bool given
    assert key.always_load is (fields.get("alwaysLoadTools") is True)
    without_false_always_load = {
        k: v for k, v in fields.items() if not (k == "alwaysLoadTools" and v is False)
    }
    assert _key(without_false_always_load) == key
    without_empty_exclude = {
        k: v for k, v in fields.items() if not (k == "excludeTools" and v == [])
    }
    assert _key(without_empty_exclude) == key
    if "includeTools" not in fields:
        assert _key({**fields, "includeTools": []}) != key  # absent allows all, [] allows none
