"""Decoding a large ``msgspec.Raw`` input in slices, so the caller's loop keeps turning.

msgspec holds the GIL for a whole decode, and so does the stdlib scanner that looks for
duplicate keys: 90 MB of JSON text is one long stall of the caller's loop. When the schema's
long list is the top-level value or a field of a top-level struct (a plain ``list[T]``, as in
:mod:`._slices`), the text of that array is cut into slices of about ``SLICE_BYTES`` and each
is decoded as ``list[T]`` and checked for duplicate and merged keys on its own, with a
checkpoint between steps; the rest of the document, with the array emptied, goes through
:func:`to_exact_value` like any small input. The items are then put back.

No byte of the input is trusted to say where an element ends. A cut is tried at a comma that
looks like the separator between the first two elements; ``[`` + the text since the previous
cut + ``]`` only decodes when that comma lies between two elements of this very array (a cut
inside a string or a nested value leaves an open string or bracket). The array itself is found
by its key; the text before it, closed with ``null}``, must decode as one object, so the key is
a top-level one. Whatever does not fit (malformed text, odd layouts, huge single elements after
a few tries) falls back to the whole decode, which gives msgspec's own first error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._canonical import TOO_DEEP, duplicate_keys_message, merged_keys_message, to_exact_value
from ._messages import content_free
from ._perf import paused_gc
from ._refusals import duplicate_key_path, keys_may_merge, merged_key_path

__all__ = ["RAW_FROM", "SLICE_BYTES", "decode_raw_sliced"]

#: Raw inputs shorter than this are decoded whole.
RAW_FROM = 1 << 20
#: Decoding and key-checking a slice this size holds the GIL for a few milliseconds.
SLICE_BYTES = 256 << 10
_TRIES = 8
_WS = rb"[ \t\n\r]*"
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEM_PATH = re.compile(r"`\$\[(\d+)\]")
_SKIP_WS = re.compile(_WS)

Checkpoint = Callable[[], Awaitable[None]]


class _NotCutError(Exception):
    """The sliced decode does not apply here: decode the whole."""


async def decode_raw_sliced(
    raw: msgspec.Raw, schema: Any, checkpoint: Checkpoint
) -> tuple[Any, list[Any] | None]:
    """:func:`to_exact_value` of a ``Raw`` input: same value and same ``ValueError`` cases.

    Also the long list it built itself when it cut one (see :func:`release`), else None.
    """
    data = memoryview(raw)  # not copied: 90 MB of memcpy alone is a long step
    plan = _plan(data, schema)
    if plan is None:
        return to_exact_value(raw, schema), None
    attr, list_type, opened, where = plan
    try:
        with paused_gc():
            found = await _array(data, opened, list_type, where, schema, checkpoint)
        items, closed, problem = found
    except _NotCutError:
        return to_exact_value(raw, schema), None
    prefix, suffix = bytes(data[:opened]), bytes(data[closed + 1 :])
    if attr is None:
        if prefix.strip() or suffix.strip():
            return to_exact_value(raw, schema), None
        if problem is not None:
            raise ValueError(problem)
        return items, items
    try:
        head = to_exact_value(msgspec.Raw(prefix + b"[]" + suffix), schema)
    except ValueError as exc:
        if "malformed" in str(exc) or "truncated" in str(exc):
            # Byte offsets in the emptied text are not the input's: let the whole say where.
            return to_exact_value(raw, schema), None
        raise
    if problem is not None:
        raise ValueError(problem)
    return msgspec.structs.replace(head, **{attr: items}), items


def _plan(data: memoryview, schema: Any) -> tuple[str | None, Any, int, str] | None:
    """(struct attribute or None, ``list[T]``, offset of the array's ``[``, its path)."""
    if len(data) < RAW_FROM:
        return None
    try:
        info = mi.type_info(schema)
    except (TypeError, ValueError):
        return None
    if _plain_list(info):
        start = _SKIP_WS.match(data).end()  # type: ignore[union-attr]  # always matches
        return (None, schema, start, "$") if bytes(data[start : start + 1]) == b"[" else None
    if not isinstance(info, mi.StructType) or info.array_like or hasattr(info.cls, "__post_init__"):
        return None
    types = {f.name: f.type for f in msgspec.structs.fields(info.cls)}
    for field in info.fields:
        if not _plain_list(field.type):
            continue
        key = msgspec.json.encode(field.encode_name)
        found = re.compile(re.escape(key) + _WS + b":" + _WS + rb"\[").search(data)
        if found is None:
            continue
        opened = found.end() - 1
        try:  # the key must be a member of the top-level object, not of a nested one
            _TOP.decode(bytes(data[:opened]) + b"null}")
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        return field.name, types[field.name], opened, f"$.{field.encode_name}"
    return None


def _plain_list(info: mi.Type) -> bool:
    return isinstance(info, mi.ListType) and info.min_length is None and info.max_length is None


@functools.lru_cache(maxsize=256)
def _list_decoder(list_type: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(list_type)


async def _array(
    data: memoryview, opened: int, list_type: Any, where: str, schema: Any, checkpoint: Checkpoint
) -> tuple[list[Any], int, str | None]:
    """The array's items, the offset of its ``]``, and the first key problem found in it."""
    start = _SKIP_WS.match(data, opened + 1).end()  # type: ignore[union-attr]  # always matches
    if bytes(data[start : start + 1]) in (b"]", b""):
        raise _NotCutError
    separator = re.compile(b"," + _WS + re.escape(bytes(data[start : start + 1])))
    decoder = _list_decoder(list_type)
    merge = keys_may_merge(schema)
    items: list[Any] = []
    duplicate: str | None = None
    merged: str | None = None
    while True:
        end, chunk, part = await _next_cut(
            data, start, separator, decoder, where, len(items), checkpoint
        )
        base = len(items)
        items.extend(part)
        await checkpoint()
        if duplicate is None:  # as for the whole text: a duplicate is named before a merge
            # The key check names object members `[...]`, never by a key of the input.
            duplicate = _duplicate(chunk, "$" if where == "$" else "$[...]", base)
            if merge and merged is None:
                merged = _merged(chunk, part, where, base)
            await checkpoint()
        if bytes(data[end : end + 1]) == b"]":
            return items, end, duplicate or merged
        start = end + 1


async def _next_cut(
    data: memoryview,
    start: int,
    separator: re.Pattern[bytes],
    decoder: msgspec.json.Decoder[Any],
    where: str,
    base: int,
    checkpoint: Checkpoint,
) -> tuple[int, bytes, list[Any]]:
    """The next slice: where it ends (a comma, or the array's ``]``), its text and its items."""
    commas: list[int] = []
    for found in separator.finditer(data, min(start + SLICE_BYTES, len(data))):
        commas.append(found.start())
        if len(commas) == _TRIES:
            break
    # The array's end lies before the first candidate comma when no comma fits: try the
    # closing brackets there, from the last one back.
    high = commas[0] if commas else len(data)
    low = max(start, high - 4 * SLICE_BYTES)  # a longer tail after the array: decode whole
    window = bytes(data[low:high])
    closers: list[int] = []
    while len(closers) < _TRIES:
        high = window.rfind(b"]", 0, high - low) + low
        if high < low:
            break
        closers.append(high)
    for end in commas + closers:
        chunk = b"".join((b"[", data[start:end], b"]"))
        part = _decoded(chunk, decoder, where, base)
        if part:  # an empty slice would accept a stray comma (`[1,,2]`, `[1,]`)
            return end, chunk, part
        await checkpoint()
    raise _NotCutError


def _decoded(
    chunk: bytes, decoder: msgspec.json.Decoder[Any], where: str, base: int
) -> list[Any] | None:
    """The slice's items; None when the cut is not between two elements."""
    try:
        return decoder.decode(chunk)  # type: ignore[no-any-return]
    except msgspec.DecodeError:
        return None  # a wrong cut, or malformed text (then the whole decode says where)
    except msgspec.ValidationError as exc:
        try:
            _RAW_LIST.decode(chunk)
        except msgspec.DecodeError:
            return None  # the cut closed a nested value early: not a real error
        message = _shifted(content_free(exc), where, base)
        raise ValueError(
            f"exact_response does not validate against exact_schema: {message}"
        ) from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None


def _duplicate(chunk: bytes, where: str, base: int) -> str | None:
    try:
        path = duplicate_key_path(chunk)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    return None if path is None else duplicate_keys_message(_shifted_path(path, where, base))


def _merged(chunk: bytes, part: list[Any], where: str, base: int) -> str | None:
    path = merged_key_path(part, msgspec.json.decode(chunk))
    return None if path is None else merged_keys_message(_shifted_path(path, where, base))


def _shifted_path(path: str, where: str, base: int) -> str:
    return _shifted(f"`{path}`", where, base)[1:-1]


def _shifted(message: str, where: str, base: int) -> str:
    """A slice's path (``$[i]...``) as a path in the whole input."""
    return _ITEM_PATH.sub(lambda m: f"`{where}[{int(m.group(1)) + base}]", message, count=1)
