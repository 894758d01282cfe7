"""Cursors that name their list (session/_cursors.py)."""

from __future__ import annotations

import pytest

from mcpool.session._cursors import CursorBook, CursorError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_walk_continues_on_the_list_it_began_on() -> None:
    book: CursorBook[tuple[str, ...]] = CursorBook(Clock())
    first = ("a1", "a2", "a3", "a4")
    cursor = book.cursor(first, 2)
    changed = ("b1", "b2", "b3", "b4", "b5")
    book.cursor(changed, 2)  # the list changed meanwhile; another walk begins on it
    served, offset, _ = book.page(cursor)
    assert served is first and offset == 2  # never b3.., never a skip
    # The same list at another boundary keeps one entry.
    book.cursor(first, 4)
    assert book.statistics()["lists"] == 2


@pytest.mark.parametrize("bad", ["", "x", "Yzox", "c:1:2", 12, None, "A" * 1000])
def test_what_the_book_never_issued_is_refused(bad: object) -> None:
    book: CursorBook[tuple[str, ...]] = CursorBook(Clock())
    with pytest.raises(CursorError, match="cursor"):
        book.page(bad)


def test_lists_are_kept_within_bounds_and_then_listed_again() -> None:
    clock = Clock()
    book: CursorBook[tuple[int, ...]] = CursorBook(clock, max_lists=2, ttl=10.0)
    lists = [(n,) for n in range(3)]
    cursors = [book.cursor(served, 1) for served in lists]
    with pytest.raises(CursorError, match="list again"):
        book.page(cursors[0])  # pushed out by newer lists
    assert book.page(cursors[2])[0] is lists[2]
    clock.now = 11.0
    with pytest.raises(CursorError, match="changed or expired"):
        book.page(cursors[2])
    stats = book.statistics()
    assert stats["issued"] == 3 and stats["refused"] == 2
