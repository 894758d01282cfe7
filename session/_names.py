"""Exposed names on the wire (DESIGN "Names on the wire").

`<server>__<name>`, restricted to [A-Za-z0-9_-] and at most a per-session length budget (64 by
default). A longer one is shortened deterministically with a short hash of the full name, so two
different names never shorten alike (and the registry rejects the candidate if they ever did).
Nothing ever splits an exposed name on `__`: the registry's route table maps it back.

The budget exists because clients prefix what a server exposes before a model sees it (Claude
Code and Qwen Code `mcp__<their name for mcpool>__`, gemini-cli `mcp_<name>_`, Codex and Cline
`<name>__`, Copilot CLI `<name>-`, opencode `<name>_`) and model APIs cap tool names (64 for the
Anthropic and OpenAI APIs; gemini-cli and Qwen Code cut at 63; Copilot CLI and Cline re-cut a
longer name with a digest of their own, which hides the tool's name from the model; opencode
passes it on and the model API refuses it). `name_budget` turns what a session says about itself
into the budget.
"""

from __future__ import annotations

import hashlib
import re

from ._clients import traits_of

MAX_NAME = 64  # the tool-name limit of the strictest major model API
MIN_NAME = 20  # below this a shortened name is mostly hash: refuse a smaller budget
_HASH_CHARS = 8
_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def client_budget(client_name: str | None) -> int | None:
    """The longest exposed name that fits the named client after its prefix; None: unknown."""
    traits = traits_of(client_name)
    return None if traits is None else traits.limit - len(traits.prefix)


def name_budget(
    client_name: str | None, *, explicit: int | None = None, configured: int | None = None
) -> int:
    """A session's budget: `mcpool attach --max-name-length`, else the daemon option
    `maxNameLength`, else the client's known prefix and cap, else 64."""
    for value in (explicit, configured):
        if value is not None:
            return max(MIN_NAME, min(MAX_NAME, value))
    known = client_budget(client_name)
    return known if known is not None else MAX_NAME


def exposed_name(server: str, name: str, *, prefix: bool = True, budget: int = MAX_NAME) -> str:
    raw = f"{server}__{name}" if prefix else name
    clean = _DISALLOWED.sub("_", raw)
    if len(clean) <= budget:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:_HASH_CHARS]
    if prefix:
        # Keep the tool's own name whole when it fits beside a stem of the server name: the
        # model reads the tool name, and the stem plus digest still tell servers apart.
        tool = _DISALLOWED.sub("_", name)
        stem = budget - len(tool) - _HASH_CHARS - 3  # "_" and "__" around the digest
        if stem >= 3:
            return f"{_DISALLOWED.sub('_', server)[:stem]}_{digest}__{tool}"
    return f"{clean[: budget - _HASH_CHARS - 1]}_{digest}"


def _fold(name: str) -> str:
    # Codex turns `-` into `_` in the names it shows; compare names with both folded.
    return name.replace("-", "_")


def user_name_forms(query: str) -> frozenset[str]:
    """What an exposed or upstream name may be, given a name as a user saw it in a client:
    itself, or it without a client's prefix (`mcp__<client name for mcpool>__` of Claude Code
    and Qwen Code, `mcp_<name>_` of gemini-cli, `<name>__` of Codex and Cline, `<name>-` of
    Copilot CLI, `<name>_` of opencode), each with `-` folded to `_`. The client's name for
    mcpool is not known here, and every prefix ends in `_` or `-`: what follows each of those
    is a candidate."""
    forms = {query, *(query[i + 1 :] for i, c in enumerate(query) if c in "-_")}
    return frozenset(_fold(f) for f in forms if f)


def seen_as(forms: frozenset[str], name: str) -> bool:
    """True when `name` (exposed or upstream) is one of the forms of what the user typed."""
    return _fold(name) in forms
