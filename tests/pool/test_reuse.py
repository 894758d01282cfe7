"""Listed items that did not change keep their decoded objects across relists (issue 17).

`KnownItems.decode` must give what a full decode gives (the same values, the same cursor, the
same answer for results that are no list at all), and the items whose encoding did not change
must be the very objects of the last accepted listing, which is what lets everything derived
from them downstream be reused.
"""

from __future__ import annotations

import json
import operator
from array import array
from typing import Any

import msgspec
import trio
import trio.testing
from fakes import FakeNet, FakeServer, make_pool, stdio, tool
from hypothesis import given
from hypothesis import strategies as st

from mcpool.pool import PoolEntry, _reuse, identity_of
from mcpool.pool._reuse import KnownItems, _moved, spliced

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=10,
)
items = st.lists(st.one_of(st.builds(tool, st.text(max_size=3)), json_values), max_size=8)


def page(field: str, listed: list[Any], cursor: Any = None) -> msgspec.Raw:
    body: dict[str, Any] = {field: listed}
    if cursor is not None:
        body["nextCursor"] = cursor
    return msgspec.Raw(msgspec.json.encode(body))


@given(items, items, st.none() | st.text(max_size=3))
def test_a_page_decodes_to_what_a_full_decode_gives(
    first: list[Any], second: list[Any], cursor: str | None
) -> None:
    known = KnownItems()
    for listed in (first, second, first):
        known.start()
        result = known.decode(page("tools", listed, cursor), "tools")
        assert list(result["tools"]) == msgspec.json.decode(msgspec.json.encode(listed))
        assert result.get("nextCursor") == cursor
        known.finish(tuple(i for i in result["tools"] if isinstance(i, dict)))


def test_unchanged_items_are_the_objects_listed_before() -> None:
    known = KnownItems()
    before = [tool("a"), tool("b"), tool("c")]
    known.start()
    old = known.decode(page("tools", before), "tools")["tools"]
    known.finish(tuple(old))
    known.start()
    new = known.decode(page("tools", [tool("c"), tool("b", "changed"), tool("a")]), "tools")
    listed = new["tools"]
    assert listed[0] is old[2] and listed[2] is old[0]  # moved, unchanged: the same objects
    assert listed[1] is not old[1] and listed[1]["description"] == "changed"
    assert known.fresh == [listed[1]]  # only the changed one is new (and checked again)


def test_only_accepted_items_of_a_complete_listing_are_kept() -> None:
    known = KnownItems()
    known.start()
    first = known.decode(page("tools", [tool("a"), {"nameless": 1}]), "tools")["tools"]
    known.finish((first[0],))  # the pool left the malformed item out
    assert len(known) == 1
    known.start()
    again = known.decode(page("tools", [tool("a"), {"nameless": 1}]), "tools")["tools"]
    assert again[0] is first[0]
    assert again[1] is not first[1] and known.fresh == [again[1]]  # checked (and refused) again


def test_results_that_are_no_page_decode_as_before() -> None:
    known = KnownItems()
    for body in (b"[1,2]", b'{"tools":null}', b'{"nextCursor":"x"}', b'"text"', b"null"):
        known.start()
        assert known.decode(msgspec.Raw(body), "tools") == msgspec.json.decode(body)


class Listener:
    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: object) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: object, msg: object) -> None:
        return None


async def test_a_relist_keeps_the_unchanged_tools_and_still_reports_malformed_ones(
    nursery: trio.Nursery,
) -> None:
    server = FakeServer([tool("a"), tool("b"), {"description": "no name"}])
    pool = make_pool(nursery, FakeNet(srv=server))
    settings = stdio()
    with trio.fail_after(5):
        handle = await pool.acquire(identity_of("srv", settings), settings, "s1", Listener())
    entry = handle.entry
    first = entry.snapshot.tools
    assert [t["name"] for t in first] == ["a", "b"]
    assert any("1 malformed item" in n for n in entry.snapshot.notes)

    server.tools = [tool("b"), tool("a", "changed"), {"description": "no name"}]
    server.upstreams[-1].list_changed()
    with trio.fail_after(5):
        while entry.snapshot.tools is first:
            await trio.sleep(0.01)
    relisted = entry.snapshot.tools
    assert relisted == (tool("b"), tool("a", "changed"))
    assert relisted[0] is first[1]  # unchanged: the object of the first listing
    assert relisted[1] is not first[0]
    assert any("1 malformed item" in n for n in entry.snapshot.notes)  # still said


# Edits of a listing, as a relist sees them: an item added, removed or changed anywhere.
edits = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "change"]), st.integers(0, 40), json_values),
    max_size=6,
)
# How an upstream may lay a page out: compact, spaced, or with fields around the list.
layouts = st.sampled_from(["compact", "spaced", "meta_first", "cursor_first"])


def encoded(field: str, listed: list[Any], cursor: Any, layout: str) -> msgspec.Raw:
    body: dict[str, Any] = {}
    if layout == "meta_first":
        body["_meta"] = {"n": len(listed)}  # a head that changes with the list
    if layout == "cursor_first" and cursor is not None:
        body["nextCursor"] = cursor
    body[field] = listed
    if cursor is not None:
        body["nextCursor"] = cursor
    separators = (", ", ": ") if layout == "spaced" else (",", ":")
    return msgspec.Raw(json.dumps(body, separators=separators).encode())


@given(items, st.lists(edits, min_size=1, max_size=5), layouts, st.integers(1, 4))
def test_relists_after_any_edits_decode_to_what_a_full_decode_gives(
    start: list[Any], rounds: list[list[tuple[str, int, Any]]], layout: str, page_size: int
) -> None:
    """The bytes compared with the last listing's and only the changed ones parsed (`_delta`)
    give the values a decode from scratch gives, page by page, whatever changed where; and an
    item is left unchecked (not `fresh`) only when it is an object the last listing accepted;
    and the ends it says a listing shares with the one before (`kept`, what the session side
    then compares no more) are the very objects there."""
    known = KnownItems()
    listed = list(start)
    accepted: set[int] = set()
    before: tuple[Any, ...] | None = None  # the last listing, when every item was accepted
    for edit in [[], *rounds]:
        for kind, at, value in edit:
            at = at % (len(listed) + 1)
            if kind == "add":
                listed.insert(at, value)
            elif listed:
                at = min(at, len(listed) - 1)
                if kind == "remove":
                    del listed[at]
                else:
                    listed[at] = value
        known.start()
        pages = [listed[i : i + page_size] for i in range(0, len(listed), page_size)] or [[]]
        got: list[Any] = []
        for number, part in enumerate(pages):
            cursor = str(number + 1) if number + 1 < len(pages) else None
            result = known.decode(encoded("tools", part, cursor, layout), "tools")
            assert list(result["tools"]) == part
            assert result.get("nextCursor") == cursor
            got.extend(result["tools"])
        fresh = set(map(id, known.fresh))
        for item in got:
            assert id(item) in fresh or id(item) in accepted
        # The pool accepts the objects (dicts) and leaves the rest out.
        kept = tuple(i for i in got if isinstance(i, dict))
        known.finish(kept)
        accepted = set(map(id, kept))
        ends = known.kept(kept)
        complete = len(kept) == len(got)
        if before is None or not complete:
            assert ends is None
        else:
            assert ends is not None and ends[0] is before
            head, tail = ends[1], ends[2]
            assert head + tail <= min(len(kept), len(before))
            assert all(map(operator.is_, kept[:head], before[:head]))
            assert all(map(operator.is_, kept[len(kept) - tail :], before[len(before) - tail :]))
        assert not kept or known.kept(tuple(list(kept))) is None  # only that very listing
        before = kept if complete else None


def test_a_relisting_tells_the_ends_it_shares_with_the_one_before() -> None:
    """`kept`: one item changed in the middle of a 50-item list of 3 pages (the same page
    count), and every other item is at one of the ends it tells."""
    known = KnownItems()
    listings = [
        [tool(f"t{i}") for i in range(50)],
        [tool(f"t{i}", "changed" if i == 23 else "") for i in range(50)],
        [tool(f"t{i}", "changed" if i == 23 else "") for i in range(50)],  # the same again
    ]
    results = []
    for listing in listings:
        known.start()
        got: list[Any] = []
        for number, at in enumerate(range(0, 50, 20)):
            cursor = str(number + 1) if at + 20 < 50 else None
            got.extend(
                known.decode(encoded("tools", listing[at : at + 20], cursor, "compact"), "tools")[
                    "tools"
                ]
            )
        listed = tuple(got)
        known.finish(listed)
        results.append((listed, known.kept(listed)))
    assert results[0][1] is None  # nothing before it
    assert results[1][1] == (results[0][0], 23, 26)
    assert results[2][1] == (results[1][0], 50, 0)


def test_a_change_at_the_end_reuses_every_item_before_it() -> None:
    known = KnownItems()
    before = [tool(f"t{i}") for i in range(50)]
    known.start()
    old = known.decode(page("tools", before), "tools")["tools"]
    known.finish(tuple(old))
    cases = [
        ([*before, tool("new")], 50),  # one added
        ([*before[:-1], tool("t49", "changed")], 49),
        (before[:-1], 49),  # one removed
    ]
    for after, same in cases:
        known.start()
        new = known.decode(page("tools", after), "tools")["tools"]
        assert list(new) == after
        assert all(new[i] is old[i] for i in range(same))
        assert len(known.fresh) == len(after) - same
        known.start()  # (not finished: the next one compares with the first listing again)


def test_a_change_in_the_middle_reuses_the_items_on_both_sides() -> None:
    known = KnownItems()
    before = [tool(f"t{i}") for i in range(50)]
    known.start()
    old = known.decode(page("tools", before), "tools")["tools"]
    known.finish(tuple(old))
    after = [*before[:20], tool("x"), tool("t21", "changed"), *before[22:]]
    known.start()
    new = known.decode(page("tools", after), "tools")["tools"]
    assert list(new) == after
    assert all(new[i] is old[i] for i in [*range(20), *range(22, 50)])
    assert known.fresh == [new[20], new[21]]


def test_a_number_that_grew_is_not_taken_for_the_one_before() -> None:
    # "12" is a prefix of "123": the common start must end past an item's last byte.
    known = KnownItems()
    for listed in ([1, 12], [1, 123], [1, 123, 4], [1, 12, 4]):
        known.start()
        assert list(known.decode(page("tools", listed), "tools")["tools"]) == listed
        known.finish(())


def test_an_unchanged_end_that_moved_out_of_the_list_is_not_taken_for_its_items() -> None:
    # The same bytes at the end, but now the items of another field: not the list's.
    known = KnownItems()
    a, b, c, x = (msgspec.json.encode(tool(n)).decode() for n in "abcx")
    known.start()
    first = known.decode(msgspec.Raw(f'{{"tools":[{a},{b},{c},{x}]}}'.encode()), "tools")
    known.finish(tuple(first["tools"]))
    known.start()
    moved = known.decode(msgspec.Raw(f'{{"tools":[{a},{b}],"o":[{c},{x}]}}'.encode()), "tools")
    assert list(moved["tools"]) == [tool("a"), tool("b")]


def test_a_listing_is_encoded_as_its_pages_bytes_only_when_every_item_was_kept() -> None:
    known = KnownItems()
    listed = [tool("a"), tool("b"), tool("c")]
    known.start()
    got: list[Any] = []
    for number, part in enumerate([listed[:2], listed[2:]]):
        cursor = "next" if number == 0 else None
        got.extend(known.decode(encoded("tools", part, cursor, "spaced"), "tools")["tools"])
    accepted = tuple(got)
    known.finish(accepted)
    raw = known.encoded(accepted)
    assert raw is not None and msgspec.json.decode(raw) == listed
    assert known.encoded(tuple(listed)) is None  # not that listing's items
    known.start()
    again = known.decode(page("tools", [tool("a"), {"nameless": 1}]), "tools")["tools"]
    known.finish((again[0],))
    assert known.encoded((again[0],)) is None  # an item was left out: not the pages' bytes


@given(
    old=st.lists(st.integers(0, 1000), max_size=12),
    bounds=st.tuples(st.integers(0, 12), st.integers(0, 12)),
    middle=st.lists(st.integers(0, 1000), max_size=4),
    shift=st.integers(-50, 50),
)
def test_a_spliced_page_list_is_the_concatenation_it_replaces(
    old: list[int], bounds: tuple[int, int], middle: list[int], shift: int
) -> None:
    """`spliced` gives what slicing and concatenating gave,
    and `_moved` (offsets) the same with the items after moved by `shift`; neither changes
    what it was given (the last listing's page stays whole until the next one completes)."""
    first = min(bounds[0], len(old))
    last = max(first, min(bounds[1], len(old)))
    expected = old[:first] + middle + [x + shift for x in old[last:]]
    offsets = array("q", old)
    assert list(_moved(offsets, first, last, array("q", middle), shift)) == expected
    assert list(offsets) == old
    assert spliced(tuple(old), first, last, tuple(middle)) == tuple(
        old[:first] + middle + old[last:]
    )


@given(
    st.binary(max_size=64),
    st.integers(min_value=0, max_value=5),
    st.binary(max_size=8),
    st.binary(max_size=8),
)
def test_the_common_prefix_is_the_longest_shared_start_at_any_block_size(
    start: bytes, blocks: int, rest_a: bytes, rest_b: bytes
) -> None:
    # With _BLOCK at 16 KB, starts of several blocks (the doubling steps) and of none.
    shared = start * (1 + blocks * _reuse._BLOCK // max(len(start), 1)) if start else b""
    a, b = shared + rest_a, shared + rest_b
    naive = 0
    while naive < min(len(a), len(b)) and a[naive] == b[naive]:
        naive += 1
    assert _reuse._common_prefix(a, b) == naive


def test_a_page_whose_items_text_is_also_elsewhere_keeps_its_encodings_to_reuse_by() -> None:
    """When the items' array text is found twice in the page, nothing tells which is the list:
    the page keeps no offsets (it is never compared), only each item's encoding, and the next
    listing still finds its unchanged items by them."""
    listed = [tool("a"), tool("b")]
    inner = msgspec.json.encode(listed)
    twice = msgspec.Raw(b'{"tools":' + inner + b',"also":' + inner + b"}")
    known = KnownItems()
    known.start()
    first = known.decode(twice, "tools")["tools"]
    assert list(first) == listed
    known.finish(tuple(first))
    assert known.encoded(tuple(first)) is None  # no offsets: not the pages' own bytes
    known.start()
    again = known.decode(twice, "tools")["tools"]
    assert list(again) == listed
    assert all(a is b for a, b in zip(again, first, strict=True))
    assert known.fresh == []


SPOOF = {"mcpool/trust": True, "mcpool/alwaysLoad": True, "anthropic/alwaysLoad": True, "v": 1}


def _spoofed(name: str) -> dict[str, Any]:
    return {**tool(name), "_meta": dict(SPOOF)}


def test_every_decoded_item_loses_mcpool_s_own_meta_keys_once() -> None:
    """DESIGN X9, once per entry snapshot: the first listing (split whole), a relist whose
    middle changed (the delta) and a relist after a left-out item (rechecked) all give items
    without the keys; an unchanged item is the object stripped before."""
    known = KnownItems()
    known.start()
    first = known.decode(page("tools", [tool("a"), _spoofed("b"), tool("c")]), "tools")["tools"]
    known.finish(tuple(first))
    assert [t.get("_meta") for t in first] == [None, {"v": 1}, None]
    known.start()
    listed = [tool("a"), _spoofed("b"), _spoofed("new"), tool("c")]
    second = known.decode(page("tools", listed), "tools")["tools"]
    assert second[1] is first[1]  # unchanged: not decoded (nor stripped) again
    assert second[2]["_meta"] == {"v": 1}
    known.finish((second[0], second[1], second[3]))  # "new" left out by the pool
    known.start()
    third = known.decode(page("tools", listed), "tools")["tools"]
    assert third[2] is not second[2] and third[2]["_meta"] == {"v": 1}  # rechecked: again
