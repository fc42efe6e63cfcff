"""Decoding a large ``msgspec.Raw`` input in slices, so the caller's loop keeps turning.

msgspec holds the GIL for a whole decode, and so does the stdlib scanner that looks for
duplicate keys: 90 MB of JSON text is one long stall of the caller's loop. When the schema is
a plain ``list[T]`` or ``dict[str, V]`` (no length or key constraints), or a top-level struct
with fields of those types, each such container in the text is cut into slices
(:mod:`._raw_cut`) decoded and key-checked on their own with a checkpoint between steps; the
rest of the document, with those containers emptied, is decoded whole like any small input,
and the containers are put back.

A field's container is found by its key, in document order; the text before it (earlier
containers emptied), closed with ``null}``, must decode as one object, so the key is a
top-level one. Every check of :func:`to_exact_value` is kept, in the order the whole decode
makes them: schema validation first (a slice's error is raised only when the text before its
container has none), then depth, then keys given twice, then keys the schema merges, each
named by the path the whole check names (its walks go last member first, so the pieces are
asked in that order). Whatever does not fit (malformed text, odd layouts, huge single elements)
falls back to the whole decode, which gives msgspec's own first error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._canonical import TOO_DEEP, duplicate_keys_message, merged_keys_message, to_exact_value
from ._messages import content_free
from ._own import field_of, fields
from ._perf import paused_gc
from ._raw_cut import SLICE_BYTES, Container, NotCutError, SliceError, cut_container
from ._refusals import duplicate_key_path, keys_may_merge, merged_key_path
from ._slices import plain_container, type_info

__all__ = ["RAW_FROM", "SLICE_BYTES", "decode_raw_sliced"]

#: Raw inputs shorter than this are decoded whole.
RAW_FROM = 1 << 20
_TRIES = 8
#: Uncut text longer than this before a container: the rest is decoded whole.
_HEAD_GAP = 16 * SLICE_BYTES
_WS = rb"[ \t\n\r]*"
_SKIP_WS = re.compile(_WS)
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_MISSING = re.compile(r"Object missing required field `[^`]*`")

Checkpoint = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Field:
    attr: str | None  # the struct attribute; None for the top-level container
    name: str  # its encoded name
    type: Any  # list[T] or dict[str, V]
    mapping: bool


async def decode_raw_sliced(
    raw: msgspec.Raw, schema: Any, checkpoint: Checkpoint
) -> tuple[Any, list[Any] | None]:
    """:func:`to_exact_value` of a ``Raw`` input: same value and same ``ValueError`` cases.

    Also the containers it built itself (see :func:`._convert.release`), else None.
    """
    data = memoryview(raw)  # not copied: 90 MB of memcpy alone is a long step
    fields = _fields(schema) if len(data) >= RAW_FROM else None
    if fields is None:
        return to_exact_value(raw, schema), None
    try:
        with paused_gc():
            if fields[0].attr is None:
                return await _top_level(data, fields[0], schema, checkpoint)
            head, containers = await _cut_fields(data, fields, schema, checkpoint)
    except NotCutError:
        return to_exact_value(raw, schema), None
    if not containers:
        return to_exact_value(raw, schema), None
    value = _head_value(head, schema)
    if value is None:  # malformed: byte offsets in the emptied text are not the input's
        return to_exact_value(raw, schema), None
    problem = _key_problem(head, value, containers, schema)
    if problem is not None:
        raise ValueError(problem)
    by_name = {f.name: f.attr for f in fields}
    put_back = {str(by_name[name]): found.value for name, found in containers.items()}
    return msgspec.structs.replace(value, **put_back), list(put_back.values())


def _fields(schema: Any) -> list[_Field] | None:
    """The containers to cut: the top-level one, or the struct's plain container fields."""
    try:
        info = type_info(schema)
    except (TypeError, ValueError):
        return None
    mapping = plain_container(info)
    if mapping is not None:
        return [_Field(None, "", schema, mapping)]
    if not isinstance(info, mi.StructType) or info.array_like or hasattr(info.cls, "__post_init__"):
        return None
    types = {f.name: f.type for f in msgspec.structs.fields(info.cls)}
    found = []
    for field in info.fields:
        mapping = plain_container(field.type)
        if mapping is not None:
            found.append(_Field(field.name, field.encode_name, types[field.name], mapping))
    return found or None


async def _top_level(
    data: memoryview, field: _Field, schema: Any, checkpoint: Checkpoint
) -> tuple[Any, list[Any]]:
    opened = _SKIP_WS.match(data).end()  # type: ignore[union-attr]  # always matches
    if bytes(data[opened : opened + 1]) != (b"{" if field.mapping else b"["):
        raise NotCutError
    merge = keys_may_merge(schema)
    try:
        found = await cut_container(
            data, opened, schema, mapping=field.mapping, where="$", merge=merge,
            checkpoint=checkpoint,
        )  # fmt: skip
    except SliceError as exc:  # nothing but whitespace before it
        raise ValueError(str(exc)) from None
    if found is None or bytes(data[found.end + 1 :]).strip(b" \t\n\r"):
        raise NotCutError
    if found.deep:
        raise ValueError(TOO_DEEP)
    if found.dup is not None:
        raise ValueError(duplicate_keys_message(found.dup))
    if found.merged is not None:
        raise ValueError(merged_keys_message(found.merged))
    return found.value, [found.value]


async def _cut_fields(
    data: memoryview, fields: list[_Field], schema: Any, checkpoint: Checkpoint
) -> tuple[bytes, dict[str, Container]]:
    """The text with each cut container emptied, and the containers by encoded name."""
    by_key = {msgspec.json.encode(f.name): f for f in fields}
    keys = b"|".join(re.escape(k) for k in by_key)
    pattern = re.compile(b"(" + keys + b")" + _WS + b":" + _WS + rb"[\[{]")
    merge = keys_may_merge(schema)
    pieces: list[bytes | memoryview] = []
    containers: dict[str, Container] = {}
    seg = pos = misses = 0
    while (match := pattern.search(data, pos)) is not None:
        field, opened, pos = by_key[match.group(1)], match.end() - 1, match.end()
        if opened - seg > _HEAD_GAP or misses > _TRIES:
            break  # a long stretch left whole, or keys met only inside nested values
        empty = b"{}" if field.mapping else b"[]"
        if field.name in containers or bytes(data[opened : opened + 1]) != empty[:1]:
            continue
        before = b"".join((*pieces, data[seg:opened]))
        try:  # the key must be a member of the top-level object, not of a nested one
            _TOP.decode(before + b"null}")
        except (msgspec.ValidationError, msgspec.DecodeError):
            misses += 1
            continue
        try:
            found = await cut_container(
                data, opened, field.type, mapping=field.mapping, where=f"$.{field.name}",
                merge=merge, checkpoint=checkpoint,
            )  # fmt: skip
        except SliceError as exc:
            if _clean(before + empty + b"}", schema):
                raise ValueError(str(exc)) from None
            raise NotCutError from None  # the text before has its own error: the whole's
        if found is not None:
            containers[field.name] = found
            pieces += [data[seg:opened], empty]
            seg = pos = found.end + 1
    pieces.append(data[seg:])
    return b"".join(pieces), containers


def _clean(before: bytes, schema: Any) -> bool:
    """Whether the text before a container has no error the whole decode would name first."""
    try:
        _decoder(schema).decode(before)
    except msgspec.ValidationError as exc:
        # A top-level field missing from the text cut short (no path: the root) is reported
        # at the object's end, after the slice; a nested object's is not.
        return _MISSING.fullmatch(str(exc)) is not None
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


@functools.lru_cache(maxsize=256)
def _decoder(schema: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(schema)


def _head_value(head: bytes, schema: Any) -> Any:
    """The rest of the document as a value of ``schema``; None when it is malformed."""
    try:
        return _decoder(schema).decode(head)
    except msgspec.ValidationError as exc:
        raise ValueError(
            f"exact_response does not validate against exact_schema: {content_free(exc)}"
        ) from None
    except msgspec.DecodeError:
        return None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None


def _key_problem(
    head: bytes, value: Any, containers: dict[str, Container], schema: Any
) -> str | None:
    """The refusal the whole key checks would give, from the head's and the slices' findings."""
    try:
        head_dup = duplicate_key_path(head)
    except RecursionError:
        return TOO_DEEP
    if any(found.deep for found in containers.values()):
        return TOO_DEEP
    if head_dup == "$":
        return duplicate_keys_message("$")
    if head_dup is not None or any(found.dup for found in containers.values()):
        # The whole scan walks the top-level members last first: ask them in that order.
        for key, member in reversed(_TOP.decode(head).items()):
            found = containers.get(key)
            path = found.dup if found is not None else duplicate_key_path(bytes(member))
            if path is not None:
                return duplicate_keys_message("$[...]" + path[1:])
    if not keys_may_merge(schema):
        return None
    plain = msgspec.json.decode(head)
    for name, encoded in reversed(fields(value)):  # as merged_key_path walks a struct
        if encoded not in plain:
            continue
        found = containers.get(encoded)
        if found is not None:
            path = found.merged
        else:
            path = merged_key_path(field_of(value, name), plain[encoded])
        if path is not None:
            return merged_keys_message(f"$.{encoded}" + path[1:])
    return None
