"""Session views: one entry's snapshot projected through one session's policy key.

Theory of operation: a `SessionView` belongs to one session and one handle. It captures its
`PolicyKey` (I2: a settings object mutated after it was handed over changes nothing here) and
projects the entry's current snapshot on demand. Projection clones what it changes (the exposed
name and `_meta`); the entry's snapshot stays shared and untouched. Equal inputs give the same
projection object, shared between sessions through a small cache, so a thousand sessions with
the same policy hold one projected list, not a thousand.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from msgspec import Raw, UnsetType

from mcpool.pool import Handle, PoolEntry, Snapshot, spliced
from mcpool.protocol import Message

from ._interner import UNSHARED, Interner
from ._names import MAX_NAME, exposed_name
from ._policy import PolicyKey

if TYPE_CHECKING:
    from mcpool.pool import Upstream


class Projection(msgspec.Struct, frozen=True, weakref=True, eq=False):
    """One snapshot through one policy: served items with their exposed and upstream names."""

    generation: int
    available: bool
    tools: tuple[tuple[str, str, dict[str, Any]], ...]  # (exposed, upstream, served tool)
    prompts: tuple[tuple[str, str, dict[str, Any]], ...]
    hidden_tools: tuple[str, ...]
    resources: tuple[dict[str, Any], ...]
    resource_templates: tuple[dict[str, Any], ...]
    instructions: str | None
    capabilities: dict[str, Any]


# Keyed by the entry object, not its lifecycle id: one key outlives many entries, and a
# replacement entry numbers its snapshots from 1 again, so (lifecycle id, generation) can name two
# different snapshots. The key holds the entry only while some projection of it is alive. The
# tables are the daemon's `Interner`'s (session/_interner.py).
ProjectionKey = tuple[PoolEntry, int, PolicyKey, str, bool, int]


def project(
    snapshot: Snapshot,
    key: PolicyKey,
    server: str,
    *,
    prefix: bool = True,
    budget: int = MAX_NAME,
    previous: Projection | None = None,
    kept: tuple[tuple[Any, ...], int, int] | None = None,
) -> Projection:
    """Pure: filter by the policy and clone each visible tool with its exposed name and _meta.

    `previous`: a projection of an earlier snapshot of the same entry through the same policy
    and names; an item that is the very object it projected (pool/_reuse.py keeps unchanged
    items' objects across relists) keeps its projected clone, so unchanged items stay the same
    objects from end to end (issue 17). `kept`: what the pool knows of `snapshot.tools`
    (`KnownItems.kept`: the list before it, and how many items at its start and end are that
    one's); when that list is the one `previous` projected whole, its ends are not compared
    again."""
    sources = _sources.get(previous) if previous is not None else None
    reuse_prompts: dict[int, tuple[str, str, dict[str, Any]]] = {}
    head = tail = 0  # tools at either end that are the previous projection's, unchanged
    old_tools: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    old_sources: tuple[dict[str, Any], ...] = ()
    if previous is not None and sources is not None:
        old_tools, old_sources = previous.tools, sources[0]
        if kept is not None and kept[0] is old_sources:
            head, tail = kept[1], kept[2]
        else:
            head, tail = common_ends(snapshot.tools, old_sources)
        reuse_prompts = dict(zip(map(id, sources[1]), previous.prompts, strict=True))
    # Only the middle is looked at item by item; its unchanged items still keep their clones.
    middle = snapshot.tools[head : len(snapshot.tools) - tail]
    old_middle = slice(head, len(old_sources) - tail)
    reuse_tools = dict(zip(map(id, old_sources[old_middle]), old_tools[old_middle], strict=True))
    cloned: list[tuple[str, str, dict[str, Any]] | None] = list(
        map(reuse_tools.get, map(id, middle))
    )
    hidden: list[str] = []
    for position in [i for i, hit in enumerate(cloned) if hit is None]:
        tool = middle[position]
        upstream = tool.get("name")
        if not isinstance(upstream, str):
            continue
        if not key.allows(upstream):
            hidden.append(upstream)
            continue
        meta = dict(tool.get("_meta") or {})
        meta["mcpool/server"] = server
        if key.trust is not None:
            meta["mcpool/trust"] = key.trust
        if key.always_load:
            meta["anthropic/alwaysLoad"] = True
            meta["mcpool/alwaysLoad"] = True
        exposed = exposed_name(server, upstream, prefix=prefix, budget=budget)
        cloned[position] = (exposed, upstream, {**tool, "name": exposed, "_meta": meta})
    # (Left None: not a tool, or hidden.)
    end = len(old_tools) - tail
    tools = spliced(old_tools, head, end, tuple(filter(None, cloned)))
    if len(tools) == len(snapshot.tools):
        # Every item projected: the sources are the snapshot's own list (which the pool's
        # `kept` names when it lists the next one).
        tool_sources = snapshot.tools
    else:
        tool_sources = spliced(old_sources, head, end, tuple(itertools.compress(middle, cloned)))
    prompts: list[tuple[str, str, dict[str, Any]]] = []
    prompt_sources: list[dict[str, Any]] = []
    for prompt in snapshot.prompts:
        found = reuse_prompts.get(id(prompt))
        if found is not None:
            prompts.append(found)
            prompt_sources.append(prompt)
            continue
        upstream = prompt.get("name")
        if not isinstance(upstream, str) or not key.allows(upstream):
            continue
        exposed = exposed_name(server, upstream, prefix=prefix, budget=budget)
        prompts.append((exposed, upstream, {**prompt, "name": exposed}))
        prompt_sources.append(prompt)
    prompts_out = tuple(prompts)
    # Unchanged prompts: the same tuple, a cheap test downstream.
    if (
        previous is not None
        and len(prompts_out) == len(previous.prompts)
        and all(map(operator.is_, prompts_out, previous.prompts))
    ):
        prompts_out = previous.prompts
    proj = Projection(
        generation=snapshot.generation,
        available=snapshot.available,
        tools=tools,
        prompts=prompts_out,
        hidden_tools=tuple(hidden),
        resources=snapshot.resources,
        resource_templates=snapshot.resource_templates,
        instructions=snapshot.instructions,
        capabilities=snapshot.capabilities,
    )
    # The source items, in step with `tools` and `prompts` (they keep the ids valid).
    _sources[proj] = (tool_sources, tuple(prompt_sources))
    if previous is not None and sources is not None:
        _predecessors[proj] = (weakref.ref(previous), head, tail)
    return proj


def common_ends(new: Sequence[Any], old: Sequence[Any]) -> tuple[int, int]:
    """How many items at the start and at the end of `new` are the very objects at the same
    ends of `old` (the two never overlap): C passes, no Python work per item."""
    same = list(map(operator.is_, new, old))
    try:
        head = same.index(False)
    except ValueError:
        head = len(same)
    room = min(len(new), len(old)) - head
    same = list(itertools.islice(map(operator.is_, reversed(new), reversed(old)), room))
    try:
        tail = same.index(False)
    except ValueError:
        tail = len(same)
    return head, tail


# Per projection made by `project`: the snapshot items its tools and prompts were cloned from.
_sources: weakref.WeakKeyDictionary[
    Projection, tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]
] = weakref.WeakKeyDictionary()
# Per projection made from a previous one: that one (while it lives), and how many tools at the
# start and at the end of both are the same clones (session/_registry.py then derives canonical
# bytes, names and routes from the previous one's, touching only the middle).
_predecessors: weakref.WeakKeyDictionary[Projection, tuple[weakref.ref[Projection], int, int]] = (
    weakref.WeakKeyDictionary()
)


def predecessor(proj: Projection) -> tuple[Projection, int, int] | None:
    """The projection `proj` was made from (`project`'s `previous`), if it is still alive, and
    the number of tools the two share at the start and at the end."""
    found = _predecessors.get(proj)
    if found is None:
        return None
    before = found[0]()
    return None if before is None else (before, found[1], found[2])


# Per (entry, policy, names): its latest projection, which the next snapshot's builds on.
LatestKey = tuple[PoolEntry, PolicyKey, str, bool, int]


def shared_projection(
    entry: PoolEntry,
    snapshot: Snapshot,
    key: PolicyKey,
    server: str,
    prefix: bool,
    budget: int = MAX_NAME,
    interner: Interner = UNSHARED,
) -> Projection:
    cache_key = (entry, snapshot.generation, key, server, prefix, budget)
    # (The weak dictionary's own `get` is Python: one frame more per view per change.)
    ref = interner.projections.refs.get(cache_key)
    found = ref() if ref is not None else None
    if found is None:
        latest_key = (entry, key, server, prefix, budget)
        previous = interner.latest.get(latest_key)
        listed = entry.known_items.get("tools/list")
        found = project(
            snapshot,
            key,
            server,
            prefix=prefix,
            budget=budget,
            previous=previous,
            kept=listed.kept(snapshot.tools) if listed is not None else None,
        )
        interner.projections.put(cache_key, found)
        if previous is None or previous.generation < found.generation:
            interner.latest.put(latest_key, found)
    return found


def restrict(proj: Projection, key: PolicyKey, interner: Interner = UNSHARED) -> Projection:
    """`proj` without the tools and prompts `key` no longer allows (the projection itself when
    it allows them all): a server's previous lists under the session's current filters. One
    object per (projection, policy) while something serves it (`interner.restricted`), so an
    unchanged fallback is no new part."""
    tools = tuple(t for t in proj.tools if key.allows(t[1]))
    prompts = tuple(p for p in proj.prompts if key.allows(p[1]))
    if len(tools) == len(proj.tools) and len(prompts) == len(proj.prompts):
        return proj
    found = interner.restricted.get((proj, key))
    if found is None:
        hidden = proj.hidden_tools + tuple(t[1] for t in proj.tools if not key.allows(t[1]))
        found = msgspec.structs.replace(proj, tools=tools, prompts=prompts, hidden_tools=hidden)
        interner.restricted.put((proj, key), found)
    return found


class ViewOwner(Protocol):
    """The session, as its views meet it: the names it takes, and where what an upstream sends
    this session goes."""

    @property
    def name_budget(self) -> int: ...

    def views_changed(self, reason: str = "upstream") -> None: ...

    def upstream_notification(
        self, view: SessionView, method: str, params: Raw | UnsetType
    ) -> None: ...

    def server_request(self, view: SessionView, upstream: Upstream, msg: Message) -> str | None:
        """None when the request was taken, else why it cannot be (the upstream answers it
        with an error)."""
        ...


class SessionView:
    """The pool's view callback for one handle, and the session's window on one server."""

    # (`__weakref__`: what a leak hunt, and its test, watches a closed session's views with.)
    __slots__ = (
        "__weakref__",
        "handle",
        "interner",
        "key",
        "name",
        "policy",
        "prefix",
        "session",
        "source",
    )

    def __init__(
        self,
        session: ViewOwner,
        name: str,
        key: PolicyKey,
        *,
        prefix: bool,
        source: str | None,
        interner: Interner = UNSHARED,
    ) -> None:
        self.session = session
        self.interner = interner
        self.name = name
        # `policy`: the key its settings give (what reconciling compares); `key`: the one it
        # serves through, that key with the names pinning holds (session/_policy.py), set by
        # the catalog as it projects each snapshot.
        self.policy = key
        self.key = key
        self.prefix = prefix
        self.source = source
        self.handle: Handle | None = None

    def projection(self) -> Projection:
        assert self.handle is not None
        return self.projection_of(self.handle.entry.snapshot)

    def fresh_part(self) -> tuple[Projection, Snapshot]:
        """The entry's current snapshot and its projection (`projection`), read once."""
        handle = self.handle
        assert handle is not None
        entry = handle.entry
        snapshot = entry.snapshot
        budget = self.session.name_budget
        return shared_projection(
            entry, snapshot, self.key, self.name, self.prefix, budget, self.interner
        ), snapshot

    def projection_of(self, snapshot: Snapshot) -> Projection:
        """`snapshot` (the entry's current one, or an older one it published) through this
        view's current policy and names."""
        assert self.handle is not None
        return shared_projection(
            self.handle.entry,
            snapshot,
            self.key,
            self.name,
            self.prefix,
            self.session.name_budget,
            self.interner,
        )

    def update(self, key: PolicyKey, *, prefix: bool, source: str | None) -> bool:
        """R2: adopt a new policy; True when the canonical view changed (a replay is due)."""
        changed = key != self.policy or prefix != self.prefix
        self.policy = key
        # What pinning holds stays held until the catalog projects again.
        self.key = key.holding(self.key.held, self.interner)
        self.prefix = prefix
        self.source = source
        return changed

    # -- EntryListener -------------------------------------------------------------------------
    # The owner is held weakly (a proxy: session/_session.py), so that a session goes by
    # reference counting; these run in the pool's tasks, which every session shares, and a view
    # whose session is gone (dropped without a close) does nothing rather than raise there.

    def snapshot_changed(self, entry: PoolEntry) -> None:
        try:
            self.session.views_changed()
        except ReferenceError:
            return  # (not contextlib.suppress: this runs on every notification)

    def upstream_notification(self, entry: PoolEntry, method: str, params: Raw | UnsetType) -> None:
        try:
            self.session.upstream_notification(self, method, params)
        except ReferenceError:
            return  # (not contextlib.suppress: this runs on every notification)

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Message) -> str | None:
        try:
            return self.session.server_request(self, upstream, msg)
        except ReferenceError:
            return "the session this request was for is gone"
