"""Long list pages split by position instead of decoded whole (issue 17: a 5,100-tool relist
decoded its 530 KB page twice, once for the envelope and once as a page).

An answer of at least `SPLIT_LINE_MIN` bytes to one of the pool's own list requests is cut at
its envelope (`split_result`) and its result handed to the page decoder (pool/_reuse.py).
These tests hold that nothing a whole decode would accept is lost that way, and that nothing it
would refuse gets through: other members, other member orders, blanks, a malformed result.
The upstream is the real `Upstream` code with a list of lines for its wire.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from fakes import LineUpstream

from mcpool.pool import _upstream as upstream_module
from mcpool.pool._pool import list_all
from mcpool.pool._reuse import KnownItems
from mcpool.pool._upstream import SPLIT_LINE_MIN
from mcpool.protocol import McpoolError

# Enough tools for a page over SPLIT_LINE_MIN.
TOOLS = [
    {"name": f"tool_{i}", "description": f"Tool {i}.", "inputSchema": {"type": "object"}}
    for i in range(600)
]


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def listing(up: LineUpstream, answer: Any, known: KnownItems | None = None) -> Any:
    """Run `list_all` for tools/list and answer its request with `answer(uid)` (one line)."""
    got: list[Any] = []

    async def run() -> None:
        try:
            got.append(await list_all(up, "tools/list", "tools", 5.0, [], known or KnownItems()))
        except McpoolError as exc:
            got.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.testing.wait_all_tasks_blocked()
            uid = json.loads(up.lines[-1])["id"]
            up._dispatch(answer(uid))
    return got[0]


@pytest.fixture
def whole_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The lines `_dispatch` decoded whole."""
    seen: list[bytes] = []
    real = upstream_module.decode_unchecked

    def counting(line: bytes) -> Any:
        seen.append(line)
        return real(line)

    monkeypatch.setattr(upstream_module, "decode_unchecked", counting)
    return seen


def python_order(uid: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"result":%b}' % (uid, compact({"tools": TOOLS}))


def typescript_order(uid: int) -> bytes:
    return b'{"result":%b,"jsonrpc":"2.0","id":%d}' % (compact({"tools": TOOLS}), uid)


@pytest.mark.parametrize("answer", [python_order, typescript_order])
async def test_a_long_page_in_either_sdks_member_order_is_split_not_decoded_whole(
    answer: Any, whole_decodes: list[bytes]
) -> None:
    up = LineUpstream()
    assert len(answer(1)) >= SPLIT_LINE_MIN
    assert list(await listing(up, answer)) == TOOLS
    assert whole_decodes == []
    # A relist of the same page goes the same way, through the page delta.
    known = KnownItems()
    await listing(up, answer, known)
    assert list(await listing(up, answer, known)) == TOOLS
    assert whole_decodes == []


async def test_a_short_page_is_decoded_as_any_answer(whole_decodes: list[bytes]) -> None:
    up = LineUpstream()
    small = TOOLS[:3]
    result = await listing(
        up, lambda uid: b'{"jsonrpc":"2.0","id":%d,"result":%b}' % (uid, compact({"tools": small}))
    )
    assert list(result) == small
    assert len(whole_decodes) == 1


@pytest.mark.parametrize(
    "answer",
    [
        # Another member after the result: the cut result is not one value.
        lambda uid: python_order(uid)[:-1] + b',"extra":{"a":[1,2]}}',
        # Blanks between the members: not split at all.
        lambda uid: (
            b'{"jsonrpc": "2.0", "id": %d, "result": %b}' % (uid, compact({"tools": TOOLS}))
        ),
        # Trailing blanks and a newline.
        lambda uid: python_order(uid) + b"  \r\n",
        # An id written twice: the whole decode says which one counts.
        lambda uid: (
            b'{"result":%b,"jsonrpc":"2.0","id":0,"jsonrpc":"2.0","id":%d}'
            % (compact({"tools": TOOLS}), uid)
        ),
    ],
    ids=["extra-member", "blanks", "trailing-blanks", "id-twice"],
)
async def test_a_long_page_a_whole_decode_accepts_lists_the_same(answer: Any) -> None:
    up = LineUpstream()
    assert list(await listing(up, answer)) == TOOLS


@pytest.mark.parametrize(
    "answer",
    [
        # Not JSON at all past the cut.
        lambda uid: python_order(uid)[:-3] + b"]]}",
        # A result and an error.
        lambda uid: python_order(uid)[:-1] + b',"error":{"code":-1,"message":"no"}}',
    ],
    ids=["malformed", "result-and-error"],
)
async def test_a_long_answer_a_whole_decode_refuses_fails_the_listing_with_its_name(
    answer: Any,
) -> None:
    up = LineUpstream()
    failed = await listing(up, answer)
    assert isinstance(failed, McpoolError)
    assert "server 'srv'" in str(failed) and "tools/list" in str(failed)
    assert "malformed answer to tools/list" in up.stderr_tail[-1]
