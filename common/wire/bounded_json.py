"""Parse JSON from someone we do not trust: bounded nesting, no duplicate keys, one error type.

Both sides use it (standard library only, no Django): the control plane for supervisor answers,
REST and proxy bodies and admin fields, the supervisor for its routes. The standard parser
recurses per nesting level, so `'[' * 100000` raises RecursionError (not ValueError) and a
merely deep document parses but breaks every recursive consumer after it (schema validation,
`json.dumps` into a row). Here anything the parser or the limits refuse is a `JSONRefused`,
a ValueError, so callers that already handle bad JSON keep doing so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Control-plane documents are a handful of levels deep (a layout: fleet > domains > slots >
# models > engine > args); 64 leaves room for any honest one and stops hostile ones early.
DEFAULT_MAX_DEPTH = 64


class JSONRefused(ValueError):
    """The text is not JSON, or breaks a limit; the message names where and why."""


class _Pairs(dict):
    """An object whose source repeated a key; the walk below reports it with its path."""

    duplicates: list[str]


class _Repeated(Exception):  # noqa: N818 - a signal inside the parse, never seen outside
    """Raised by the strict hook at the first repeated key; the parse is then redone to name it."""


def _strict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # The common case in C: a dict of the pairs is shorter than them only if a key repeated.
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Repeated
    return out


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    repeated: list[str] = []
    for key, value in pairs:
        if key in out:
            repeated.append(key)
        out[key] = value
    if not repeated:
        return out
    marked = _Pairs(out)
    marked.duplicates = repeated
    return marked


# Decoders keep no state between calls: built once, not per document (json.loads with a hook
# builds one per call).
_STRICT = json.JSONDecoder(object_pairs_hook=_strict)
_MARKING = json.JSONDecoder(object_pairs_hook=_object)
_PLAIN = json.JSONDecoder()


_JSON_WHITESPACE = " \t\n\r"  # RFC 8259's whitespace, the only kind json allows around values


def _decode(decoder: json.JSONDecoder, source: str) -> Any:
    """`decoder.decode(source)`, with its common case taken straight to the C scanner.

    A body as clients send it has no whitespace before the value: the scanner reads it from
    the first character, and `decode`'s two Python frames and two whitespace matches (about
    0.7 us of the 3.1 us a one-message chat body took) are skipped. Anything else (whitespace
    before, anything but whitespace after, an error) goes through `decode` itself, which says
    what is wrong as the standard parser does.
    """
    # The C scanner JSONDecoder builds in __init__ (an attribute the type stubs leave out).
    scan: Callable[[str, int], tuple[Any, int]] = decoder.scan_once  # type: ignore[attr-defined]
    try:
        value, end = scan(source, 0)
    except StopIteration:
        return decoder.decode(source)
    if source[end:].strip(_JSON_WHITESPACE):
        return decoder.decode(source)  # more than whitespace after the value: "Extra data"
    return value


def _path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def check_tree(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH, where: str = "") -> None:
    """Refuse a parsed tree nested deeper than `max_depth` or holding a repeated key.

    Iterative, so the check itself cannot overflow the stack it protects.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > max_depth:
            raise JSONRefused(f"{path or '(root)'}: nested deeper than {max_depth} levels")
        if isinstance(node, _Pairs):
            name = _path(path, node.duplicates[0])
            raise JSONRefused(f"{name}: duplicate key {node.duplicates[0]!r}")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list):
                stack.append((child, _path(path, key), depth + 1))


def loads(
    text: str | bytes | bytearray,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    allow_duplicates: bool = False,
) -> Any:
    """Parse `text`; raise JSONRefused for bad JSON, nesting past `max_depth`, or (unless
    allowed) a key repeated in one object, naming the path."""
    marked = False
    try:
        if isinstance(text, str):
            source = text
        elif isinstance(text, bytes | bytearray):
            # As json.loads reads bytes: UTF-8, -16 or -32, told apart by the first bytes. An
            # object whose second byte is not NUL is UTF-8 (json.detect_encoding's own rule),
            # which is every request body in practice: said here without the call.
            utf8 = text[:1] == b"{" and text[1:2] not in (b"\x00", b"")
            encoding = "utf-8" if utf8 else json.detect_encoding(text)
            source = text.decode(encoding, "surrogatepass")
        else:
            raise TypeError(f"JSON must be str or bytes, not {type(text).__name__}")
        try:
            value = _decode(_PLAIN if allow_duplicates else _STRICT, source)
        except _Repeated:
            # Rare, so parsed again: this time marking each object that repeats a key, for the
            # walk below to name the first one by its path.
            value, marked = _MARKING.decode(source), True
    except RecursionError as exc:
        raise JSONRefused(f"nested deeper than {max_depth} levels") from exc
    except (ValueError, TypeError) as exc:
        raise JSONRefused(f"not valid JSON: {exc}") from exc
    # Every container opens with one of these two characters (more may sit inside strings), so
    # a text with no more of them than the limit cannot nest past it: most documents skip the walk.
    if marked or source.count("[") + source.count("{") > max_depth:
        check_tree(value, max_depth=max_depth)
    return value
