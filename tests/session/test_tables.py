"""Tables that read through the table they were made from (session/_tables.py, issue 17): a chain
of patches must read exactly as the dicts copied and patched at each step would."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from mcpool.session._tables import MAX_DEPTH, PatchedTable, patched, whole

keys = st.sampled_from([f"k{i}" for i in range(12)])
steps = st.lists(
    st.tuples(st.lists(keys, max_size=4), st.dictionaries(keys, st.integers(), max_size=4)),
    max_size=3 * MAX_DEPTH,
)


@given(st.dictionaries(keys, st.integers()), steps, keys)
def test_a_chain_of_patches_reads_as_the_dicts_patched_by_copy(
    start: dict[str, int], patches: list[tuple[list[str], dict[str, int]]], probe: str
) -> None:
    table: Mapping[str, int] = start
    expected = dict(start)
    for gone, came in patches:
        copied = dict(expected)
        for key in gone:
            copied.pop(key, None)
        copied.update(came)
        # Asked for any other size, there is no table: the caller computes it whole.
        assert patched(table, gone, came.items(), len(copied) + 1) is None
        made = patched(table, gone, came.items(), len(copied))
        assert made is not None
        table, expected = made, copied
        assert len(table) == len(expected)
        assert table.get(probe, -1) == expected.get(probe, -1)
        assert (probe in table) == (probe in expected)
        assert all(table[key] == value for key, value in expected.items())
    assert table == expected
    assert expected == table  # (a dict on the left: the table's own comparison answers)
    assert whole(table) == expected
    assert dict(table.items()) == expected


def test_a_lookup_walks_at_most_max_depth_tables() -> None:
    """Past `MAX_DEPTH` tables to read through, the next one is made whole (one copy), so no
    chain grows without bound however many relists come."""
    table: Mapping[str, int] = {f"k{i}": i for i in range(100)}
    for step in range(3 * MAX_DEPTH):
        made = patched(table, [f"k{step}"], [(f"k{step}", -step)], 100)
        assert isinstance(made, PatchedTable)
        assert made._depth <= MAX_DEPTH
        table = made
    assert whole(table) == {f"k{i}": (-i if i < 3 * MAX_DEPTH else i) for i in range(100)}


def test_a_table_made_whole_keeps_its_answers_and_lets_its_chain_go() -> None:
    base = {"a": 1, "b": 2}
    table = patched(base, ["a"], [("c", 3)], 2)
    assert isinstance(table, PatchedTable)
    assert table.whole() == {"b": 2, "c": 3}
    assert table._base is table.whole()  # (the dict it read through is no longer held)
    assert table.get("a") is None and table["c"] == 3 and len(table) == 2
    assert base == {"a": 1, "b": 2}  # the table it was made from is unchanged


def test_a_table_made_whole_copies_once_not_once_per_table_it_reads_through() -> None:
    """Made whole, a table copies the nearest whole table once and applies the patches since
    in order; the tables between stay as they were (no copy each)."""
    table: Mapping[str, int] = {f"k{i}": i for i in range(10)}
    chain = []
    for step in range(MAX_DEPTH - 1):
        made = patched(table, [f"k{step}"], [(f"k{step}", 100 + step)], 10)
        assert isinstance(made, PatchedTable)
        chain.append(made)
        table = made
    assert chain[-1].whole() == {f"k{i}": (100 + i if i < MAX_DEPTH - 1 else i) for i in range(10)}
    assert all(t._whole is None for t in chain[:-1])
    assert chain[2]["k2"] == 102 and chain[2]["k3"] == 3
