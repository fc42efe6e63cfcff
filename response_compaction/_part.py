"""Bounded parts of a stored JSON value: pointers, windows, outlines. Pure: no I/O.

An agent cannot take a 90 MB value into its context, but it can look at it piece by piece:
an RFC 6901 pointer names a node, ``[start, stop)`` names a window of it, and every answer's
JSON fits in ``max_bytes``. Arrays and objects (members in key order) are cut between whole
items; when not even the first item fits, the answer is an *outline* of the items instead
(key or index, type, size, length) so the agent can point further down; a string is cut
between characters, with :data:`CUT_MARKER` at the end when more of it follows.

The node is found without decoding the value into Python objects: each level is scanned by
msgspec as ``list[Raw]`` / ``dict[str, Raw]``, which costs about as much as hashing the bytes
and builds one small object per child. Only what is shown is decoded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from ._encoding import line_safe
from ._part_index import BigArray, Node, RootObject

__all__ = [
    "CUT_MARKER",
    "MIN_MAX_BYTES",
    "Part",
    "check_request",
    "parse_pointer",
    "part_of",
    "walk",
]

#: The smallest ``max_bytes`` a part may be asked for: room for an outline entry.
MIN_MAX_BYTES = 256
#: Ends a string that was cut: more of it follows at ``next_start``.
CUT_MARKER = "…[cut]"

_LIST = msgspec.json.Decoder(list[Raw])
_DICT = msgspec.json.Decoder(dict[str, Raw])
_ANY = msgspec.json.Decoder()
_STR = msgspec.json.Decoder(str)
_CANONICAL = msgspec.json.Encoder(order="sorted").encode


def _ENCODE(value: Any) -> bytes:  # noqa: N802 - the encoder of what a part shows
    return line_safe(_CANONICAL(value))


#: A pointer's walk scans at most about this many times the first node it decodes (see walk).
_SCAN_FACTOR = 4
_SCAN_SLACK = 1 << 16
_T = TypeVar("_T")
_INDEX = re.compile(r"0|[1-9][0-9]*")
_ESCAPE = re.compile(r"~(?![01])")
_KINDS = {
    ord("{"): "object",
    ord("["): "array",
    ord('"'): "string",
    ord("t"): "boolean",
    ord("f"): "boolean",
    ord("n"): "null",
}


class Part(Struct, frozen=True, kw_only=True):
    """A bounded view of the node at ``pointer`` in an exact value.

    ``json`` is the JSON shown (its UTF-8 size is at most the ``max_bytes`` asked for; U+2028,
    U+2029 and U+0085 written as JSON escapes, so it is one line) and ``value`` is that JSON
    decoded to builtins. ``complete`` is True when the whole node is
    shown. ``total_bytes`` is the node's canonical size and ``total_items`` its array length
    or object key count (``UNSET`` for scalars and strings). For arrays and objects
    ``start``/``stop`` is the window of items shown (object members count in key order);
    for strings it is the window of characters. A number too long for ``max_bytes`` (an
    integer of thousands of digits) is shown like a string of its digits, cut and windowed
    by character. ``next_start`` is where the next window
    begins, ``UNSET`` when nothing follows. ``outline`` is True when not even one item fitted:
    ``json`` is then a list describing the items (``{"index"|"key", "type", "bytes",
    "items"|"keys"}``), not their content.
    """

    pointer: str
    json: str
    value: Any
    complete: bool
    total_bytes: int
    total_items: int | UnsetType = UNSET
    start: int | UnsetType = UNSET
    stop: int | UnsetType = UNSET
    next_start: int | UnsetType = UNSET
    outline: bool = False


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 pointer; ``ValueError`` when it is malformed."""
    if not isinstance(pointer, str):
        raise ValueError(f"pointer must be a str, got {type(pointer).__name__}")  # noqa: TRY004 - the contract: a malformed request is a ValueError
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError("pointer must be empty or start with '/' (RFC 6901)")
    if _ESCAPE.search(pointer):
        raise ValueError("pointer has a '~' not followed by '0' or '1' (RFC 6901)")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def check_request(start: int | None, stop: int | None, max_bytes: int) -> None:
    """``ValueError`` unless the window and the bound are ones a part can be cut to."""
    for name, bound in (("start", start), ("stop", stop)):
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool)):
            raise ValueError(f"{name} must be an int or None, got {type(bound).__name__}")
        if bound is not None and bound < 0:
            raise ValueError(f"{name} must be >= 0")
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
        raise ValueError(f"max_bytes must be an int, got {type(max_bytes).__name__}")  # noqa: TRY004 - as above
    if max_bytes < MIN_MAX_BYTES:
        raise ValueError(f"max_bytes must be >= {MIN_MAX_BYTES}")


def part_of(
    data: Node,
    pointer: str = "",
    *,
    start: int | None = None,
    stop: int | None = None,
    max_bytes: int = 65536,
) -> Part:
    """The part of the JSON document ``data`` at ``pointer``, windowed and bounded.

    ``data`` is the document's bytes, or the node :func:`index_document` made of them.
    Raises ``ValueError`` for a malformed pointer or request, ``LookupError`` when the
    pointer names nothing, and ``msgspec.DecodeError`` when ``data`` is not JSON.
    """
    tokens = parse_pointer(pointer)
    check_request(start, stop, max_bytes)
    node = locate(data, tokens)
    return show(node, pointer, start, stop, max_bytes)


def locate(data: Node, tokens: Sequence[str]) -> Node:
    """The node ``tokens`` name; ``LookupError`` naming the depth if none."""
    return walk(data, tokens)[0]


def walk(data: Node, tokens: Sequence[str], *, slack: int = _SCAN_SLACK) -> tuple[Node, int]:
    """The node ``tokens`` name and how many bytes finding it scanned.

    A step decodes a node as ``list[Raw]`` or ``dict[str, Raw]``, which scans its whole
    subtree: down a deep path that costs depth x size (900 levels into 1 MB froze the loop
    for 1.5 s, 7 MB took 11 s). Once the steps have scanned :data:`_SCAN_FACTOR` times the
    first node they decoded, the rest of the path is walked in one node's decoded value: one
    linear decode, paid for in memory, and the node found is encoded again (canonical bytes
    decode and encode to themselves). ``slack`` is added to that allowance.
    """
    node, scanned, allowance, by_value = data, 0, None, True
    for depth, token in enumerate(tokens):
        if not isinstance(node, BigArray | RootObject):
            size = _size(node)
            allowance = _SCAN_FACTOR * size + slack if allowance is None else allowance
            scanned += size
            if by_value and scanned > allowance and depth + 1 < len(tokens):
                try:
                    return _by_value(node, tokens[depth:], depth), scanned
                except msgspec.ValidationError:
                    # An integer past this process's digit limit (another process wrote
                    # it under a higher one): the bytes are fine, only slower to walk.
                    by_value = False
        node = _step(node, token, depth)
    return node, scanned


def _step(node: Node, token: str, depth: int) -> Node:
    kind = _kind(node)
    if kind == "object":
        return _child(_members(node), token, depth)
    if kind == "array":
        return _child(_items(node), token, depth)
    raise LookupError(f"pointer goes below a {kind} at depth {depth + 1}")


def _by_value(node: Node, tokens: Sequence[str], depth: int) -> bytes:
    """The canonical JSON of the node ``tokens`` name below ``node`` (at ``depth``)."""
    value: Any = _ANY.decode(_flat(node))
    for level, token in enumerate(tokens, depth):
        if not isinstance(value, dict | list):
            raise LookupError(f"pointer goes below a {_kind_of(value)} at depth {level + 1}")  # noqa: TRY004 - the contract: names nothing
        value = _child(value, token, level)
    return _CANONICAL(value)


def _child(container: Mapping[str, _T] | Sequence[_T], token: str, depth: int) -> _T:
    if isinstance(container, Mapping):
        if token not in container:
            raise LookupError(f"pointer names no member at depth {depth + 1}")
        return container[token]
    if _INDEX.fullmatch(token) is None:
        raise LookupError(f"pointer token at depth {depth + 1} is not an array index")
    # A token of thousands of digits is a well-formed index past any end; int() would refuse
    # it (Python's digit limit) with a ValueError, as if the pointer were malformed.
    if len(token) > len(str(len(container))) or int(token) >= len(container):
        raise LookupError(f"array index at depth {depth + 1} is out of range")
    return container[int(token)]


def _kind_of(value: object) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def show(node: Node, pointer: str, start: int | None, stop: int | None, limit: int) -> Part:
    """The bounded part of one located node."""
    kind = _kind(node)
    if kind == "object":
        members = _members(node)
        return _window(node, pointer, list(members), list(members.values()), start, stop, limit)
    if kind == "array":
        return _window(node, pointer, None, _items(node), start, stop, limit)
    assert not isinstance(node, BigArray | RootObject)  # noqa: S101 - _kind said so
    if kind == "string":
        return _string(_STR.decode(node), _size(node), pointer, start, stop, limit)
    text = bytes(node).decode()
    if len(text) > limit:
        # Integers are kept exactly up to 4300 digits, more than a part may hold: such a
        # number is shown as a string of its digits, cut and paged like any string.
        return _string(text, len(text), pointer, start, stop, limit)
    # Other numbers, booleans and null are a few dozen bytes at most: always whole.
    return Part(
        pointer=pointer, json=text, value=_ANY.decode(node), complete=True, total_bytes=_size(node)
    )


def _members(node: Node) -> dict[str, Raw | BigArray] | dict[str, Raw]:
    return node.members if isinstance(node, RootObject) else _DICT.decode(_flat(node))


def _items(node: Node) -> Sequence[Raw]:
    return node.items() if isinstance(node, BigArray) else _LIST.decode(_flat(node))


def _flat(node: Node) -> bytes | memoryview | Raw:
    assert not isinstance(node, BigArray | RootObject)  # noqa: S101 - callers checked
    return node


def _json_if_within(node: Node, room: int) -> bytes | None:
    """The node's JSON when it is at most ``room`` bytes, without copying one that is not."""
    if _size(node) > room:
        return None
    data = line_safe(node.raw_bytes() if isinstance(node, BigArray) else bytes(_flat(node)))
    return data if len(data) <= room else None


@dataclass(slots=True)
class _Fill:
    """Items joined inside brackets, never past ``limit`` bytes."""

    limit: int
    parts: list[bytes]
    size: int = 2  # the brackets

    def room(self) -> int:
        return self.limit - self.size - (1 if self.parts else 0)

    def add(self, piece: bytes) -> bool:
        extra = len(piece) + (1 if self.parts else 0)
        if self.size + extra > self.limit:
            return False
        self.parts.append(piece)
        self.size += extra
        return True


def _window(
    node: Node,
    pointer: str,
    keys: list[str] | None,
    children: Sequence[Raw | BigArray],
    start: int | None,
    stop: int | None,
    limit: int,
) -> Part:
    count = len(children)
    first = min(start or 0, count)
    last = count if stop is None else max(first, min(stop, count))
    fill = _Fill(limit, [])
    end = first
    while end < last:
        prefix = b"" if keys is None else _ENCODE(keys[end]) + b":"
        value = _json_if_within(children[end], fill.room() - len(prefix))
        if value is None or not fill.add(prefix + value):
            break
        end += 1
    outline = end == first < last
    if outline:
        fill = _Fill(limit, [])
        while end < last:
            key: str | int = end if keys is None else keys[end]
            if not fill.add(_outline_entry(key, children[end], keys is not None, limit - 2)):
                break
            end += 1
        brackets = b"[]"
    else:
        brackets = b"[]" if keys is None else b"{}"
    body = brackets[:1] + b",".join(fill.parts) + brackets[1:]
    return Part(
        pointer=pointer,
        json=body.decode(),
        value=_ANY.decode(body),
        complete=not outline and first == 0 and end == count,
        total_bytes=_size(node),
        total_items=count,
        start=first,
        stop=end,
        next_start=end if end < count else UNSET,
        outline=outline,
    )


def _outline_entry(key: str | int, child: Raw | BigArray, keyed: bool, room: int) -> bytes:
    """``{"index"|"key", "type", "bytes", "items"|"keys"}`` of one item, within ``room``."""
    kind = _kind(child)
    entry: dict[str, Any] = {"type": kind, "bytes": _size(child)}
    if kind == "array":
        entry["items"] = len(_items(child))
    elif kind == "object":
        entry["keys"] = len(_members(child))
    if not keyed:
        entry["index"] = key
        return _ENCODE(entry)
    entry["key"] = ""
    # A key too long to show whole is cut like any string, so the entry always fits.
    entry["key"] = _fit(str(key), room - len(_ENCODE(entry)) + 2)[0]
    return _ENCODE(entry)


def _string(
    text: str, total: int, pointer: str, start: int | None, stop: int | None, limit: int
) -> Part:
    count = len(text)
    first = min(start or 0, count)
    last = count if stop is None else max(first, min(stop, count))
    shown, end = _fit(text[first:last], limit, more_after=last < count)
    end += first
    body = _ENCODE(shown)
    return Part(
        pointer=pointer,
        json=body.decode(),
        value=shown,
        complete=first == 0 and end == count,
        start=first,
        stop=end,
        next_start=end if end < count else UNSET,
        total_bytes=total,
    )


def _fit(text: str, limit: int, *, more_after: bool = False) -> tuple[str, int]:
    """The longest head of ``text`` whose JSON fits ``limit`` bytes, marked when it is cut.

    Returns the string to show and how many characters of ``text`` it holds. Cutting a
    Python string never splits a character, so the UTF-8 of the result is always whole.
    """
    # Each character is at least one byte of JSON, so a longer text is not encoded to find out.
    if not more_after and len(text) <= limit and len(_ENCODE(text)) <= limit:
        return text, len(text)
    low, high = 0, min(len(text), limit)
    while low < high:
        mid = (low + high + 1) // 2
        if len(_ENCODE(text[:mid] + CUT_MARKER)) <= limit:
            low = mid
        else:
            high = mid - 1
    if low == len(text) and not more_after:
        return text, low
    return text[:low] + CUT_MARKER, low


def _kind(node: Node) -> str:
    if isinstance(node, BigArray):
        return "array"
    if isinstance(node, RootObject):
        return "object"
    view = memoryview(node)
    if not view:
        raise msgspec.DecodeError("empty JSON value")
    return _KINDS.get(view[0], "number")


def _size(node: Node) -> int:
    return node.size if isinstance(node, BigArray | RootObject) else len(memoryview(node))
