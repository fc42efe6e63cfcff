"""Why a value cannot be written as canonical JSON without changing it. Pure: no I/O.

msgspec writes NaN and infinities as ``null``, and writes ``{1: "a", "1": "b"}`` as an object
with the key ``"1"`` twice, which every decoder reads back as one key. Both would store a value
other than the one handed in, so they are refused, as are strings JSON cannot carry (lone
surrogates). :func:`first_problem` walks a value and names the first such place by its path,
in msgspec's notation: ``$.field`` for a struct field, ``$[3]`` for an array item and
``$[...]`` for the value of a mapping key or a set member, so a path never quotes a key or a
value of the response. The walk is iterative (no recursion limit) and is only run when the
fast encoder has already seen something suspicious.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._own import field_of, fields, is_array, is_struct, plain

__all__ = [
    "decoded_or_text",
    "duplicate_key_path",
    "first_problem",
    "is_refusal",
    "keys_may_merge",
    "merged_key_path",
    "nodes",
    "path_of",
    "refused",
    "type_nodes",
]

_LEAVES = (str, float, bool, int, bytes, bytearray, memoryview, msgspec.Raw, type(None))
#: Types whose instances :func:`_own.plain` leaves as they are (looked up before calling it).
_EXACT = frozenset({dict, list, tuple, str, float, bool, int, type(None)})


def first_problem(value: Any) -> str | None:
    """The first reason ``value`` cannot be canonical JSON, with its path; None if there is none.

    Reasons: a NaN or infinite float (as a value or a key), a string or key that is not valid
    Unicode (a lone surrogate), and two keys of one mapping that become the same JSON string.
    """
    for item, where in nodes(value):
        if issubclass(type(item), str):  # by type, as the encoder looks (``_own``)
            problem = (
                None
                if _is_unicode(item)
                else "a string that is not valid Unicode (a lone surrogate)"
            )
        elif issubclass(type(item), float):
            problem = None if math.isfinite(item) else "NaN or infinity"
        elif type(item) is dict:
            problem = _key_problem(item)
        else:
            continue
        if problem is not None:
            return f"{problem} at `{path_of(where)}`"
    return None


#: Where a node is: ``"$"``, or (where its container is, its index or ``"[...]"`` or
#: ``".field"``). Made per node instead of the path's text, which is made only when asked for.
Where = str | tuple[Any, int | str]


def nodes(value: Any) -> Iterator[tuple[Any, Where]]:
    """Every node of ``value`` and where it is, in document order (iterative: no depth limit).

    Goes into mappings (their values), sequences, sets, structs (by encoded field name) and
    what msgspec would encode any other object as (an enum, a dataclass, a datetime). A
    container or struct is seen as msgspec writes it (``_own``): a subclass's methods hid a
    NaN that was then stored as ``null``, and a ``__len__`` over the count made this walk
    build a list of that length.
    """
    stack: list[tuple[Any, Where]] = [(value, "$")]
    while stack:
        item, where = stack.pop()
        if type(item) not in _EXACT:
            item = plain(item)
        yield item, where
        if isinstance(item, _LEAVES):
            continue
        if type(item) is dict:
            member = (where, "[...]")  # one for every value: the path never names a key
            stack.extend([(v, member) for v in reversed(item.values())])
        elif is_array(item):
            stack.extend([(item[i], (where, i)) for i in range(len(item) - 1, -1, -1)])
        elif isinstance(item, set | frozenset):
            stack.extend([(v, (where, "[...]")) for v in item])
        elif is_struct(item):
            stack.extend([(field_of(item, n), (where, "." + c)) for n, c in reversed(fields(item))])
        else:
            try:
                builtins = msgspec.to_builtins(item, builtin_types=(msgspec.Raw,))
            except (TypeError, ValueError):
                continue  # the encoder refuses these itself, with a type name
            if builtins is not item:
                stack.append((builtins, where))


def path_of(where: Where) -> str:
    """The path :func:`nodes` said a node is at: ``$.field[3][...]``."""
    steps: list[str] = []
    while isinstance(where, tuple):
        where, step = where
        steps.append(f"[{step}]" if isinstance(step, int) else step)
    return "$" + "".join(reversed(steps))


def _key_problem(mapping: dict[Any, Any]) -> str | None:
    keys: list[Any] = list(mapping)
    if not all(type(k) is str for k in keys):
        for key in keys:
            if isinstance(key, float) and not math.isfinite(key):
                return "NaN or infinity as a key of the object"
        try:
            # The same conversion the encoder applies to non-str keys.
            keys = list(msgspec.to_builtins(dict.fromkeys(keys), str_keys=True))
        except (TypeError, ValueError):
            return "a key JSON cannot express in the object"
        if len(keys) != len(mapping):
            return "two keys that are the same JSON string in the object"
    for key in keys:
        if isinstance(key, str) and not _is_unicode(key):
            return "a key that is not valid Unicode (a lone surrogate) in the object"
    return None


def _is_unicode(text: str) -> bool:
    # str's own methods: a subclass's may say otherwise of the text the encoder writes.
    if str.isascii(text):
        return True
    try:
        str.encode(text, "utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _DuplicateKeyError(Exception):
    """An object in JSON text names one key twice."""


class _Pairs(list[tuple[str, Any]]):
    """An object's members in document order, duplicates kept."""


def decoded_or_text(text: str) -> Any:
    """The value the JSON ``text`` holds, or ``text`` itself where only the text is exact.

    Tools and MCP servers often return JSON as text. It stays text when it is not JSON, nests
    too deeply to decode, names a key twice (a decoder keeps one of them), or has keys that
    cannot be checked.
    """
    try:
        value = msgspec.json.decode(text)
        return text if duplicate_key_path(text.encode()) is not None else value
    except (msgspec.DecodeError, RecursionError, ValueError):  # UnicodeError is a ValueError
        return text


def duplicate_key_path(data: bytes) -> str | None:
    """The path of the first object in the JSON text ``data`` that names a key twice, or None.

    msgspec, like most decoders, keeps the last of two equal keys, so a document with
    ``{"a": 1, "a": 2}`` would be stored as something other than what was sent. ``data``
    must already have decoded with msgspec (valid UTF-8 JSON): the stdlib scanner here sees
    every member, and only when it finds a duplicate does a second pass locate it.
    """
    try:
        json.loads(data, object_pairs_hook=_no_duplicates)
    except _DuplicateKeyError:
        pass
    except ValueError:
        # Text msgspec accepted and the stdlib scanner does not: say so rather than skip.
        raise ValueError("exact_response is JSON text whose keys cannot be checked") from None
    else:
        return None
    stack: list[tuple[Any, str]] = [(json.loads(data, object_pairs_hook=_Pairs), "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Pairs):
            if len({key for key, _ in item}) != len(item):
                return path
            stack.extend((member, f"{path}[...]") for _, member in item)
        elif isinstance(item, list):
            stack.extend((member, f"{path}[{i}]") for i, member in enumerate(item))
    return "$"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len({key for key, _ in pairs}) != len(pairs):
        raise _DuplicateKeyError


@functools.lru_cache(maxsize=256)
def keys_may_merge(schema: Any) -> bool:
    """Whether decoding JSON text against ``schema`` could turn two distinct keys into one.

    A mapping whose key type is not ``str`` (or ``Any``) parses its keys: ``"1"`` and
    ``"1.0"`` are both the float ``1.0``, two spellings of one UUID are one UUID. Only such
    schemas pay for :func:`merged_key_path`.
    """
    try:
        root = mi.type_info(schema)
    except (TypeError, ValueError):
        return True
    return any(
        isinstance(node, mi.DictType) and not isinstance(node.key_type, mi.StrType | mi.AnyType)
        for node in type_nodes(root)
    )


def type_nodes(root: Any) -> Iterator[Any]:
    """Every node of a ``msgspec.inspect`` type tree, once each (a recursive schema too)."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if isinstance(node, mi.Field):
            stack.append(node.type)
        elif isinstance(node, mi.Type):
            for name in node.__struct_fields__:
                child = getattr(node, name)
                stack.extend(child if isinstance(child, tuple) else (child,))


def merged_key_path(typed: Any, untyped: Any) -> str | None:
    """The path of the first mapping that has fewer keys in ``typed`` than in ``untyped``.

    ``typed`` and ``untyped`` are one JSON text (free of duplicate keys) decoded against the
    schema and as plain JSON. Both keep document order, so as long as no keys merged, the
    members of a mapping pair up in order; a struct pairs with its encoded field names.
    """
    stack: list[tuple[Any, Any, str]] = [(typed, untyped, "$")]
    while stack:
        value, given, path = stack.pop()
        given = plain(given)  # the caller's input: its own items, as they were converted
        if type(value) is dict and type(given) is dict:
            if len(value) != len(given):
                return path
            stack.extend(
                (v, p, f"{path}[...]") for v, p in zip(value.values(), given.values(), strict=True)
            )
        elif is_struct(value):
            names = fields(value)
            if type(given) is dict:
                stack.extend(
                    (field_of(value, name), given[encoded], f"{path}.{encoded}")
                    for name, encoded in names
                    if encoded in given
                )
            elif is_array(given):  # array_like: fields in order, after the tag if any
                items = given[1:] if type(value).__struct_config__.tag is not None else given
                stack.extend(
                    (field_of(value, name), item, f"{path}.{encoded}")
                    for (name, encoded), item in zip(names, items, strict=False)
                )
        elif is_array(value) and is_array(given):
            stack.extend(
                (v, p, f"{path}[{i}]") for i, (v, p) in enumerate(zip(value, given, strict=False))
            )
    return None


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` refuses the exact value itself (not a summary schema or a fallback).

    Every such message of the library's starts with ``exact_response``.
    """
    return isinstance(exc, ValueError) and str(exc).startswith("exact_response ")


def refused(problem: str) -> ValueError:
    """The error for a value canonical JSON would change (``problem``: what, and where)."""
    return ValueError(f"exact_response contains {problem}, which canonical JSON refuses")
