"""The reconciler: desired settings versus held handles, as actions (R1-R6, I2, I3)."""

from __future__ import annotations

from fakes import desired, stdio

from mcpool.pool import ServerSettings
from mcpool.session import Action, ActionKind, Desired, Held, reconcile


def held_from(d: Desired, *, usable: bool = True) -> Held:
    return Held(d.identity, d.key, d.settings.prefix, d.source, usable)


def kinds(actions: list[Action]) -> dict[str, ActionKind]:
    return {a.name: a.kind for a in actions}


def one(old: ServerSettings, new: ServerSettings, *, pool: bool = True) -> ActionKind:
    held = {"srv": held_from(desired("srv", old, pool=pool))}
    return kinds(reconcile({"srv": desired("srv", new, pool=pool)}, held))["srv"]


def test_new_server_is_acquired() -> None:
    assert kinds(reconcile({"srv": desired("srv", stdio())}, {})) == {"srv": ActionKind.ACQUIRE}


def test_removed_server_is_released() -> None:
    actions = reconcile({}, {"srv": held_from(desired("srv", stdio()))})
    assert actions == [Action(ActionKind.RELEASE, "srv", None)]


def test_identity_change_is_a_replace() -> None:
    assert one(stdio(args=["a"]), stdio(args=["b"])) is ActionKind.REPLACE
    assert one(stdio(env={"K": "1"}), stdio(env={"K": "2"})) is ActionKind.REPLACE


def test_unchanged_settings_are_kept() -> None:
    assert one(stdio(trust=True), stdio(trust=True)) is ActionKind.KEEP


def test_equivalent_policy_key_is_kept() -> None:
    old = stdio(includeTools=["b", "a(x)"], excludeTools=[], alwaysLoadTools=False)
    new = stdio(includeTools=["a", "b", "a"])
    assert one(old, new) is ActionKind.KEEP


def test_policy_only_change_is_a_refresh_not_a_replace() -> None:
    assert one(stdio(), stdio(trust=True)) is ActionKind.REFRESH
    assert one(stdio(), stdio(includeTools=[])) is ActionKind.REFRESH
    assert one(stdio(excludeTools=["a"]), stdio()) is ActionKind.REFRESH
    assert one(stdio(), stdio(alwaysLoadTools=True)) is ActionKind.REFRESH
    assert one(stdio(), stdio(prefix=False)) is ActionKind.REFRESH


def test_description_and_disabled_flag_are_not_part_of_the_identity() -> None:
    assert one(stdio(), stdio(description="new words")) is ActionKind.KEEP


def test_source_change_is_a_refresh() -> None:
    d_old = desired("srv", stdio(), source="/a/.mcp.json")
    d_new = desired("srv", stdio(), source="/b/.mcp.json")
    assert kinds(reconcile({"srv": d_new}, {"srv": held_from(d_old)})) == {
        "srv": ActionKind.REFRESH
    }


def test_unusable_handle_is_replaced_even_when_identity_and_key_match() -> None:
    d = desired("srv", stdio())
    assert kinds(reconcile({"srv": d}, {"srv": held_from(d, usable=False)})) == {
        "srv": ActionKind.REPLACE
    }


def test_unpooled_session_scope_server_with_matching_identity_is_kept() -> None:
    # The handle's lifecycle id is `srv::unpooled-N`, never the fingerprint; only the captured
    # identity is compared, so a healthy session-scoped connection survives a reload.
    d = desired("srv", stdio(scope="session"))
    assert d.identity.scope == "session"
    assert kinds(
        reconcile({"srv": desired("srv", stdio(scope="session"))}, {"srv": held_from(d)})
    ) == {"srv": ActionKind.KEEP}


def test_unpooled_session_scope_server_policy_change_is_a_refresh() -> None:
    assert one(stdio(scope="session"), stdio(scope="session", trust=False)) is ActionKind.REFRESH


def test_pool_off_identity_includes_policy_key_so_policy_change_is_a_replace() -> None:
    assert one(stdio(), stdio(trust=True), pool=False) is ActionKind.REPLACE
    assert one(stdio(), stdio(includeTools=["a"]), pool=False) is ActionKind.REPLACE


def test_pool_off_equivalent_policy_key_is_kept() -> None:
    assert one(stdio(includeTools=["b", "a"]), stdio(includeTools=["a", "b(x)"]), pool=False) is (
        ActionKind.KEEP
    )


def test_reconcile_compares_captured_values_not_the_mutated_settings_object() -> None:
    settings = stdio(args=["a"])
    d = desired("srv", settings)
    held = {"srv": held_from(d)}
    settings.args[0] = "b"  # mutated in place after it was handed over
    # The held identity was captured: the same (now mutated) object read afresh differs.
    assert kinds(reconcile({"srv": desired("srv", settings)}, held)) == {"srv": ActionKind.REPLACE}


def test_every_server_gets_exactly_one_action() -> None:
    d_keep, d_ref = desired("keep", stdio("keep")), desired("ref", stdio("ref"))
    d_rep, d_gone = desired("rep", stdio("rep", args=["1"])), desired("gone", stdio("gone"))
    held = {
        n: held_from(d)
        for n, d in [("keep", d_keep), ("ref", d_ref), ("rep", d_rep), ("gone", d_gone)]
    }
    want = {
        "keep": d_keep,
        "ref": desired("ref", stdio("ref", trust=True)),
        "rep": desired("rep", stdio("rep", args=["2"])),
        "new": desired("new", stdio("new")),
    }
    actions = reconcile(want, held)
    assert len(actions) == 5
    assert kinds(actions) == {
        "keep": ActionKind.KEEP,
        "ref": ActionKind.REFRESH,
        "rep": ActionKind.REPLACE,
        "new": ActionKind.ACQUIRE,
        "gone": ActionKind.RELEASE,
    }
