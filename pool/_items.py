"""What makes a listed item (a tool, prompt, resource or template) unusable, and how that is
said: one rule for a live listing (pool/_pool.py `list_all`) and for a stored one read back at
a cold start (pool/_snapshots.py `from_record`). Pure."""

from __future__ import annotations

from typing import Any

# The field every listed item must have as a string, per list; an item without it is unusable.
_ITEM_KEYS = {
    "tools": "name",
    "prompts": "name",
    "resources": "uri",
    "resourceTemplates": "uriTemplate",
}
MAX_NOTED_ITEMS = 5  # malformed items described one by one in a note; the rest are counted


def malformed_item(field: str, item: Any) -> str | None:
    """Why a listed item cannot be used (pure), or None when it can."""
    if not isinstance(item, dict):
        return f"a non-object item ({json_type(item)})"
    meta = item.get("_meta")
    if field == "tools" and meta is not None and not isinstance(meta, dict):
        # Views copy a tool's `_meta` to add their own keys (session/_view.py): it must be an
        # object (the spec's type for it).
        return f"an item whose _meta is {json_type(meta)}, not an object"
    key = _ITEM_KEYS.get(field)
    if key is None or isinstance(item.get(key), str):
        return None
    if key not in item:
        return f"an item with no {key}"
    return f"an item whose {key} is {json_type(item[key])}, not a string"


def malformed_note(method: str, problems: list[str]) -> str:
    """One line for what a list left out: `tools/list: 2 malformed items left out: ...`."""
    shown = "; ".join(problems[:MAX_NOTED_ITEMS])
    more = (
        f"; and {len(problems) - MAX_NOTED_ITEMS} more" if len(problems) > MAX_NOTED_ITEMS else ""
    )
    count = f"{len(problems)} malformed item{'s' if len(problems) != 1 else ''}"
    return f"{method}: {count} left out: {shown}{more}"


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
