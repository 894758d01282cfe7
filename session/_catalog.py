"""A session's catalog: its views (one per server), reconciled with its settings (R1-R6); the
name budget; building and publishing registry generations (S2-S8); the lookups every request makes
through the generation served (`holds`, `allows`, `refusal`, `resource_view`); and the notifier
that announces changed lists (S5).

It owns its views and generations and meets the rest through what it is given at construction:
the pool (leases), the `ClientLink` (the client's era and info, writes), the `Flights` (a modern
session's listen streams carry its list_changed) and a `CatalogOwner` (the session: the owner of
its views, told when the servers are leased and when the first generation is published).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import trio

from mcpool.pool import (
    MODERN_ONLY,
    Handle,
    Pool,
    PoolEntry,
    Snapshot,
    TransportIdentity,
    Upstream,
)
from mcpool.protocol import (
    INVALID_PARAMS,
    META_SUBSCRIPTION_ID,
    RESOURCE_NOT_FOUND,
    McpoolError,
    notification,
)

from ._clients import first_list_wait, lists_once
from ._eras import MODERN
from ._flights import Flights
from ._interner import Interner
from ._link import ClientLink, SessionLog
from ._login_notice import may_log
from ._names import MAX_NAME, name_budget
from ._pins import NO_PINS, PinDesk, PinState, change_warning
from ._reconcile import ActionKind, Desired, Held, reconcile
from ._registry import (
    LIST_KINDS,
    CandidateRejected,
    RegistryGeneration,
    Route,
    build_candidate,
    empty_generation,
    followed,
)
from ._view import SessionView, ViewOwner, shared_projection

# The list_changed lines, encoded once (every session of a changed aggregate sends one).
_LIST_CHANGED = {kind: notification(f"notifications/{kind}/list_changed") for kind in LIST_KINDS}
# Per tuple of changed kinds (a move's `changes`): the handshake era's list_changed lines for
# them, in list order and written at once, and how many they are. At most 15 tuples.
_LIST_CHANGED_LINES: dict[tuple[str, ...], tuple[bytes, int]] = {}


def _list_changed_lines(kinds: Collection[str]) -> tuple[bytes, int]:
    ordered = [kind for kind in LIST_KINDS if kind in kinds]
    lines = (b"".join(_LIST_CHANGED[kind] for kind in ordered), len(ordered))
    if kinds.__class__ is tuple:
        _LIST_CHANGED_LINES[kinds] = lines
    return lines


def _lists_once(client_info: dict[str, object], more: Sequence[str]) -> bool:
    name = client_info.get("name")
    return lists_once(name if isinstance(name, str) else None, more)


class CatalogOwner(ViewOwner, Protocol):
    """The session, as its catalog meets it."""

    def servers_leased(self) -> None:
        """The first reconciliation has leased the servers: initialize may be answered."""

    def first_generation(self) -> None:
        """The first generation is published: what waited for it is served."""


# How long a session's first lease waits for its client's first message when one of its servers
# speaks both eras (a client sends it at once; one that does not gets the unpinned connection).
OPENER_WAIT = 1.0


class _Warming:
    """The listener of the lease that starts a connection before a session's views move to it:
    nothing reaches a session through it."""

    def snapshot_changed(self, entry: PoolEntry) -> None:
        pass

    def upstream_notification(self, entry: PoolEntry, method: str, params: Any) -> None:
        pass

    def server_request(self, entry: PoolEntry, upstream: Upstream, msg: Any) -> str | None:
        return "the session is still moving to this connection"


_WARMING = _Warming()


class Catalog:
    """One session's views and the registry generation it serves."""

    __slots__ = (
        "_budget_settings",
        "_desired",
        "_dirty",
        "_flights",
        "_log",
        "_log_enabled",
        "_notify_wake",
        "_notifying",
        "_opener",
        "_owner",
        "_reconciling",
        "_sid",
        "_signature",
        "_switching",
        "fault",
        "handshake_version",
        "interner",
        "last_error",
        "link",
        "name_budget",
        "notifications_sent",
        "pending_kinds",
        "pins",
        "pins_told",
        "pool",
        "ready",
        "registry",
        "registry_errors",
        "settings_generation",
        "spawn",
        "views",
        "views_known",
    )

    def __init__(
        self,
        sid: str,
        pool: Pool,
        link: ClientLink,
        flights: Flights,
        owner: CatalogOwner,
        *,
        log: SessionLog,
        log_enabled: Callable[[str], bool],
        fault: Callable[[str, BaseException], None],
        interner: Interner,
        pins: PinDesk = NO_PINS,
    ) -> None:
        self._sid = sid
        self.pool = pool
        # The daemon's pin book (issue 30): what of each snapshot is held, what changed.
        self.pins = pins
        # The changes this session's client was told of: (source, server, kind, name, digest).
        self.pins_told: set[tuple[str | None, str, str, str, str]] = set()
        self.interner = interner  # the daemon's: projections, aggregates, canonical bytes
        self.link = link
        self._flights = flights
        self._owner = owner
        self._log = log
        # Whether a line of this level would be kept (formatting skipped when not).
        self._log_enabled = log_enabled
        # An unexpected exception in code others' tasks run: logged, and this session closes.
        self.fault = fault
        self.views: dict[str, SessionView] = {}
        # The longest exposed name this session's client takes (session/_names.py): decided by
        # `set_name_budget` and again when the client says who it is.
        self.name_budget = MAX_NAME
        self._budget_settings: tuple[int | None, int | None] = (None, None)
        self.registry: RegistryGeneration = empty_generation()
        self._signature: tuple[Any, ...] = ()
        self.ready = False  # the first generation is published
        self.views_known = False  # the first reconciliation has leased the servers
        self.settings_generation = 0
        self._reconciling = False
        self._dirty = False
        self.last_error: str | None = None
        # Server -> why its part of the latest candidate was rejected (S3, S8); `last_error`
        # joins them for one-line displays.
        self.registry_errors: dict[str, str] = {}
        self.pending_kinds: set[str] = set()
        self._notify_wake = trio.Event()
        # With `spawn` set (the daemon's connections), a notifier task exists only while
        # notifications are pending; without it the owner runs `run_notifier()`.
        self.spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None
        self._notifying = False
        self.notifications_sent = 0
        # Each session meets the era it speaks (issue 29 item 1): the revision a handshake-era
        # client negotiated (None: a modern one, or not known yet), set once its opener came;
        # the settings last applied, as given (`_in_era` pins them for this session).
        self.handshake_version: str | None = None
        self._opener = trio.Event()
        self._desired: dict[str, Desired] = {}
        self._switching = False

    def close(self) -> None:
        """The session closed: its leases go, and a notifier waiting wakes to end."""
        self.release_all()
        self._notify_wake.set()

    def instructions(self) -> str | None:
        """The served generation's instructions; before the first generation (L6), those of
        the servers already up, joined the same way (a late server's cannot follow: the
        protocol has no notification for them)."""
        if self.ready:
            return self.registry.instructions()
        parts = []
        for view in self.views.values():
            text = view.projection().instructions
            if text:
                parts.append(f"## {view.name}\n{text.strip()}")
        return "\n\n".join(parts) if parts else None

    def release_all(self) -> None:
        for view in self.views.values():
            if view.handle is not None:
                self.pool.release(view.handle)

    def holds(self, view: SessionView) -> bool:
        """S8: whether `view` is still this session's, on a handle it holds. The generation
        being served may predate a settings change that removed, disabled or replaced its
        server (while new entries start, or when a part was rejected)."""
        handle = view.handle
        return handle is not None and not handle.released and self.views.get(view.name) is view

    def allows(self, route: Route | None) -> Route | None:
        """S8: `route` when the session's current policy and handles allow it, else None: a
        removed, disabled or filtered item is as unknown as one never listed."""
        if route is None:
            return None
        view = route.view
        handle = view.handle  # `holds`, inlined: this runs on every call
        if handle is None or handle.released or self.views.get(view.name) is not view:
            return None
        return route if view.key.allows(route.upstream_name) else None

    def refusal(self, route: Route) -> str | None:
        """Why a call or get routed by `route` (a route of the served generation) is refused
        now, or None when it goes through: `_allows`, with its reason. While a reload waits for
        new servers the generation served predates the settings (S7, S8), and what they no
        longer allow is still listed until it is published (`daemonctl tools` says so)."""
        view = route.view
        if not self.holds(view):
            return (
                f"server '{view.name}' is no longer this session's (removed, disabled or "
                "replaced in its settings); still listed until the reload ends"
            )
        allowed, rule = view.key.explain(route.upstream_name)
        if not allowed:
            return f"hidden by policy ({rule}); still listed until the reload ends"
        return None

    def held(self) -> dict[str, Held]:
        out = {}
        for name, view in self.views.items():
            h = view.handle
            assert h is not None
            usable = not h.released and h.entry.state.value not in ("closed", "failed")
            out[name] = Held(h.identity, view.policy, view.prefix, view.source, usable)
        return out

    async def apply_settings(
        self, desired: dict[str, Desired], settings_generation: int
    ) -> list[tuple[str, str]]:
        """Reconcile this session's handles with `desired` (R1-R6). Returns (server, action)."""
        if settings_generation < self.settings_generation:
            # S6: a newer generation is already installed
            self._log(
                f"session {self._sid}: settings generation {settings_generation} discarded: "
                f"generation {self.settings_generation} is already installed"
            )
            return []
        self._desired = desired
        if not self._opener.is_set() and self._any_dual_era(desired):
            # A server known to speak both eras: its connection depends on the client's, which
            # its first message (initialize, or a 2026-07-28 request) tells, moments after the
            # attach; bounded, as a client that says nothing is served the unpinned one.
            with trio.move_on_after(OPENER_WAIT):
                await self._opener.wait()
        desired = self._in_era(desired)
        self._reconciling = True
        report: list[tuple[str, str]] = []
        new_views: dict[str, SessionView] = {}
        replay = False
        waiting: list[Handle] = []
        try:
            for action in reconcile(desired, self.held()):
                report.append((action.name, action.kind.value))
                old = self.views.get(action.name)
                d = action.desired
                if action.kind is ActionKind.RELEASE:
                    assert old is not None
                    assert old.handle is not None
                    self.pool.release(old.handle)
                    replay = True
                    continue
                assert d is not None
                if action.kind is ActionKind.KEEP:
                    assert old is not None
                    new_views[d.name] = old
                elif action.kind is ActionKind.REFRESH:
                    assert old is not None
                    assert old.handle is not None
                    self.pool.refresh(old.handle, d.settings)
                    replay |= old.update(d.key, prefix=d.settings.prefix, source=d.source)
                    new_views[d.name] = old
                else:  # ACQUIRE, REPLACE
                    # What the session asked of this server follows it to the new connection
                    # (issue 29 item 5): its log level, and the URIs it subscribed to there.
                    carried: Iterable[str] = ()  # (the lease copies it)
                    if old is not None and old.handle is not None:
                        carried = old.handle.subscriptions
                        # Replaced by other transport settings: closed at once if now unused.
                        self.pool.release(old.handle, replaced=True)
                    view = SessionView(
                        self._owner,
                        d.name,
                        d.key,
                        prefix=d.settings.prefix,
                        source=d.source,
                        interner=self.interner,
                    )
                    view.handle = self.pool.lease(
                        d.identity,
                        d.settings,
                        self._sid,
                        view,
                        log_level=self.link.log_level,
                        subscriptions=carried,
                    )
                    waiting.append(view.handle)
                    new_views[d.name] = view
                    replay = True
            self.views = {name: new_views[name] for name in desired if name in new_views}
            if not self.views_known:
                self.views_known = True
                self._owner.servers_leased()
            # L6, S7: each new server is waited for within its entry's startup budget, never
            # longer; one still starting is named in the log and arrives by list_changed. A
            # client that lists once waits longer for a server never seen up (issue 28); that
            # budget is decided once the first wait is over, when its clientInfo is known.
            since = trio.current_time()
            options = self.pool.options
            # Whether each was remembered slow before this wait: the pool's own watch may mark
            # it slow while we wait (its budget began at the entry's creation, before ours).
            slow_before = [handle.entry.known_slow for handle in waiting]
            for lists_once in (False, True):
                if lists_once and not self.client_lists_once():
                    break
                for handle in waiting:
                    entry = handle.entry
                    deadline = first_list_wait(
                        startup_deadline=entry.startup_deadline,
                        since=since,
                        list_once_budget=options.list_once_budget,
                        lists_once=lists_once,
                        known_slow=entry.known_slow,
                    )
                    with trio.move_on_at(deadline):
                        await entry.ready.wait()
            listed_once = self.client_lists_once()
            for handle, was_slow in zip(waiting, slow_before, strict=True):
                if not handle.entry.ready.is_set() and not handle.released:
                    if listed_once:  # waited the whole list-once budget: remembered slow
                        self.pool.note_not_up(handle.entry)
                    why = (
                        "not waited for: it was not up within the first-list budget before, "
                        "and has not been up since"
                        if was_slow
                        else "still starting after the first list's wait"
                    )
                    self._log(
                        f"session {self._sid}: server '{handle.identity.name}' is {why} "
                        f"({handle.entry.state.value}); served without it, its items follow "
                        "by list_changed"
                    )
        finally:
            self._reconciling = False
        if self.link.closed or settings_generation < self.settings_generation:
            # S6: a newer settings generation was installed while this one waited for its
            # entries; its candidate is the one that counts, and nothing is notified for ours.
            if not self.link.closed:
                self._log(
                    f"session {self._sid}: candidate of settings generation {settings_generation} "
                    f"discarded: generation {self.settings_generation} was installed while it "
                    "waited for its servers"
                )
            return report
        self.settings_generation = settings_generation
        if not self.ready and not self._switching and self._era_due():
            # Found modern during the first wait: the session's first lists and calls are on
            # the connection of its era, so they move there before anything is served.
            self._switching = True
            await self._switch_era()
            return report
        if replay or self._dirty or not self.ready:
            self._dirty = False
            self.rebuild("settings")
        self._switch_era_if_due()
        return report

    # -- eras (issue 29 item 1) ----------------------------------------------------------------

    def opener_arrived(self, handshake_version: str | None) -> None:
        """The client's first message came: `handshake_version`, the revision an initialize
        negotiated, or None for a 2026-07-28 client (which the unpinned connection serves)."""
        if self._opener.is_set():
            return
        self.handshake_version = handshake_version
        self._opener.set()
        if self.views_known:  # (it came after the servers were leased)
            self._switch_era_if_due()

    def _any_dual_era(self, desired: dict[str, Desired]) -> bool:
        return any(self._era_pinnable(d.identity) for d in desired.values())

    def _era_pinnable(self, identity: TransportIdentity) -> bool:
        """A server its handshake-era sessions get a connection of their own to: found modern
        (and not refused in the handshake era), with no `protocolVersion` setting."""
        return identity.protocol_version is None and self.pool.known_era(identity) == MODERN

    def _in_era(self, desired: dict[str, Desired]) -> dict[str, Desired]:
        """`desired` as this session connects: a modern server with no `protocolVersion` of
        its own is pinned to a handshake-era client's revision (a connection shared by that
        revision's sessions), so the session is served what the server serves such a client
        directly; unless that connection was refused (the server speaks only the modern era,
        and the modern connection serves the session, translated)."""
        version = self.handshake_version
        if version is None:
            return desired
        out = {}
        for name, d in desired.items():
            if self._era_pinnable(d.identity):
                d = d._replace(identity=self.pool.in_era(d.identity, version))
            out[name] = d
        return out

    def _era_due(self) -> bool:
        """A view of this handshake-era session is not on the connection `_in_era` gives it
        (its server was found modern, or its handshake connection refused, after it leased)."""
        if self.handshake_version is None:
            return False
        for view in self.views.values():
            handle = view.handle
            if handle is None:
                continue
            if handle.identity.era_pin is None:
                if handle.entry.era == MODERN and self._era_pinnable(handle.identity):
                    return True
            elif self.pool.known_era(handle.identity) == MODERN_ONLY:
                return True
        return False

    def _switch_era_if_due(self) -> None:
        if self._switching or self.spawn is None or self.link.closed or not self._era_due():
            return
        self._switching = True
        self.spawn(self._switch_era)

    async def _switch_era(self) -> None:
        """Move the views whose server turned out to speak both eras to the connection of this
        session's revision: that connection is leased and waited for first (bounded by its
        startup budget), so the views move to one that is up and no call meets a gap."""
        warm: list[Handle] = []
        try:
            for name, d in self._in_era(self._desired).items():
                view = self.views.get(name)
                if (
                    view is not None
                    and view.handle is not None
                    and view.handle.identity != d.identity
                ):
                    warm.append(self.pool.lease(d.identity, d.settings, self._sid, _WARMING))
            for handle in warm:
                with trio.move_on_at(handle.entry.startup_deadline):
                    await handle.entry.ready.wait()
            if not self.link.closed:
                self._log(
                    f"session {self._sid}: moved {len(warm)} server(s) to the connection of "
                    f"its era ({self.handshake_version}, or the modern one of a server that "
                    "speaks only that)"
                )
                await self.apply_settings(self._desired, self.settings_generation)
        finally:
            for handle in warm:
                # (Closed at once when the views did not move to it: refused, or not needed.)
                self.pool.release(handle, replaced=True)
            self._switching = False

    def client_lists_once(self) -> bool:
        """Does this session's client see only its first list (session/_clients.py, and the
        daemon's `listOnceClients`)?"""
        return _lists_once(self.link.client_info, self.pool.options.list_once_clients)

    def set_name_budget(self, *, explicit: int | None, configured: int | None) -> None:
        """`mcpool attach --max-name-length` and the daemon's `maxNameLength`; without either,
        the client's `clientInfo.name` decides (a known client's prefix and cap)."""
        self._budget_settings = (explicit, configured)
        self.update_name_budget()

    def update_name_budget(self) -> None:
        explicit, configured = self._budget_settings
        client = self.link.client_info.get("name")
        budget = name_budget(
            client if isinstance(client, str) else None, explicit=explicit, configured=configured
        )
        if budget != self.name_budget:
            self.name_budget = budget
            if self.ready:
                # Every exposed name is projected again under the budget.
                self.views_changed("budget")

    def views_changed(self, reason: str = "upstream") -> None:
        # Called from whichever task published a snapshot (an upstream's relist, a restart).
        if self._reconciling:
            self._dirty = True
        elif not self.link.closed:
            try:
                self.rebuild(reason)
                # A server first seen now may speak both eras (issue 29 item 1).
                self._switch_era_if_due()
            except Exception as exc:
                self.fault("a change of its servers' lists", exc)

    def rebuild(self, reason: str = "settings") -> None:
        """Build and publish the next generation; `reason` (settings, upstream, budget) is for
        the log. A server whose part is rejected keeps its fallback (`build_candidate`), and
        the rest, policy changes included, is published (S3, S8)."""
        # Runs once per session of a changed entry (200 sessions: 200 times per list_changed),
        # so `fresh_part` with `shared_projection`'s cache hit, the logging check and the
        # rejections' bookkeeping are inlined.
        views = tuple(self.views.values())
        budget = self.name_budget
        interner = self.interner
        refs = interner.projections.refs
        projections = []
        for view in views:
            handle = view.handle
            assert handle is not None
            entry = handle.entry
            snapshot = entry.snapshot
            # Pinning first: a changed definition it holds is never projected, not even once.
            self._apply_pins(view, snapshot)
            key, name, prefix = view.key, view.name, view.prefix
            ref = refs.get((entry, snapshot.generation, key, name, prefix, budget))
            found = ref() if ref is not None else None
            projections.append(
                found
                if found is not None
                else shared_projection(entry, snapshot, key, name, prefix, budget, interner)
            )
        fresh = tuple(projections)
        # The views and their projections (compared by identity: Projection has eq=False).
        signature = (views, fresh)
        if self.ready and signature == self._signature:
            return
        prev = self.registry
        cand = (
            followed(prev, views, fresh, prev.number + 1, self.settings_generation)
            if self.ready
            else None
        )
        if cand is None:
            cand = build_candidate(
                list(views),
                number=prev.number + 1,
                settings_generation=self.settings_generation,
                previous=prev,
                interner=interner,
            )
        self._signature = signature
        if cand.rejected or self.registry_errors:
            self._record_rejections(cand.rejected)
        else:
            self.last_error = None
        changed = cand.changed if cand.changed is not None else cand.changed_kinds(prev)
        if not (self.ready and cand.agg is prev.agg and cand.views == prev.views):
            # (A candidate that serves exactly what is served, a rejected part's fallback
            # included, is no new generation.)
            self.registry = cand
            if self._log_enabled("debug"):
                self._log_generation(cand, changed, reason)
        if not self.ready:
            self.ready = True
            self._owner.first_generation()
            return
        if changed:
            self.tell_changed(changed)

    def tell_changed(self, changed: Collection[str]) -> None:
        """The client is told the lists of `changed` kinds changed (S5): now when nothing
        waits to be written, else coalesced with what waits."""
        if not self.link.initialized or self.link.closed:
            return
        if not self._notifying and not self.pending_kinds and not self.link.out.buffered:
            # Nothing waits to be written: told now, the write itself and no task (S5:
            # changes coalesce while a write is pending, and this one would not wait).
            self._write_kinds(changed)
            return
        self.pending_kinds.update(changed)
        self._notify_wake.set()
        if self.spawn is not None and not self._notifying:
            self._notifying = True
            self.spawn(self._notify_pending)

    def tell_changes(self) -> None:
        """The handshake is over: what pinning found before it is told now."""
        for view in self.views.values():
            if view.handle is not None:
                self._apply_pins(view, view.handle.entry.snapshot)

    def _apply_pins(self, view: SessionView, snapshot: Snapshot) -> None:
        """What pinning makes of `snapshot` for `view`: the names it holds join the key the
        view serves through, and the changes it would show are told (`_tell_changes`)."""
        pinned = self.pins.state(view.source, view.name, view.policy.pinning, snapshot)
        if pinned.held != view.key.held:
            view.key = view.policy.holding(pinned.held, self.interner)
        if pinned.changes:
            self._tell_changes(view, pinned)

    def _tell_changes(self, view: SessionView, pinned: PinState) -> None:
        """Tell the client, once each, of the pending changes of items its view would show
        (a warning log message, as far as its era and log level let a server log)."""
        if not self.link.initialized:
            return  # (`tell_changes` follows the handshake)
        for change in pinned.changes:
            told = (view.source, view.name, change.kind, change.name, change.current_digest)
            if told in self.pins_told or not view.policy.allows(change.name):
                continue
            self.pins_told.add(told)
            if may_log(modern=self.link.era is MODERN, log_level=self.link.log_level):
                text = change_warning(view.name, change, pinned.mode)
                self.link.send(
                    notification(
                        "notifications/message",
                        {"level": "warning", "logger": "mcpool", "data": text},
                    )
                )

    def _record_rejections(self, rejected: tuple[CandidateRejected, ...]) -> None:
        """The session's registry errors are exactly the latest candidate's rejections: an error
        goes as soon as a candidate no longer has it (issue 15.9)."""
        if not rejected and not self.registry_errors:
            self.last_error = None
            return
        errors = {r.server: r.describe() for r in rejected}
        for server, error in errors.items():
            if self.registry_errors.get(server) != error:
                self._log(f"session {self._sid}: registry candidate rejected: {error}")
        self.registry_errors = errors
        self.last_error = "; ".join(errors.values()) or None

    def _log_generation(self, gen: RegistryGeneration, changed: Sequence[str], reason: str) -> None:
        # (Called only when debug lines are kept: formatted for nothing 200 times when 200
        # sessions move at once, otherwise.)
        counts = (
            f"{len(gen.tools)} tools, {len(gen.prompts)} prompts, {len(gen.resources)} "
            f"resources, {len(gen.resource_templates)} resource templates"
        )
        what = f"changed: {', '.join(changed)}" if changed else "canonical view unchanged"
        self._log(
            f"session {self._sid}: generation {gen.number} published ({reason}): {counts}; {what}",
            "debug",
        )

    async def run_notifier(self) -> None:
        """Send list_changed for changed kinds; coalesce while the socket has unsent data."""
        while not self.link.closed:
            await self._notify_wake.wait()
            self._notify_wake = trio.Event()
            await self._send_pending()

    async def _notify_pending(self) -> None:
        try:
            while self.pending_kinds and not self.link.closed:
                await self._send_pending()
        finally:
            self._notifying = False

    async def _send_pending(self) -> None:
        if self.link.out.buffered:
            await self.link.out.wait_drained()
        self._write_pending()

    def _write_pending(self) -> None:
        kinds, self.pending_kinds = self.pending_kinds, set()
        self._write_kinds(kinds)

    def _write_kinds(self, kinds: Collection[str]) -> None:
        """One list_changed per kind in `kinds`, in list order."""
        if self.link.era is not MODERN:
            # (Once per session per change: 200 sessions, 200 times. A tuple's lines are found
            # made; any other collection's are made.)
            found = _LIST_CHANGED_LINES.get(kinds) if kinds.__class__ is tuple else None
            lines, count = found if found is not None else _list_changed_lines(kinds)
            if count:
                self.notifications_sent += count
                self.link.send(lines)
            return
        for kind in LIST_KINDS:
            if kind not in kinds:
                continue
            method = f"notifications/{kind}/list_changed"
            # 2026-07-28: only on the listen streams that asked, stamped with their id.
            for listen_id, listen in list(self._flights.listens.items()):
                if kind in listen.kinds:
                    self.notifications_sent += 1
                    stamp = {"_meta": {META_SUBSCRIPTION_ID: listen_id}}
                    self.link.send(notification(method, stamp))

    def resource_view(self, uri: str) -> SessionView:
        """The view of the server that lists `uri` or matches it by a template, among the
        session's current servers (issue 29 item 7). A URI none of them claims is not
        forwarded, not even to the one server with resources: a disabled or removed server's
        URIs must not reach another server."""
        view = self.registry.resource_view(uri)
        if view is not None and self.holds(view):
            return view
        raise McpoolError(
            f"no server of this session lists the resource {uri} or matches it by a template",
            message="Resource not found",
            # The handshake era's code, or the modern era's (SEP-2164: invalid params).
            code=INVALID_PARAMS if self.link.era is MODERN else RESOURCE_NOT_FOUND,
            uri=uri,
        )
