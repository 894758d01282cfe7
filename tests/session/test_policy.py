"""PolicyKey: the canonical per-session, per-server view settings (DESIGN policy-key table, I2)."""

from __future__ import annotations

import copy
import gc

from fakes import stdio

from mcpool.pool import identity_of
from mcpool.session import Interner, PolicyKey, normalize_include


def key(**fields: object) -> PolicyKey:
    return PolicyKey.from_settings(stdio(**fields))


def test_include_order_and_duplicates_are_equivalent() -> None:
    assert key(includeTools=["a", "b", "c"]) == key(includeTools=["c", "a", "b", "a", "c"])
    assert key(includeTools=["a", "b"]).encoded() == key(includeTools=["b", "a", "b"]).encoded()


def test_include_with_args_is_the_bare_tool_name() -> None:
    assert key(includeTools=["run_shell_command(git status)", "read"]) == key(
        includeTools=["read", "run_shell_command"]
    )
    assert normalize_include("foo(args)") == "foo"
    assert normalize_include("  foo ( a, b ) ") == "foo"
    assert normalize_include("foo") == "foo"


def test_include_with_args_allows_the_tool() -> None:
    k = key(includeTools=["run_shell_command(git status)"])
    assert k.allows("run_shell_command")
    assert not k.allows("run_shell_command(git status)")


def test_absent_include_allows_every_tool_and_empty_include_allows_none() -> None:
    absent, empty = key(), key(includeTools=[])
    assert absent != empty
    assert absent.encoded() != empty.encoded()
    assert absent.allows("anything")
    assert not empty.allows("anything")
    assert absent.canonical()["includeTools"] is None
    assert empty.canonical()["includeTools"] == []


def test_exclude_missing_and_empty_are_equivalent() -> None:
    assert key() == key(excludeTools=[])
    assert key(excludeTools=["b", "a", "a"]) == key(excludeTools=["a", "b"])


def test_exclude_names_are_exact_and_not_normalized() -> None:
    k = key(excludeTools=["foo(args)"])
    assert k.allows("foo")
    assert not k.allows("foo(args)")


def test_exclude_wins_over_include() -> None:
    k = key(includeTools=["a", "b"], excludeTools=["b"])
    assert k.allows("a")
    assert not k.allows("b")
    assert k.explain("b") == (False, "excluded by excludeTools")
    assert k.explain("c") == (False, "not listed in includeTools")
    assert k.explain("a") == (True, "listed in includeTools")


def test_trust_missing_false_and_true_are_three_distinct_keys() -> None:
    missing, false, true = key(), key(trust=False), key(trust=True)
    assert len({missing, false, true}) == 3
    assert len({missing.encoded(), false.encoded(), true.encoded()}) == 3
    assert (missing.trust, false.trust, true.trust) == (None, False, True)


def test_always_load_missing_equals_false_and_only_true_enables() -> None:
    assert key() == key(alwaysLoadTools=False)
    assert key().encoded() == key(alwaysLoadTools=False).encoded()
    assert key(alwaysLoadTools=True) != key()
    assert key(alwaysLoadTools=True).always_load is True


def test_policy_key_is_hashable_and_equal_keys_hash_equal() -> None:
    assert hash(key(includeTools=["b", "a"])) == hash(key(includeTools=["a", "b", "a"]))


def test_mutating_settings_after_capture_changes_neither_key_nor_identity() -> None:
    settings = stdio(includeTools=["a"], excludeTools=["x"], args=["--one"], env={"K": "1"})
    captured_key = PolicyKey.from_settings(settings)
    captured_identity = identity_of("srv", settings)
    key_before, identity_before = copy.deepcopy(captured_key), copy.deepcopy(captured_identity)
    fingerprint = captured_identity.fingerprint

    assert isinstance(settings.include_tools, list)
    assert isinstance(settings.exclude_tools, list)
    settings.include_tools.append("b")
    settings.exclude_tools.clear()
    settings.args.append("--two")
    settings.env["K"] = "2"
    settings.trust = True
    settings.command = "/usr/bin/other"

    assert captured_key == key_before
    assert captured_identity == identity_before
    assert captured_identity.fingerprint == fingerprint
    # And the mutated object is seen as different when captured again.
    assert PolicyKey.from_settings(settings) != captured_key
    assert identity_of("srv", settings) != captured_identity


def test_equal_policies_share_one_key_only_while_one_is_held() -> None:
    interner = Interner()
    settings = stdio(includeTools=["interning-probe"])
    key = PolicyKey.from_settings(settings, interner)
    assert PolicyKey.from_settings(copy.deepcopy(settings), interner) is key
    assert PolicyKey.from_settings(copy.deepcopy(settings)) is not key  # another interner's
    assert [k.include for k in interner.policies.values()] == [frozenset({"interning-probe"})]
    assert interner.statistics()["policies"] == {"entries": 1, "interned": 1}
    del key
    gc.collect()
    assert interner.policies.values() == []
