"""`daemonctl explain`: why a tool or prompt is visible or hidden for one session.

Plain functions over what they read: the session asked about, the other sessions, the pool's
entries and the settings files the daemon has read. The admin API (daemon/_admin_api.py) looks
the session up and calls `explain`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mcpool.pool import EntryState, PoolEntry
from mcpool.protocol import (
    INVALID_PARAMS,
    McpoolError,
)
from mcpool.session import (
    Session,
    exposed_name,
    normalize_include,
    seen_as,
    user_name_forms,
)

from ._attached import SessionRecord
from ._settings import LoadedFile


def explain(
    st: SessionRecord,
    name: str,
    sessions: Mapping[str, SessionRecord],
    entries: Iterable[PoolEntry],
    files: Mapping[str, LoadedFile],
) -> dict[str, Any]:
    """Why a tool or prompt is visible or hidden for one session (`daemonctl explain`).

    `name` may be an exposed name or an upstream name. Every server of the session is
    searched in its entry's snapshot, hidden items included, so a filtered-out tool is
    found; a name no server of the session offers is looked up in the rest of the pool.
    """
    query = normalize_include(name)
    if not query:
        raise McpoolError("a tool or prompt name is required", code=INVALID_PARAMS)
    session = st.session
    # The name as the user saw it in a client may carry that client's prefix
    # (mcp__mcpool__..., mcp_mcpool_..., Codex's dashes folded): every form is tried.
    forms = user_name_forms(query)
    matches: list[dict[str, Any]] = []
    for server, view in session.views.items():
        if view.handle is None:
            continue
        entry = view.handle.entry
        for kind, upstream in _items(entry.snapshot):
            exposed = exposed_name(server, upstream, prefix=view.prefix, budget=session.name_budget)
            if not (seen_as(forms, upstream) or seen_as(forms, exposed)):
                continue
            visible, rule, filt = _visibility(session, view, kind, upstream)
            seen_by: list[dict[str, Any]] = []
            hidden_from: list[dict[str, Any]] = []
            for other_id, other in sessions.items():
                other_view = other.session.views.get(server)
                if other_id == session.id or other_view is None:
                    continue
                o_visible, o_rule, _ = _visibility(other.session, other_view, kind, upstream)
                who = {
                    "session": other_id,
                    "name": other.session.name,
                    "entry": other_view.handle.lifecycle_id if other_view.handle else None,
                }
                if o_visible:
                    o_exposed = exposed_name(
                        server,
                        upstream,
                        prefix=other_view.prefix,
                        budget=other.session.name_budget,
                    )
                    seen_by.append({**who, "exposed": o_exposed})
                else:
                    hidden_from.append({**who, "rule": o_rule})
            matches.append(
                {
                    "kind": kind,
                    "server": server,
                    "entry": view.handle.lifecycle_id,
                    "entry_state": entry.state.value,
                    "upstream": upstream,
                    "exposed": exposed,
                    "visible": visible,
                    "rule": rule,
                    "filter": filt,
                    "policy": view.policy.canonical(),
                    "held": upstream in view.key.held,
                    "source": view.source,
                    "seen_by": seen_by,
                    "hidden_from": hidden_from,
                }
            )
    elsewhere: list[dict[str, Any]] = []
    if not matches:
        for entry in entries:
            for kind, upstream in _items(entry.snapshot):
                if not (
                    seen_as(forms, upstream) or seen_as(forms, exposed_name(entry.name, upstream))
                ):
                    continue
                elsewhere.append(
                    {
                        "kind": kind,
                        "server": entry.name,
                        "entry": entry.lifecycle_id,
                        "upstream": upstream,
                        "reason": _absent_server(st, entry.name, files),
                    }
                )
    return {
        "session": session.id,
        "session_name": session.name,
        "name": query,
        "matches": matches,
        "elsewhere": elsewhere,
    }


def _visibility(
    session: Session, view: Any, kind: str, upstream: str
) -> tuple[bool, str, str | None]:
    """(visible, rule, deciding filter) for one upstream item in one session's view."""
    allowed, rule = view.key.explain(upstream)
    filt = (
        "excludeTools"
        if "excludeTools" in rule
        else "pinning"
        if upstream in view.key.held
        else "includeTools"
        if view.key.include is not None
        else None
    )
    if not allowed:
        # Calls check the current policy whatever generation is served (S8): hidden is
        # also not callable.
        return False, rule, filt
    routes = session.registry.tool_routes if kind == "tool" else session.registry.prompt_routes
    route = routes.get(
        exposed_name(view.name, upstream, prefix=view.prefix, budget=session.name_budget)
    )
    if (
        route is not None
        and route.view is view
        and route.upstream_name == upstream
        and session.holds(view)
    ):
        return True, rule, filt
    entry = view.handle.entry if view.handle is not None else None
    rejected = session.registry_errors.get(view.name)
    if rejected:
        why = f"the server's latest lists were rejected: {rejected}"
    elif entry is not None and entry.state is not EntryState.ACTIVE:
        why = f"the server's entry is {entry.state.value}"
    else:
        why = "not in the session's current registry generation yet"
    return False, f"allowed ({rule}), but not served: {why}", filt


def _items(snapshot: Any) -> list[tuple[str, str]]:
    items = [("tool", t.get("name")) for t in snapshot.tools]
    items += [("prompt", p.get("name")) for p in snapshot.prompts]
    return [(kind, name) for kind, name in items if isinstance(name, str)]


def _absent_server(st: SessionRecord, server: str, files: Mapping[str, LoadedFile]) -> str:
    for path in reversed(st.sources):
        loaded = files.get(path)
        entry = loaded.servers.get(server) if loaded is not None else None
        if entry is not None:
            if entry.disabled:
                return f"server '{server}' is disabled in {path}"
            return f"server '{server}' in {path} is not connected to this session"
    return f"this session's settings do not list a server named '{server}'"
