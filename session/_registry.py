"""A session's aggregated registry, one immutable generation at a time (DESIGN S2-S4).

Theory of operation: a candidate is built completely from the session's views (servers in
settings order, each server's items in upstream order), then validated: upstream names must be
non-empty with no surrounding whitespace, and exposed names unique. A rejected candidate raises
`CandidateRejected` naming the server, the item and the rule, and the caller keeps the previous
generation. Comparison between generations is canonical per list kind: each kind's items keyed by
exposed name (or URI), canonicalised per S4, so a pure reorder or a reordered `required` array is
no change, while a reordered `default` array is.
"""

from __future__ import annotations

import re
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

from mcpool.protocol import canonical_bytes

from ._view import Projection

if TYPE_CHECKING:
    from ._view import SessionView

LIST_KINDS = ("tools", "prompts", "resources")


class CandidateRejected(Exception):
    def __init__(self, server: str, item: str, rule: str) -> None:
        super().__init__(f"server '{server}': {item!r} {rule}")
        self.server = server
        self.item = item
        self.rule = rule


class Route(NamedTuple):
    view: SessionView
    upstream_name: str


class RegistryGeneration:
    """Immutable by convention: built once by `build_candidate`, never modified afterwards."""

    __slots__ = (
        "canonical",
        "encoded",
        "number",
        "prompt_routes",
        "prompts",
        "resource_routes",
        "resource_templates",
        "resources",
        "settings_generation",
        "template_routes",
        "tool_routes",
        "tools",
        "views",
    )

    def __init__(self) -> None:
        self.number = 0
        self.settings_generation = 0
        self.views: tuple[SessionView, ...] = ()
        self.tools: tuple[dict[str, Any], ...] = ()
        self.prompts: tuple[dict[str, Any], ...] = ()
        self.resources: tuple[dict[str, Any], ...] = ()
        self.resource_templates: tuple[dict[str, Any], ...] = ()
        self.tool_routes: dict[str, Route] = {}
        self.prompt_routes: dict[str, Route] = {}
        self.resource_routes: dict[str, SessionView] = {}
        self.template_routes: tuple[tuple[re.Pattern[str], str, SessionView], ...] = ()
        # Per list kind: sorted (key, canonical bytes) pairs; equal <=> canonically equal (S4).
        self.canonical: dict[str, tuple[tuple[str, bytes], ...]] = {}
        # Encoded first pages, filled lazily by the session (a cache, not state).
        self.encoded: dict[str, bytes] = {}

    def changed_kinds(self, previous: RegistryGeneration) -> list[str]:
        return [k for k in LIST_KINDS if self.canonical[k] != previous.canonical[k]]

    def instructions(self) -> str | None:
        parts = []
        for view in self.views:
            text = view.projection().instructions
            if text:
                parts.append(f"## {view.name}\n{text.strip()}")
        return "\n\n".join(parts) if parts else None


# Canonical bytes of a projection's items, per kind and key, computed once however many sessions
# serve the same projection (projections are shared and immutable; the cache dies with them).
_projection_canonical: weakref.WeakKeyDictionary[Projection, dict[str, dict[str, bytes]]] = (
    weakref.WeakKeyDictionary()
)


def projection_canonical(proj: Projection) -> dict[str, dict[str, bytes]]:
    found = _projection_canonical.get(proj)
    if found is None:
        found = {
            "tools": {exposed: canonical_bytes(t) for exposed, _, t in proj.tools},
            "prompts": {exposed: canonical_bytes(p) for exposed, _, p in proj.prompts},
            "resources": {
                **{
                    r["uri"]: canonical_bytes(r)
                    for r in proj.resources
                    if isinstance(r.get("uri"), str)
                },
                **{
                    "template:" + t["uriTemplate"]: canonical_bytes(t)
                    for t in proj.resource_templates
                    if isinstance(t.get("uriTemplate"), str)
                },
            },
        }
        _projection_canonical[proj] = found
    return found


def _check_name(server: str, name: str, kind: str) -> None:
    if not name:
        raise CandidateRejected(server, name, f"has an empty {kind} name")
    if name != name.strip():
        raise CandidateRejected(server, name, f"{kind} name has leading or trailing whitespace")


def template_pattern(template: str) -> re.Pattern[str]:
    """An RFC 6570 level-1 template as a regex: each {var} matches one or more characters."""
    out = []
    for part in re.split(r"(\{[^}]*\})", template):
        if part.startswith("{") and part.endswith("}"):
            out.append(".+" if part[1:2] in "+#/" else "[^/]+")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out) + r"\Z")


def build_candidate(
    views: list[SessionView], *, number: int, settings_generation: int
) -> RegistryGeneration:
    gen = RegistryGeneration()
    gen.number = number
    gen.settings_generation = settings_generation
    gen.views = tuple(views)
    tools: list[dict[str, Any]] = []
    prompts: list[dict[str, Any]] = []
    resources: list[dict[str, Any]] = []
    templates: list[dict[str, Any]] = []
    tool_routes: dict[str, Route] = {}
    prompt_routes: dict[str, Route] = {}
    resource_routes: dict[str, SessionView] = {}
    template_routes: list[tuple[re.Pattern[str], str, SessionView]] = []
    canon: dict[str, dict[str, bytes]] = {k: {} for k in LIST_KINDS}
    for view in views:
        proj: Projection = view.projection()
        if not proj.available:
            continue
        pc = projection_canonical(proj)
        for exposed, upstream, tool in proj.tools:
            _check_name(view.name, upstream, "tool")
            if exposed in tool_routes:
                other = tool_routes[exposed].view.name
                raise CandidateRejected(
                    view.name, upstream, f"is exposed as {exposed!r}, which server '{other}' uses"
                )
            tool_routes[exposed] = Route(view, upstream)
            tools.append(tool)
            canon["tools"][exposed] = pc["tools"][exposed]
        for exposed, upstream, prompt in proj.prompts:
            _check_name(view.name, upstream, "prompt")
            if exposed in prompt_routes:
                other = prompt_routes[exposed].view.name
                raise CandidateRejected(
                    view.name, upstream, f"is exposed as {exposed!r}, which server '{other}' uses"
                )
            prompt_routes[exposed] = Route(view, upstream)
            prompts.append(prompt)
            canon["prompts"][exposed] = pc["prompts"][exposed]
        for res in proj.resources:
            uri = res.get("uri")
            if isinstance(uri, str) and uri not in resource_routes:
                resource_routes[uri] = view
                resources.append(res)
                canon["resources"][uri] = pc["resources"][uri]
        for tpl in proj.resource_templates:
            uri_t = tpl.get("uriTemplate")
            if isinstance(uri_t, str):
                template_routes.append((template_pattern(uri_t), uri_t, view))
                templates.append(tpl)
                canon["resources"]["template:" + uri_t] = pc["resources"]["template:" + uri_t]
    gen.tools = tuple(tools)
    gen.prompts = tuple(prompts)
    gen.resources = tuple(resources)
    gen.resource_templates = tuple(templates)
    gen.tool_routes = tool_routes
    gen.prompt_routes = prompt_routes
    gen.resource_routes = resource_routes
    gen.template_routes = tuple(template_routes)
    gen.canonical = {k: tuple(sorted(v.items())) for k, v in canon.items()}
    return gen


def empty_generation() -> RegistryGeneration:
    gen = RegistryGeneration()
    gen.canonical = {k: () for k in LIST_KINDS}
    return gen
