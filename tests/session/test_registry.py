"""Registry generations: build, validate, compare canonically (DESIGN S2-S4, names on the wire)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fakes import entry_with, republish, tool, view_on
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpool.session import (
    MAX_NAME,
    PolicyKey,
    RegistryGeneration,
    SessionView,
    build_candidate,
    empty_generation,
    exposed_name,
)


def build(*views: SessionView, number: int = 1) -> RegistryGeneration:
    return build_candidate(list(views), number=number, settings_generation=1)


def gen_of(server: str, *tools: dict[str, Any], **view_kw: Any) -> RegistryGeneration:
    return build(view_on(entry_with(server, list(tools)), **view_kw))


def changed(a: RegistryGeneration, b: RegistryGeneration) -> list[str]:
    return b.changed_kinds(a)


# -- exposed names -----------------------------------------------------------------------------


def test_exposed_name_is_server_double_underscore_name() -> None:
    assert exposed_name("fs", "read_file") == "fs__read_file"
    assert exposed_name("fs", "read_file", prefix=False) == "read_file"


def test_exposed_name_sanitises_disallowed_characters() -> None:
    assert exposed_name("my.server", "a b/c:d") == "my_server__a_b_c_d"
    assert exposed_name("s", "ünï") == "s___n_"
    assert re.fullmatch(r"[A-Za-z0-9_-]+", exposed_name("s p@ce", "t!o#o$l%"))


def test_exposed_name_keeps_case() -> None:
    assert exposed_name("S", "Read") == "S__Read"
    assert exposed_name("s", "Read") != exposed_name("s", "read")


def test_exposed_name_at_limit_is_not_cut() -> None:
    name = "x" * (MAX_NAME - len("s__"))
    assert exposed_name("s", name) == f"s__{name}"
    assert len(exposed_name("s", name)) == MAX_NAME


def test_long_exposed_name_is_cut_to_64_with_a_hash_suffix_deterministically() -> None:
    long_a = "a" * 100
    cut = exposed_name("server", long_a)
    assert len(cut) == MAX_NAME
    assert re.fullmatch(r"server__a+_[0-9a-f]{8}", cut)
    assert cut == exposed_name("server", long_a)


def test_long_names_sharing_a_prefix_get_distinct_cut_names() -> None:
    base = "b" * 80
    assert exposed_name("s", base + "_one") != exposed_name("s", base + "_two")


def test_long_names_that_sanitise_alike_still_differ_by_hash() -> None:
    base = "c" * 80
    assert exposed_name("s", base + ".x") != exposed_name("s", base + "/x")


# -- publication and validation ------------------------------------------------------------------


def test_published_exposed_names_are_unique_and_routed() -> None:
    gen = build(
        view_on(entry_with("fs", [tool("read"), tool("write")])),
        view_on(entry_with("git", [tool("read"), tool("log")])),
    )
    names = [t["name"] for t in gen.tools]
    assert names == ["fs__read", "fs__write", "git__read", "git__log"]
    assert len(set(names)) == len(names)
    assert {k: (r.view.name, r.upstream_name) for k, r in gen.tool_routes.items()} == {
        "fs__read": ("fs", "read"),
        "fs__write": ("fs", "write"),
        "git__read": ("git", "read"),
        "git__log": ("git", "log"),
    }


def test_route_table_never_splits_on_double_underscore() -> None:
    gen = gen_of("a__b", tool("c__d"))
    assert gen.tool_routes["a__b__c__d"].upstream_name == "c__d"
    assert gen.tool_routes["a__b__c__d"].view.name == "a__b"


def rejected(gen: RegistryGeneration) -> list[tuple[str, str]]:
    return [(r.server, r.item) for r in gen.rejected]


@pytest.mark.parametrize("bad", ["", " ", "  lead", "trail ", "tab\t", "\nnl"])
def test_empty_and_whitespace_padded_tool_names_reject_the_server_part(bad: str) -> None:
    gen = build(
        view_on(entry_with("fs", [tool("ok"), tool(bad)])),
        view_on(entry_with("git", [tool("log")])),
    )
    (info,) = gen.rejected
    assert (info.server, info.item) == ("fs", bad)
    assert "name" in info.rule
    # Nothing was served for fs before: it serves nothing; git is published all the same.
    assert "serves nothing" in info.describe()
    assert [t["name"] for t in gen.tools] == ["git__log"]


def test_whitespace_padded_prompt_name_rejects_the_server_part() -> None:
    entry = entry_with("fs", [tool("ok")], prompts=[{"name": "p "}])
    (info,) = build(view_on(entry)).rejected
    assert "prompt name has leading or trailing whitespace" in str(info)


def test_inner_whitespace_is_not_a_rejection_but_is_sanitised() -> None:
    assert [t["name"] for t in gen_of("fs", tool("a b")).tools] == ["fs__a_b"]


def test_hidden_bad_name_does_not_reject() -> None:
    gen = gen_of("fs", tool("ok"), tool(" bad"), key=PolicyKey(include=frozenset({"ok"})))
    assert [t["name"] for t in gen.tools] == ["fs__ok"]
    assert gen.rejected == ()


def test_unprefixed_servers_with_the_same_tool_name_collide_and_reject_the_later() -> None:
    gen = build(
        view_on(entry_with("one", [tool("read")]), prefix=False),
        view_on(entry_with("two", [tool("read"), tool("other")]), prefix=False),
    )
    (info,) = gen.rejected
    assert info.server == "two"
    assert "which server 'one' uses" in info.rule
    assert {k: r.view.name for k, r in gen.tool_routes.items()} == {"read": "one"}


def test_names_that_sanitise_to_one_exposed_name_collide_and_reject() -> None:
    (info,) = gen_of("fs", tool("a.b"), tool("a/b")).rejected
    assert "fs__a_b" in str(info)


def test_prefixed_and_unprefixed_names_collide_across_servers() -> None:
    gen = build(
        view_on(entry_with("fs", [tool("read")])),
        view_on(entry_with("raw", [tool("fs__read")]), prefix=False),
    )
    assert rejected(gen) == [("raw", "fs__read")]
    assert list(gen.tool_routes) == ["fs__read"]


# -- case-insensitive collisions (S3, issue 15.7) -------------------------------------------------


def test_names_differing_only_in_case_on_one_server_reject_its_part() -> None:
    gen = build(
        view_on(entry_with("srv", [tool("Foo"), tool("foo")])),
        view_on(entry_with("other", [tool("bar")])),
    )
    (info,) = gen.rejected
    assert (info.server, info.item) == ("srv", "foo")
    assert "differs only in case from 'srv__Foo'" in info.rule
    assert [t["name"] for t in gen.tools] == ["other__bar"]


def test_names_differing_only_in_case_across_unprefixed_servers_reject_the_later() -> None:
    gen = build(
        view_on(entry_with("one", [tool("X")]), prefix=False),
        view_on(entry_with("two", [tool("x")]), prefix=False),
    )
    (info,) = gen.rejected
    assert info.server == "two"
    assert "differs only in case from 'X' (server 'one')" in info.rule
    assert list(gen.tool_routes) == ["X"]


def test_servers_whose_names_differ_in_case_collide_through_their_prefixes() -> None:
    gen = build(
        view_on(entry_with("Git", [tool("log")])), view_on(entry_with("git", [tool("log")]))
    )
    assert rejected(gen) == [("git", "log")]


def test_prompts_and_tools_are_separate_namespaces() -> None:
    entry = entry_with("srv", [tool("a")], prompts=[{"name": "A"}])
    assert build(view_on(entry)).rejected == ()


# -- a rejected part falls back; the rest is published (S8, issue 15.1) ---------------------------


def test_a_server_newly_taking_a_served_name_is_the_one_rejected() -> None:
    one = entry_with("one", [tool("a")])
    two = entry_with("two", [tool("b")])
    views = [view_on(one, prefix=False), view_on(two, prefix=False)]
    first = build(*views)
    # The earlier server in settings order takes the later one's name: it is the one that changed.
    republish(one, tools=(tool("a"), tool("b")))
    second = build_candidate(views, number=2, settings_generation=1, previous=first)
    (info,) = second.rejected
    assert info.server == "one"
    assert "its last accepted lists stay served" in info.describe()
    assert {k: r.view.name for k, r in second.tool_routes.items()} == {"a": "one", "b": "two"}


def test_a_rejected_part_keeps_its_last_snapshot_under_the_current_policy() -> None:
    fs = entry_with("fs", [tool("a"), tool("b")])
    git = entry_with("git", [tool("log")])
    fs_view, git_view = view_on(fs), view_on(git)
    first = build(fs_view, git_view)
    republish(fs, tools=(tool("a"), tool("b"), tool(" y")))
    republish(git, tools=(tool("log"), tool("diff")))
    fs_view.key = PolicyKey(exclude=frozenset({"a"}))
    second = build_candidate([fs_view, git_view], number=2, settings_generation=1, previous=first)
    assert rejected(second) == [("fs", " y")]
    # fs: its last accepted snapshot through the new policy; git: its new snapshot.
    assert [t["name"] for t in second.tools] == ["fs__b", "git__log", "git__diff"]
    assert changed(first, second) == ["tools"]


def test_a_fallback_that_fails_under_the_new_policy_is_narrowed_instead() -> None:
    fs = entry_with("fs", [tool("a"), tool("b"), tool(" hidden")])
    view = view_on(fs, key=PolicyKey(include=frozenset({"a", "b"})))
    first = build(view)
    # The new policy shows the bad name in the old snapshot too: the previous part, narrowed.
    view.key = PolicyKey(include=frozenset({"b", " hidden"}))
    second = build_candidate([view], number=2, settings_generation=1, previous=first)
    (info,) = second.rejected
    assert "narrowed by the current filters" in info.describe()
    assert [t["name"] for t in second.tools] == ["fs__b"]


def test_a_part_with_nothing_to_fall_back_on_serves_nothing_until_fixed() -> None:
    fs = entry_with("fs", [tool(" y")])
    view = view_on(fs)
    first = build(view)
    assert first.tools == () and rejected(first) == [("fs", " y")]
    republish(fs, tools=(tool("y"),))
    second = build_candidate([view], number=2, settings_generation=1, previous=first)
    assert second.rejected == ()
    assert [t["name"] for t in second.tools] == ["fs__y"]


def test_unavailable_entry_contributes_nothing() -> None:
    entry = entry_with("fs", [tool("read")])
    republish(entry, available=False)
    gen = build(view_on(entry))
    assert gen.tools == ()
    assert gen.tool_routes == {}


# -- ordering and atomicity ----------------------------------------------------------------------


def test_ordering_is_deterministic_servers_in_view_order_tools_in_upstream_order() -> None:
    fs, git = entry_with("fs", [tool("z"), tool("a")]), entry_with("git", [tool("m")])
    first = build(view_on(fs), view_on(git))
    again = build(view_on(fs), view_on(git))
    assert [t["name"] for t in first.tools] == ["fs__z", "fs__a", "git__m"]
    assert [t["name"] for t in again.tools] == [t["name"] for t in first.tools]
    assert first.canonical == again.canonical


def test_canonical_form_ignores_server_order() -> None:
    fs, git = entry_with("fs", [tool("z")]), entry_with("git", [tool("m")])
    assert changed(build(view_on(fs), view_on(git)), build(view_on(git), view_on(fs))) == []


def test_added_removed_and_renamed_tools_change_lookup_and_listing_together() -> None:
    entry = entry_with("fs", [tool("read"), tool("old")])
    view = view_on(entry)
    before = build(view)
    republish(entry, tools=(tool("read"), tool("new"), tool("added")))
    after = build(view, number=2)
    # The old generation is untouched: its listing and its routes still agree.
    assert [t["name"] for t in before.tools] == ["fs__read", "fs__old"]
    assert set(before.tool_routes) == {"fs__read", "fs__old"}
    assert [t["name"] for t in after.tools] == ["fs__read", "fs__new", "fs__added"]
    assert set(after.tool_routes) == {"fs__read", "fs__new", "fs__added"}
    assert changed(before, after) == ["tools"]


def test_every_listed_tool_has_a_route_and_every_route_is_listed() -> None:
    gen = build(
        view_on(entry_with("a", [tool("x"), tool("y")])),
        view_on(entry_with("b", [tool("x")], prompts=[{"name": "p"}])),
    )
    assert [t["name"] for t in gen.tools] == list(gen.tool_routes)
    assert [p["name"] for p in gen.prompts] == list(gen.prompt_routes)


# -- canonical comparison ------------------------------------------------------------------------


def one_tool_gen(t: dict[str, Any], *, key: PolicyKey | None = None) -> RegistryGeneration:
    return gen_of("fs", t, key=key)


def test_equivalent_metadata_is_no_change() -> None:
    a = {
        "name": "t",
        "description": "d",
        "inputSchema": {
            "type": "object",
            "properties": {"x": {"type": "string"}, "y": {"type": "number"}},
        },
    }
    b = {
        "inputSchema": {
            "properties": {"y": {"type": "number"}, "x": {"type": "string"}},
            "type": "object",
        },
        "description": "d",
        "name": "t",
    }
    assert changed(one_tool_gen(a), one_tool_gen(b)) == []


def test_reordered_tool_list_is_no_change() -> None:
    assert changed(gen_of("fs", tool("a"), tool("b")), gen_of("fs", tool("b"), tool("a"))) == []


def test_reordering_required_type_and_enum_strings_is_no_change() -> None:
    a = tool(
        "t", required=["a", "b"], properties={"a": {"type": ["string", "null"], "enum": ["x", "y"]}}
    )
    b = tool(
        "t", required=["b", "a"], properties={"a": {"type": ["null", "string"], "enum": ["y", "x"]}}
    )
    assert changed(one_tool_gen(a), one_tool_gen(b)) == []


def test_reordering_an_array_valued_default_is_a_change() -> None:
    a = tool("t", properties={"a": {"type": "array", "default": ["x", "y"]}})
    b = tool("t", properties={"a": {"type": "array", "default": ["y", "x"]}})
    assert changed(one_tool_gen(a), one_tool_gen(b)) == ["tools"]


def test_reordering_examples_is_a_change() -> None:
    a = tool("t", properties={"a": {"examples": ["x", "y"]}})
    b = tool("t", properties={"a": {"examples": ["y", "x"]}})
    assert changed(one_tool_gen(a), one_tool_gen(b)) == ["tools"]


def test_served_schema_properties_keep_source_order() -> None:
    t = tool(
        "t",
        properties={"zz": {"type": "string"}, "aa": {"type": "number"}, "mm": {}},
        required=["zz", "aa"],
    )
    served = gen_of("fs", t).tools[0]
    assert list(served["inputSchema"]["properties"]) == ["zz", "aa", "mm"]
    assert served["inputSchema"]["required"] == ["zz", "aa"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(tool("t"), tool("u"), id="name"),
        pytest.param(tool("t", "one"), tool("t", "two"), id="description"),
        pytest.param(
            tool("t", properties={"a": {}}), tool("t", properties={"b": {}}), id="input-schema"
        ),
        pytest.param(
            tool("t", required=["a"]), tool("t", required=["a", "b"]), id="required-added"
        ),
        pytest.param(
            tool("t"), {**tool("t"), "annotations": {"readOnlyHint": True}}, id="annotations"
        ),
    ],
)
def test_tool_metadata_change_is_a_change(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert changed(one_tool_gen(before), one_tool_gen(after)) == ["tools"]


def test_tool_addition_and_removal_are_changes() -> None:
    one, two = gen_of("fs", tool("a")), gen_of("fs", tool("a"), tool("b"))
    assert changed(one, two) == ["tools"]
    assert changed(two, one) == ["tools"]


def test_visibility_change_is_a_change() -> None:
    entry = entry_with("fs", [tool("a"), tool("b")])
    everything = build(view_on(entry))
    only_a = build(view_on(entry, key=PolicyKey(include=frozenset({"a"}))))
    assert changed(everything, only_a) == ["tools"]


def test_meta_projection_change_is_a_change() -> None:
    entry = entry_with("fs", [tool("a")])
    assert changed(
        build(view_on(entry)), build(view_on(entry, key=PolicyKey(always_load=True)))
    ) == ["tools"]


def test_prompt_and_resource_changes_are_reported_per_kind() -> None:
    base = entry_with("fs", [tool("a")], prompts=[{"name": "p"}], resources=[{"uri": "file:///x"}])
    g1 = build(view_on(base))
    republish(base, prompts=({"name": "q"},))
    g2 = build(view_on(base))
    republish(base, resources=({"uri": "file:///y"},))
    g3 = build(view_on(base))
    assert changed(g1, g2) == ["prompts"]
    assert changed(g2, g3) == ["resources"]


def test_first_generation_against_empty_reports_what_it_has() -> None:
    gen = gen_of("fs", tool("a"))
    assert changed(empty_generation(), gen) == ["tools"]
    assert changed(empty_generation(), build()) == []


def test_rejected_candidate_leaves_previously_built_generation_untouched() -> None:
    entry = entry_with("fs", [tool("a")])
    view = view_on(entry)
    good = build(view)
    snapshot_of_good = ([dict(t) for t in good.tools], dict(good.tool_routes), dict(good.canonical))
    republish(entry, tools=(tool("a"), tool("")))
    after = build_candidate([view], number=2, settings_generation=1, previous=good)
    assert rejected(after) == [("fs", "")]
    # What is served is exactly the previous part: the same shared aggregate.
    assert after.agg is good.agg
    assert ([dict(t) for t in good.tools], dict(good.tool_routes), dict(good.canonical)) == (
        snapshot_of_good
    )


def test_resources_route_to_the_first_server_that_lists_the_uri() -> None:
    one = entry_with("one", [], resources=[{"uri": "file:///a"}])
    two = entry_with("two", [], resources=[{"uri": "file:///a"}, {"uri": "file:///b"}])
    gen = build(view_on(one), view_on(two))
    assert {u: v.name for u, v in gen.resource_routes.items()} == {
        "file:///a": "one",
        "file:///b": "two",
    }
    assert [r["uri"] for r in gen.resources] == ["file:///a", "file:///b"]


# -- property: whatever servers publish, the candidate is whole and only bad parts fall back -----

_tool_names = st.sampled_from(["a", "A", "b", "B", " c", "", "d "])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.lists(_tool_names, max_size=4), st.booleans()), min_size=1, max_size=4),
    st.lists(st.lists(_tool_names, max_size=4), min_size=4, max_size=4),
)
def test_parts_are_rejected_alone_and_exposed_names_stay_unique_ignoring_case(
    servers: list[tuple[list[str], bool]], later: list[list[str]]
) -> None:
    entries = [
        entry_with(f"s{i}", [tool(n) for n in names]) for i, (names, _) in enumerate(servers)
    ]
    views = [view_on(e, prefix=p) for e, (_, p) in zip(entries, servers, strict=True)]
    previous = build(*views)
    for entry, names in zip(entries, later, strict=False):
        republish(entry, tools=tuple(tool(n) for n in names))
    gen = build_candidate(views, number=2, settings_generation=1, previous=previous)
    for candidate in (previous, gen):
        exposed = [t["name"] for t in candidate.tools]
        assert len({n.casefold() for n in exposed}) == len(exposed)
        assert set(candidate.tool_routes) == set(exposed)
        # No bad name is ever served, not even from a fallback.
        assert all(
            r.upstream_name.strip() == r.upstream_name != "" for r in candidate.tool_routes.values()
        )
    rejected_servers = {r.server for r in gen.rejected}
    for view, part in zip(gen.views, gen.agg.projections, strict=True):
        if view.name not in rejected_servers:
            # A server that was not rejected serves exactly its current projection.
            assert part is view.projection()
