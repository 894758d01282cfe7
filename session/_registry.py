"""A session's aggregated registry, one immutable generation at a time (DESIGN S2-S4).

Theory of operation: a candidate is built completely from the session's views (servers in
settings order, each server's items in upstream order), validated one server's part at a time
(DESIGN S3, S8): upstream names must be non-empty with no surrounding whitespace, and exposed
names unique even compared case-insensitively (a client that folds case would call the wrong
tool). A part that fails is rejected alone, with a `CandidateRejected` naming the server, the
item and the rule, and the server keeps what the previous generation served for it: its last
accepted snapshot projected through the current policy, else its previous part narrowed by the
current filters, else nothing; every other server's part, policy changes included, is
published. Parts that did not change claim their names first, so a server that newly takes a
name another server already serves is the one rejected; among new parts, the later server in
settings order is. Comparison between generations is canonical per list kind: each kind's items
keyed by exposed name (or URI), canonicalised per S4, so a pure reorder or a reordered `required`
array is no change, while a reordered `default` array is.
"""

from __future__ import annotations

import itertools
import operator
import re
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from mcpool.pool import spliced
from mcpool.protocol import ByteTable

from ._canoncache import canonical_of
from ._changes import change_set
from ._interner import UNSHARED, Interner
from ._tables import patched_by, whole
from ._view import Projection, predecessor, restrict

if TYPE_CHECKING:
    from mcpool.pool import Snapshot

    from ._view import SessionView

LIST_KINDS = ("tools", "prompts", "resources")


class CandidateRejected(Exception):
    """Why one server's part of a candidate was rejected, and what it serves instead."""

    def __init__(self, server: str, item: str, rule: str) -> None:
        super().__init__(f"server '{server}': {item!r} {rule}")
        self.server = server
        self.item = item
        self.rule = rule
        self.outcome = ""  # set by build_candidate: what the server serves instead

    def describe(self) -> str:
        return f"{self}; {self.outcome}" if self.outcome else str(self)


class Route(NamedTuple):
    view: SessionView
    upstream_name: str


_new_route = tuple.__new__


_Routes = Mapping[str, tuple[int, str]]  # exposed name -> (view index, upstream name)


class Aggregate:
    """The served lists, routes and canonical form of one sequence of projections.

    Shared by every session whose views project the same snapshots through the same policies
    under the same names (the common case: many windows, one settings file), so a thousand
    such sessions hold one aggregate, not a thousand. Routes name views by index; each
    session's `RegistryGeneration` resolves the index through its own views.
    """

    __slots__ = (
        "__weakref__",
        "canonical",
        "encoded",
        "moves",
        "projections",
        "prompt_routes",
        "prompts",
        "resource_routes",
        "resource_templates",
        "resources",
        "template_routes",
        "tool_routes",
        "tools",
    )

    def __init__(self) -> None:
        self.projections: tuple[Projection, ...] = ()  # keeps the cache key's objects alive
        self.tools: tuple[dict[str, Any], ...] = ()
        self.prompts: tuple[dict[str, Any], ...] = ()
        self.resources: tuple[dict[str, Any], ...] = ()
        self.resource_templates: tuple[dict[str, Any], ...] = ()
        # exposed -> (view index, upstream). A table made from the last relist's reads through
        # it (session/_tables.py) until the first call after the change makes it a dict
        # (`whole_tool_routes`): not at the change, in the pass every session waits on.
        self.tool_routes: _Routes = {}
        # (A prompt part is never made from the one before: its routes are a dict.)
        self.prompt_routes: dict[str, tuple[int, str]] = {}
        self.resource_routes: dict[str, int] = {}
        self.template_routes: tuple[tuple[re.Pattern[str], str, int], ...] = ()
        # Per list kind: key (exposed name or URI) -> canonical bytes; equal tables (in any
        # order) <=> canonically equal (S4). (A table may read through an older one's:
        # session/_tables.py.)
        self.canonical: dict[str, Mapping[str, bytes]] = {}
        # Encoded pages, keyed by (kind, modern era, page size, offset, the number of the list
        # their next cursor names), filled lazily by
        # sessions (a cache, not state).
        self.encoded: dict[tuple[str, bool, int, int, int], bytes] = {}
        # How sessions moved from here to their next candidates (build_candidate; a cache).
        self.moves: dict[Any, Any] = {}

    def whole_tool_routes(self) -> dict[str, tuple[int, str]]:
        """`tool_routes` as a dict, made one the first time it is asked for (one copy)."""
        routes = self.tool_routes
        if routes.__class__ is not dict:
            routes = self.tool_routes = whole(routes)
        return routes


def _empty_aggregate() -> Aggregate:
    agg = Aggregate()
    agg.canonical = {k: {} for k in LIST_KINDS}
    return agg


_EMPTY = _empty_aggregate()


class RegistryGeneration(msgspec.Struct, eq=False):
    """One session's registry at one moment: its views and the (shared) aggregate they make.

    Immutable by convention: built once by `build_candidate`, never modified afterwards. A
    Struct: built in C, with no Python frame (one per session per change: 200 sessions, 200
    times); `eq=False`: compared by identity.
    """

    agg: Aggregate = _EMPTY
    views: tuple[SessionView, ...] = ()
    number: int = 0
    settings_generation: int = 0
    # Per view: the snapshot its served part was projected from (None: it serves nothing),
    # what a later rejection of that server falls back to.
    good: tuple[Snapshot | None, ...] = ()
    # The server parts rejected while building this generation (each serves its fallback).
    rejected: tuple[CandidateRejected, ...] = ()
    # The kinds changed from the generation it was built from (`build_candidate`'s `previous`;
    # None without one): `changed_kinds` of that one, worked out once per move.
    changed: tuple[str, ...] | None = None

    # The served lists and caches are the aggregate's.
    @property
    def tools(self) -> tuple[dict[str, Any], ...]:
        return self.agg.tools

    @property
    def prompts(self) -> tuple[dict[str, Any], ...]:
        return self.agg.prompts

    @property
    def resources(self) -> tuple[dict[str, Any], ...]:
        return self.agg.resources

    @property
    def resource_templates(self) -> tuple[dict[str, Any], ...]:
        return self.agg.resource_templates

    @property
    def canonical(self) -> dict[str, Mapping[str, bytes]]:
        return self.agg.canonical

    @property
    def encoded(self) -> dict[tuple[str, bool, int, int, int], bytes]:
        return self.agg.encoded

    # Lookups on the hot path.
    def tool_route(self, exposed: str) -> Route | None:
        routes = self.agg.tool_routes
        hit = (routes if routes.__class__ is dict else self.agg.whole_tool_routes()).get(exposed)
        # tuple.__new__ is what Route(...) runs, without its Python-level __new__ (every call).
        return _new_route(Route, (self.views[hit[0]], hit[1])) if hit is not None else None

    def prompt_route(self, exposed: str) -> Route | None:
        hit = self.agg.prompt_routes.get(exposed)
        return Route(self.views[hit[0]], hit[1]) if hit is not None else None

    def resource_view(self, uri: str) -> SessionView | None:
        index = self.agg.resource_routes.get(uri)
        if index is not None:
            return self.views[index]
        for pattern, template, tindex in self.agg.template_routes:
            if template == uri or pattern.match(uri):
                return self.views[tindex]
        return None

    # Whole tables, for daemonctl and tests (built on demand, not kept).
    @property
    def tool_routes(self) -> dict[str, Route]:
        return {e: Route(self.views[i], u) for e, (i, u) in self.agg.whole_tool_routes().items()}

    @property
    def prompt_routes(self) -> dict[str, Route]:
        return {e: Route(self.views[i], u) for e, (i, u) in self.agg.prompt_routes.items()}

    @property
    def resource_routes(self) -> dict[str, SessionView]:
        return {uri: self.views[i] for uri, i in self.agg.resource_routes.items()}

    @property
    def template_routes(self) -> tuple[tuple[re.Pattern[str], str, SessionView], ...]:
        return tuple((p, t, self.views[i]) for p, t, i in self.agg.template_routes)

    def changed_kinds(self, previous: RegistryGeneration) -> list[str]:
        if self.agg is previous.agg:
            return []
        # Once per pair of aggregates, however many sessions make the same move.
        return list(change_set(previous.agg, self.agg, LIST_KINDS))

    def instructions(self) -> str | None:
        parts = []
        for view in self.views:
            text = view.projection().instructions
            if text:
                parts.append(f"## {view.name}\n{text.strip()}")
        return "\n\n".join(parts) if parts else None


# Canonical bytes of a projection's items, per kind and key, computed once however many sessions
# serve the same projection (projections are shared and immutable; the cache dies with them).
_projection_canonical: weakref.WeakKeyDictionary[Projection, dict[str, Mapping[str, bytes]]] = (
    weakref.WeakKeyDictionary()
)


_Item = tuple[str, str, dict[str, Any]]  # a projected item: (exposed, upstream, served)

# Per projection whose tools' canonical table was patched from its predecessor's: that one, and
# whether the two tables are equal (told by the middle alone; `change_set` then compares no
# 5,000-entry tables).
_tools_same: weakref.WeakKeyDictionary[Projection, tuple[weakref.ref[Projection], bool]] = (
    weakref.WeakKeyDictionary()
)


def projection_canonical(proj: Projection, table: ByteTable) -> dict[str, Mapping[str, bytes]]:
    found = _projection_canonical.get(proj)
    if found is None:
        # Clones shared with the projection this one was made from keep their bytes.
        link = predecessor(proj)
        known = _projection_canonical.get(link[0]) if link is not None else None
        tools: Mapping[str, bytes] | None = None
        if link is not None and known is not None:
            before, head, tail = link
            old = known["tools"]
            kept = {id(t) for t in before.tools[head : len(before.tools) - tail]}
            tools = _patched(
                proj.tools,
                before.tools,
                head,
                tail,
                old,
                lambda t: old[t[0]] if id(t) in kept else canonical_of(t[2], table),
            )
            if tools is not None:
                # The rest of both tables is one copy: equal when the middles' entries are.
                gone = {t[0]: old[t[0]] for t in before.tools[head : len(before.tools) - tail]}
                came = {t[0]: tools[t[0]] for t in proj.tools[head : len(proj.tools) - tail]}
                _tools_same[proj] = (weakref.ref(before), gone == came)
        if tools is None:
            tools = {exposed: canonical_of(t, table) for exposed, _, t in proj.tools}
        if (
            link is not None
            and known is not None
            and link[0].prompts is proj.prompts
            and link[0].resources is proj.resources
            and link[0].resource_templates is proj.resource_templates
        ):
            found = {**known, "tools": tools}  # only the tools were listed again
        else:
            found = {
                "tools": tools,
                "prompts": {exposed: canonical_of(p, table) for exposed, _, p in proj.prompts},
                "resources": {
                    **{
                        r["uri"]: canonical_of(r, table)
                        for r in proj.resources
                        if isinstance(r.get("uri"), str)
                    },
                    **{
                        "template:" + t["uriTemplate"]: canonical_of(t, table)
                        for t in proj.resource_templates
                        if isinstance(t.get("uriTemplate"), str)
                    },
                },
            }
        _projection_canonical[proj] = found
    return found


def _patched(
    items: tuple[_Item, ...],
    before: tuple[_Item, ...],
    head: int,
    tail: int,
    table: Mapping[str, Any],
    value: Callable[[_Item], Any],
    key: Callable[[str], str] | None = None,
) -> Mapping[str, Any] | None:
    """`table` (one entry per item of `before`, by exposed name, or by `key` of it) for
    `items`, which start with `head` and end with `tail` of the very items of `before`: the
    middle's entries replaced by `value` of each new middle item, as a table that reads through
    `table` (session/_tables.py: the 5,000 unchanged entries are not copied until something
    asks for it whole, `whole`). None when the names do not come out one per item (the caller
    then computes the table whole)."""
    if len(table) != len(before):
        return None
    return patched_by(
        table,
        before[head : len(before) - tail],
        items[head : len(items) - tail],
        _first if key is None else (lambda t: key(t[0])),
        value,
        len(items),
    )


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_third = operator.itemgetter(2)


def _name_rule(name: str, kind: str) -> str | None:
    if not name:
        return f"has an empty {kind} name"
    if name != name.strip():
        return f"{kind} name has leading or trailing whitespace"
    return None


def template_pattern(template: str) -> re.Pattern[str]:
    """An RFC 6570 level-1 template as a regex: each {var} matches one or more characters."""
    out = []
    for part in re.split(r"(\{[^}]*\})", template):
        if part.startswith("{") and part.endswith("}"):
            out.append(".+" if part[1:2] in "+#/" else "[^/]+")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out) + r"\Z")


# Per the parts' projections (by id: alive while the aggregate holds them), names and prefixes.
AggregateKey = tuple[tuple[int, str, bool], ...]


# A part that serves nothing: a server whose every option was rejected.
_NOTHING = Projection(
    generation=0,
    available=False,
    tools=(),
    prompts=(),
    hidden_tools=(),
    resources=(),
    resource_templates=(),
    instructions=None,
    capabilities={},
)


# Outcomes of building a candidate, per move: the same views moving from the same aggregate to
# the same snapshots make the same choices, so a relist shared by 200 sessions validates (an
# O(items) pass) once, not 200 times. Kept on the previous aggregate (`Aggregate.moves`): it dies
# with it, and it never points back at older aggregates. A few moves per aggregate (sessions with
# different budgets or policies); past that the table starts again.
MAX_MOVES = 16

# The views' fresh projections, in view order. A projection is made for one entry, snapshot,
# policy, server name, prefix and budget (`shared_projection`), and compares by identity, so the
# tuple stands for all of them.
_MoveKey = tuple[Projection, ...]


class _Move(NamedTuple):
    """One move's outcome. It depends on the fresh projections (the key), on what each view
    served before (the aggregate the cache belongs to) and, only when a part is rejected, on
    the snapshots those parts were accepted from (`before`): a rejected part falls back to its
    last accepted snapshot. A move without rejections chose every fresh part, whatever was
    served before, since names that clash in no order clash in none (`_choose`)."""

    chosen: tuple[tuple[Projection, Snapshot | None], ...]
    rejected: tuple[tuple[int, CandidateRejected], ...]
    pins: tuple[Any, ...] = ()  # the objects whose ids `before` holds, alive while it is kept
    agg: Aggregate | None = None  # what the chosen parts make
    changes: tuple[str, ...] = ()  # the kinds changed from the previous aggregate to `agg`
    # `chosen`'s snapshots and `rejected`'s rejections, as a generation holds them.
    good: tuple[Snapshot | None, ...] = ()
    rejections: tuple[CandidateRejected, ...] = ()
    # Ids of the previous generation's good snapshots, which a move with rejections depends on.
    before: tuple[int, ...] = ()


def build_candidate(
    views: list[SessionView],
    *,
    number: int,
    settings_generation: int,
    previous: RegistryGeneration | None = None,
    fresh: list[tuple[Projection, Snapshot]] | None = None,
    interner: Interner = UNSHARED,
) -> RegistryGeneration:
    """A complete, validated candidate for `views`, one server's part at a time (S3, S8).

    A rejected part is listed in `rejected` and replaced by its fallback from `previous` (the
    generation being served): the server's last accepted snapshot through the current policy,
    else its previous part narrowed by the current filters, else nothing. `fresh`: each
    view's `fresh_part()`, when the caller has them already.
    """
    if fresh is None:
        fresh = [view.fresh_part() for view in views]
    held = tuple(views)
    if previous is not None:
        fresh_projections = tuple(map(_first, fresh))
        found = followed(previous, held, fresh_projections, number, settings_generation)
        if found is not None:
            return found
        move_key = _move_key(previous, held, fresh_projections)
    else:
        move_key = None
    before = {id(v): i for i, v in enumerate(previous.views)} if previous is not None else {}
    served: list[tuple[Projection, Snapshot | None] | None] = []
    for view in views:
        i = before.get(id(view))
        served.append(
            None
            if i is None or previous is None
            else (
                previous.agg.projections[i],
                previous.good[i] if i < len(previous.good) else None,
            )
        )
    move = _choose(views, fresh, served, interner)
    projections = [proj for proj, _ in move.chosen]
    # Ids are stable while the aggregate (which holds the projections) is alive in the cache.
    key = tuple((id(p), v.name, v.prefix) for p, v in zip(projections, views, strict=True))
    agg = interner.aggregates.get(key)
    if agg is None:
        agg = interner.aggregates.put(key, _build_aggregate(views, projections, interner))
    changes = (
        ()
        if previous is None
        else change_set(previous.agg, agg, LIST_KINDS, _known_same(previous.agg, agg))
    )
    move = move._replace(
        agg=agg,
        changes=changes,
        good=tuple(source for _, source in move.chosen),
        rejections=tuple(r for _, r in move.rejected),
    )
    if move_key is not None and previous is not None:
        moves = previous.agg.moves
        if len(moves) >= MAX_MOVES:
            moves.clear()
        moves[move_key] = move._replace(pins=(fresh, served), before=tuple(map(id, previous.good)))
    assert move.agg is not None
    return RegistryGeneration(
        move.agg,
        held,
        number=number,
        settings_generation=settings_generation,
        good=move.good,
        rejected=move.rejections,
        changed=None if previous is None else move.changes,
    )


def _move_key(
    previous: RegistryGeneration, views: tuple[SessionView, ...], projections: _MoveKey
) -> _MoveKey | None:
    """The key of `previous`'s move cache for `views` projected now as `projections`; None
    unless they are the views `previous` served (a relist, the common move: view i served part
    i, of the aggregate whose moves these are, so the key need not name it)."""
    if not previous.views or previous.views != views:
        return None
    return projections


def followed(
    previous: RegistryGeneration,
    views: tuple[SessionView, ...],
    projections: _MoveKey,
    number: int,
    settings_generation: int,
) -> RegistryGeneration | None:
    """`build_candidate`'s candidate when a session made this move before (the move cache);
    None when none did: build it. The second of 200 sessions on one aggregate gets its
    generation here, without `build_candidate`'s general path (issue 17)."""
    key = _move_key(previous, views, projections)
    move = previous.agg.moves.get(key) if key is not None else None
    if move is None or (move.rejected and move.before != tuple(map(id, previous.good))):
        return None
    # (Positional: a class called with keywords builds a dict of them, once per session.)
    return RegistryGeneration(
        move.agg,
        previous.views,
        number,
        settings_generation,
        move.good,
        move.rejections,
        move.changes,
    )


def _known_same(before: Aggregate, after: Aggregate) -> dict[str, bool]:
    """The kinds whose canonical tables are known equal or not without comparing them: the
    tools of one server's aggregate whose table was patched from the one before's."""
    if len(after.projections) != 1 or len(before.projections) != 1:
        return {}
    new, old = after.projections[0], before.projections[0]
    link = _tools_same.get(new)
    mine, theirs = _projection_canonical.get(new), _projection_canonical.get(old)
    if (
        link is None
        or link[0]() is not old
        or mine is None
        or theirs is None
        or after.canonical["tools"] is not mine["tools"]
        or before.canonical["tools"] is not theirs["tools"]
    ):
        return {}
    return {"tools": link[1]}


def _choose(
    views: list[SessionView],
    fresh: list[tuple[Projection, Snapshot]],
    served: list[tuple[Projection, Snapshot | None] | None],
    interner: Interner,
) -> _Move:
    """Each view's part (projection, and the snapshot a later rejection falls back to), and the
    rejections, in view order. Depends only on the views' names, policies and budgets, their
    fresh projections and what each served before (the move key)."""
    # Unchanged parts claim their names first: the server that newly takes a name is rejected.
    stable = [i for i, old in enumerate(served) if old is not None and old[0] is fresh[i][0]]
    settled = set(stable)
    order = stable + [i for i in range(len(views)) if i not in settled]
    claims = _Claims()
    chosen: list[tuple[Projection, Snapshot | None]] = list(fresh)
    rejected: dict[int, CandidateRejected] = {}
    for index in order:
        view = views[index]
        old = served[index]
        first = _claim(views, index, fresh[index][0], claims, last=index == order[-1])
        if first is not None and old is not None and old[0] is not fresh[index][0]:
            # The fallbacks, in order, each built only when what comes before it is rejected.
            part, good = old
            if (
                good is not None
                and _claim(views, index, last := view.projection_of(good), claims) is None
            ):
                chosen[index] = (last, good)
                first.outcome = "its last accepted lists stay served"
            elif (
                _claim(views, index, narrowed := restrict(part, view.key, interner), claims) is None
            ):
                chosen[index] = (narrowed, good)
                first.outcome = "its previous lists stay served, narrowed by the current filters"
            else:
                first.outcome = "it serves nothing until this is fixed"
                chosen[index] = (_NOTHING, good)
        elif first is not None:
            first.outcome = "it serves nothing until this is fixed"
            chosen[index] = (_NOTHING, old[1] if old is not None else None)
        if first is not None:
            rejected[index] = first
    return _Move(tuple(chosen), tuple((i, rejected[i]) for i in sorted(rejected)))


class _OwnNames(NamedTuple):
    """One kind's names of one projection, validated on their own (once per projection)."""

    # casefolded exposed name -> the item (exposed, upstream, served), for the items before
    # `problem` (the first of each name)
    names: Mapping[str, _Item]
    # The first item that breaks a rule on its own (a name rule, or a name the projection
    # already uses): (position, upstream name, rule); None when there is none.
    problem: tuple[int, str, str] | None


_own_names: weakref.WeakKeyDictionary[Projection, tuple[_OwnNames, _OwnNames]] = (
    weakref.WeakKeyDictionary()
)


def own_names(proj: Projection) -> tuple[_OwnNames, _OwnNames]:
    """The projection's tool and prompt names, validated without the other servers: computed
    once per projection however many sessions (and candidates) serve it, and for a projection
    made from a previous one, from that one's names and the items that differ."""
    found = _own_names.get(proj)
    if found is None:
        tools: _OwnNames | None = None
        prompts: _OwnNames | None = None
        link = predecessor(proj)
        known = _own_names.get(link[0]) if link is not None else None
        if link is not None and known is not None:
            before, head, tail = link
            if known[0].problem is None:
                tools = _names_patched(proj.tools, before.tools, head, tail, known[0].names)
            if before.prompts is proj.prompts:
                prompts = known[1]
        found = (
            tools if tools is not None else _validate_own(proj.tools, "tool"),
            prompts if prompts is not None else _validate_own(proj.prompts, "prompt"),
        )
        _own_names[proj] = found
    return found


def _names_patched(
    items: tuple[_Item, ...],
    before: tuple[_Item, ...],
    head: int,
    tail: int,
    names: Mapping[str, _Item],
) -> _OwnNames | None:
    """`before`'s valid names (by folded exposed name), for `items` (see `_patched`): None
    unless every new middle item passes the name rules and takes a name nobody else in `items`
    has (the full pass then finds which item is first to break a rule)."""
    if any(_name_rule(t[1], "tool") is not None for t in items[head : len(items) - tail]):
        return None
    out = _patched(items, before, head, tail, names, _itself, str.casefold)
    return _OwnNames(out, None) if out is not None else None


def _itself(item: _Item) -> _Item:
    return item


def _validate_own(items: tuple[_Item, ...], kind: str) -> _OwnNames:
    # The common case in a few C passes: unique folded names, every name well formed.
    upstreams: list[str] = list(map(_second, items))
    if all(upstreams) and upstreams == list(map(str.strip, upstreams)):
        every = dict(zip(map(str.casefold, map(_first, items)), items, strict=True))
        if len(every) == len(items):
            return _OwnNames(every, None)
    names: dict[str, _Item] = {}
    for position, item in enumerate(items):
        exposed, upstream, _ = item
        rule = _name_rule(upstream, kind)
        folded = exposed.casefold()
        clash = names.get(folded)
        if rule is None and clash is not None:
            rule = _clash_rule(exposed, clash[0], f"its {kind} {clash[1]!r}")
        if rule is not None:
            return _OwnNames(names, (position, upstream, rule))
        names[folded] = item
    return _OwnNames(names, None)


def _clash_rule(exposed: str, other_exposed: str, whose: str) -> str:
    if other_exposed == exposed:
        return f"is exposed as {exposed!r}, which {whose} uses"
    return (
        f"is exposed as {exposed!r}, which differs only in case from "
        f"{other_exposed!r} ({whose}); clients that compare names "
        "case-insensitively would call the wrong one"
    )


class _Claims:
    """Names claimed so far per kind: casefolded exposed name -> (exposed, upstream) and the
    view index that claimed it (kept apart so a projection's names merge in one C call)."""

    __slots__ = ("names", "owners")

    def __init__(self) -> None:
        self.names: dict[str, dict[str, _Item]] = {"tool": {}, "prompt": {}}
        self.owners: dict[str, dict[str, int]] = {"tool": {}, "prompt": {}}


def _claim(
    views: list[SessionView],
    index: int,
    proj: Projection,
    claims: _Claims,
    *,
    last: bool = False,
) -> CandidateRejected | None:
    """Validate view `index`'s part `proj` against the names already claimed; claim its names
    when it passes, change nothing when it does not. The first offending item in list order
    (tools, then prompts) is the one reported."""
    if not proj.available:
        return None  # an entry not up contributes nothing, so it cannot clash
    server = views[index].name
    own = own_names(proj)
    for kind, mine in zip(("tool", "prompt"), own, strict=True):
        claimed = claims.names[kind]
        problem = mine.problem
        taken = whole(mine.names).keys() & claimed.keys() if claimed else ()
        if taken:
            # The first taken name in list order (its first item: `names` keeps the first).
            items = proj.tools if kind == "tool" else proj.prompts
            first_at: dict[int, int] = {}
            for i, item in enumerate(items):
                first_at.setdefault(id(item), i)
            folded = min(taken, key=lambda f: first_at[id(mine.names[f])])
            position = first_at[id(mine.names[folded])]
            exposed, upstream, _ = mine.names[folded]
            if problem is None or position < problem[0]:
                other = views[claims.owners[kind][folded]].name
                other_exposed = claimed[folded][0]
                rule = _clash_rule(exposed, other_exposed, f"server '{other}'")
                return CandidateRejected(server, upstream, rule)
        if problem is not None:
            return CandidateRejected(server, problem[1], problem[2])
    if last:
        return None  # nobody claims after it: its names need not be recorded
    for kind, mine in zip(("tool", "prompt"), own, strict=True):
        names = whole(mine.names)
        claims.names[kind].update(names)
        claims.owners[kind].update(dict.fromkeys(names, index))
    return None


def _build_aggregate(
    views: list[SessionView], projections: list[Projection], interner: Interner
) -> Aggregate:
    agg = Aggregate()
    agg.projections = tuple(projections)
    tools: list[dict[str, Any]] = []
    prompts: list[dict[str, Any]] = []
    resources: list[dict[str, Any]] = []
    templates: list[dict[str, Any]] = []
    tool_routes: _Routes = {}
    prompt_routes: dict[str, tuple[int, str]] = {}
    resource_routes: dict[str, int] = {}
    template_routes: list[tuple[re.Pattern[str], str, int]] = []
    canon: dict[str, Mapping[str, bytes]] = {}
    resources_canon: dict[str, bytes] = {}
    parts: dict[
        str, list[tuple[Mapping[str, tuple[int, str]], tuple[Any, ...], Mapping[str, bytes]]]
    ]
    parts = {"tools": [], "prompts": []}
    for index, proj in enumerate(projections):
        if not proj.available:
            continue
        pc = projection_canonical(proj, interner.canonical)
        for kind in ("tools", "prompts"):
            parts[kind].append((*_part_tables(proj, index, kind), pc[kind]))
        for res in proj.resources:
            uri = res.get("uri")
            if isinstance(uri, str) and uri not in resource_routes:
                resource_routes[uri] = index
                resources.append(res)
                resources_canon[uri] = pc["resources"][uri]
        for tpl in proj.resource_templates:
            uri_t = tpl.get("uriTemplate")
            if isinstance(uri_t, str):
                template_routes.append((template_pattern(uri_t), uri_t, index))
                templates.append(tpl)
                resources_canon["template:" + uri_t] = pc["resources"]["template:" + uri_t]
    # Names are unique across the parts (`_claim`): each part's tables merge whole, and one
    # part's are the aggregate's (shared, never modified).
    if len(parts["tools"]) == 1:
        tool_routes, agg.tools, canon["tools"] = parts["tools"][0]
    else:
        tools_canon: dict[str, bytes] = {}
        merged_tools: dict[str, tuple[int, str]] = {}
        for routes, served, part_canon in parts["tools"]:
            merged_tools.update(whole(routes))
            tools.extend(served)
            tools_canon.update(whole(part_canon))
        agg.tools = tuple(tools)
        tool_routes = merged_tools
        canon["tools"] = tools_canon
    if len(parts["prompts"]) == 1:
        routes, agg.prompts, canon["prompts"] = parts["prompts"][0]
        prompt_routes = whole(routes)  # (a dict already: see `Aggregate.prompt_routes`)
    else:
        prompts_canon: dict[str, bytes] = {}
        for routes, served, part_canon in parts["prompts"]:
            prompt_routes.update(whole(routes))
            prompts.extend(served)
            prompts_canon.update(whole(part_canon))
        agg.prompts = tuple(prompts)
        canon["prompts"] = prompts_canon
    canon["resources"] = resources_canon
    agg.resources = tuple(resources)
    agg.resource_templates = tuple(templates)
    agg.tool_routes = tool_routes
    agg.prompt_routes = prompt_routes
    agg.resource_routes = resource_routes
    agg.template_routes = tuple(template_routes)
    agg.canonical = canon
    return agg


# Per projection, per view index and kind: its routes (exposed -> (view index, upstream)) and
# served items, what an aggregate of it merges in (a projection made from a previous one derives
# both from that one's: one C copy, then its middle).
_PartTables = tuple[_Routes, tuple[dict[str, Any], ...]]
_part_tables_of: weakref.WeakKeyDictionary[Projection, dict[tuple[int, str], _PartTables]] = (
    weakref.WeakKeyDictionary()
)


def _part_tables(proj: Projection, index: int, kind: str) -> _PartTables:
    tables = _part_tables_of.get(proj)
    if tables is None:
        tables = _part_tables_of[proj] = {}
    found = tables.get((index, kind))
    if found is not None:
        return found
    items: tuple[_Item, ...] = proj.tools if kind == "tools" else proj.prompts
    routes: Mapping[str, tuple[int, str]] | None = None
    served: tuple[dict[str, Any], ...] | None = None
    link = predecessor(proj) if kind == "tools" else None
    known = _part_tables_of.get(link[0], {}).get((index, kind)) if link is not None else None
    if link is not None and known is not None:
        before, head, tail = link
        # (Read through until a call asks for them: `Aggregate.whole_tool_routes`.)
        routes = _patched(items, before.tools, head, tail, known[0], lambda t: (index, t[1]))
        old_served = known[1]
        middle = items[head : len(items) - tail]
        served = spliced(old_served, head, len(old_served) - tail, tuple(map(_third, middle)))
    if routes is None or served is None:
        pairs = zip(itertools.repeat(index, len(items)), map(_second, items), strict=True)
        routes = dict(zip(map(_first, items), pairs, strict=True))
        served = tuple(map(_third, items))
    found = tables[(index, kind)] = (routes, served)
    return found


def empty_generation() -> RegistryGeneration:
    return RegistryGeneration()
