"""Exposed names on the wire (DESIGN "Names on the wire").

`<server>__<name>`, restricted to [A-Za-z0-9_-] and at most 64 characters; a longer one is cut
and given a short hash of the full name, so the result is deterministic. Nothing ever splits an
exposed name on `__`: the registry's route table maps it back.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64  # the tool-name limit of the strictest major client
_HASH_CHARS = 8
_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def exposed_name(server: str, name: str, *, prefix: bool = True) -> str:
    raw = f"{server}__{name}" if prefix else name
    clean = _DISALLOWED.sub("_", raw)
    if len(clean) <= MAX_NAME:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:_HASH_CHARS]
    return f"{clean[: MAX_NAME - _HASH_CHARS - 1]}_{digest}"
