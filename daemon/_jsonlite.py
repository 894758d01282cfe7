"""`dumps` and `loads` for the attach bridge on the C accelerator `_json`, without `json`.

The `json` package imports `re` and three modules of its own on every client launch; its C
scanner and encoder are all the bridge uses of it. These two functions give what
`json.dumps(obj, separators=...)` and `json.loads(text)` give (the same bytes out, the
same values in, a ValueError for what `json` refuses), so the bridge's messages are unchanged.
"""

import _json

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"


class _ScanContext:
    """The attributes `json.decoder.JSONDecoder` hands the C scanner, at their defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _not_serializable(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# The stub says it takes a JSONDecoder; the C code reads only the attributes above.
_scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
_encoders: dict[tuple[str, str], _json.make_encoder] = {}


def _encoder(item_separator: str, key_separator: str) -> _json.make_encoder:
    found = _encoders.get((item_separator, key_separator))
    if found is None:
        # markers, default, encoder, indent, key separator, item separator, sort_keys,
        # skipkeys, allow_nan: json.dumps's defaults but for the separators.
        found = _encoders[(item_separator, key_separator)] = _json.make_encoder(
            {},
            _not_serializable,
            _json.encode_basestring_ascii,
            None,
            key_separator,
            item_separator,
            False,
            False,
            True,
        )
    return found


def dumps(obj: object, *, separators: tuple[str, str] | None = None) -> str:
    """As `json.dumps(obj, separators=separators)` with its other defaults."""
    if isinstance(obj, str):
        return str(_json.encode_basestring_ascii(obj))
    item_separator, key_separator = separators if separators is not None else (", ", ": ")
    return "".join(_encoder(item_separator, key_separator)(obj, 0))


def loads(data: str | bytes | bytearray) -> object:
    """One JSON document (UTF-8 when bytes); ValueError when it is not one."""
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"Expecting value at char {exc.value}") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data at char {end}")
    return value
