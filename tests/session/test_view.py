"""View projection: one entry's snapshot through one session's policy key (DESIGN projection)."""

from __future__ import annotations

import copy

import msgspec
from fakes import entry_with, republish, stdio, tool, view_on

from mcpool.pool import Snapshot
from mcpool.session import PolicyKey, project


def key(**fields: object) -> PolicyKey:
    return PolicyKey.from_settings(stdio(**fields))


def snapshot(*tools: dict[str, object], prompts: tuple[dict[str, object], ...] = ()) -> Snapshot:
    return Snapshot(generation=1, available=True, tools=tools, prompts=prompts)


def served_meta(proj_tools: tuple[tuple[str, str, dict[str, object]], ...]) -> dict[str, object]:
    return {exposed: served["_meta"] for exposed, _, served in proj_tools}


def test_projection_renames_to_exposed_name_and_keeps_upstream_name_for_routing() -> None:
    proj = project(snapshot(tool("read")), PolicyKey(), "fs")
    assert [(e, u, t["name"]) for e, u, t in proj.tools] == [("fs__read", "read", "fs__read")]


def test_projection_meta_server_always_trust_only_when_set() -> None:
    snap = snapshot(tool("read"))
    assert served_meta(project(snap, key(), "fs").tools) == {"fs__read": {"mcpool/server": "fs"}}
    assert served_meta(project(snap, key(trust=False), "fs").tools) == {
        "fs__read": {"mcpool/server": "fs", "mcpool/trust": False}
    }
    assert served_meta(project(snap, key(trust=True), "fs").tools) == {
        "fs__read": {"mcpool/server": "fs", "mcpool/trust": True}
    }


def test_always_load_true_adds_both_meta_keys_and_false_adds_none() -> None:
    snap = snapshot(tool("read"))
    eager = served_meta(project(snap, key(alwaysLoadTools=True), "fs").tools)["fs__read"]
    assert eager == {"mcpool/server": "fs", "anthropic/alwaysLoad": True, "mcpool/alwaysLoad": True}
    lazy = served_meta(project(snap, key(alwaysLoadTools=False), "fs").tools)["fs__read"]
    assert lazy == {"mcpool/server": "fs"}


def test_projection_merges_upstream_meta_without_touching_the_original() -> None:
    upstream = {**tool("read"), "_meta": {"vendor/x": 1, "anthropic/alwaysLoad": False}}
    snap = snapshot(upstream)
    before = copy.deepcopy(snap.tools)
    served = project(snap, key(alwaysLoadTools=True), "fs").tools[0][2]
    assert served["_meta"] == {
        "vendor/x": 1,
        "anthropic/alwaysLoad": True,
        "mcpool/server": "fs",
        "mcpool/alwaysLoad": True,
    }
    assert snap.tools == before
    assert snap.tools[0]["_meta"] == {"vendor/x": 1, "anthropic/alwaysLoad": False}
    assert snap.tools[0]["name"] == "read"


def test_shared_snapshot_isolation_between_two_sessions_and_the_entry() -> None:
    entry = entry_with("fs", [tool("read"), tool("write")])
    pristine = copy.deepcopy(entry.snapshot)
    eager = view_on(entry, key=key(alwaysLoadTools=True, trust=True))
    plain = view_on(entry, key=key())

    eager_before = copy.deepcopy(eager.projection())
    plain_before = copy.deepcopy(plain.projection())
    # Project both again in the other order: neither sees the other's clone.
    plain_after, eager_after = plain.projection(), eager.projection()

    # Projections compare by identity (they are shared objects): compare their content.
    assert msgspec.to_builtins(plain_after) == msgspec.to_builtins(plain_before)
    assert msgspec.to_builtins(eager_after) == msgspec.to_builtins(eager_before)
    for _, _, served in plain_after.tools:
        assert served["_meta"] == {"mcpool/server": "fs"}
    for _, _, served in eager_after.tools:
        assert served["_meta"]["anthropic/alwaysLoad"] is True
        assert served["_meta"]["mcpool/trust"] is True
    assert entry.snapshot == pristine
    assert all("_meta" not in t for t in entry.snapshot.tools)
    assert [t["name"] for t in entry.snapshot.tools] == ["read", "write"]


def test_hidden_tools_are_reported_and_not_served() -> None:
    proj = project(snapshot(tool("a"), tool("b"), tool("c")), key(includeTools=["a", "c"]), "s")
    assert [u for _, u, _ in proj.tools] == ["a", "c"]
    assert proj.hidden_tools == ("b",)


def test_empty_include_hides_every_tool() -> None:
    proj = project(snapshot(tool("a"), tool("b")), key(includeTools=[]), "s")
    assert proj.tools == ()
    assert proj.hidden_tools == ("a", "b")


def test_filters_apply_to_prompt_names_too() -> None:
    snap = snapshot(prompts=({"name": "p1"}, {"name": "p2"}))
    proj = project(snap, key(excludeTools=["p2"]), "s")
    assert [(e, u) for e, u, _ in proj.prompts] == [("s__p1", "p1")]


def test_projection_keeps_upstream_tool_order() -> None:
    proj = project(snapshot(tool("zeta"), tool("alpha"), tool("mid")), key(), "s")
    assert [u for _, u, _ in proj.tools] == ["zeta", "alpha", "mid"]


def test_served_schema_properties_keep_source_order() -> None:
    schema_tool = tool("t", properties={"zz": {"type": "string"}, "aa": {"type": "number"}})
    served = project(snapshot(schema_tool), key(), "s").tools[0][2]
    assert list(served["inputSchema"]["properties"]) == ["zz", "aa"]
    assert list(msgspec.json.decode(msgspec.json.encode(served))["inputSchema"]["properties"]) == [
        "zz",
        "aa",
    ]


def test_prefix_false_exposes_upstream_names() -> None:
    proj = project(snapshot(tool("read")), key(), "fs", prefix=False)
    assert proj.tools[0][:2] == ("read", "read")


def test_tools_without_a_string_name_are_skipped() -> None:
    proj = project(snapshot({"description": "no name"}, {"name": 3}, tool("ok")), key(), "s")
    assert [u for _, u, _ in proj.tools] == ["ok"]


def test_equal_policies_on_one_entry_share_one_projection_object() -> None:
    entry = entry_with("fs", [tool("read")])
    first = view_on(entry, key=key(includeTools=["read", "x"]))
    second = view_on(entry, key=key(includeTools=["x", "read(a)"]))
    assert first.projection() is second.projection()
    assert view_on(entry, key=key(trust=True)).projection() is not first.projection()


def test_new_snapshot_generation_gives_a_new_projection() -> None:
    entry = entry_with("fs", [tool("read")])
    view = view_on(entry)
    old = view.projection()
    republish(entry, tools=(tool("read"), tool("write")))
    assert [u for _, u, _ in view.projection().tools] == ["read", "write"]
    assert [u for _, u, _ in old.tools] == ["read"]


def test_projection_cache_never_serves_another_entry_with_the_same_lifecycle_id() -> None:
    # One key outlives many entries: a replacement entry for the same identity starts its
    # snapshot generations again, and must not be served the old entry's projection.
    old_entry = entry_with("fs", [tool("old_tool")], generation=1)
    old_projection = view_on(old_entry).projection()  # still referenced (e.g. by a session)
    new_entry = entry_with("fs", [tool("new_tool")], generation=1)
    assert new_entry.lifecycle_id == old_entry.lifecycle_id
    assert [u for _, u, _ in view_on(new_entry).projection().tools] == ["new_tool"]
    assert [u for _, u, _ in old_projection.tools] == ["old_tool"]


def test_view_update_reports_change_only_for_a_different_canonical_key() -> None:
    view = view_on(entry_with("fs", [tool("read")]), key=key(includeTools=["a", "b"]))
    assert view.update(key(includeTools=["b", "a", "a(x)"]), prefix=True, source="/x") is False
    assert view.source == "/x"
    assert view.update(key(includeTools=["a"]), prefix=True, source="/x") is True
    assert view.key == key(includeTools=["a"])
    assert view.update(key(includeTools=["a"]), prefix=False, source="/x") is True
    assert view.prefix is False


def test_view_projection_uses_its_captured_key_not_the_settings_object() -> None:
    settings = stdio("fs", includeTools=["read"])
    view = view_on(
        entry_with("fs", [tool("read"), tool("write")]), key=PolicyKey.from_settings(settings)
    )
    assert isinstance(settings.include_tools, list)
    settings.include_tools.append("write")  # mutated after it was handed over
    assert [u for _, u, _ in view.projection().tools] == ["read"]
