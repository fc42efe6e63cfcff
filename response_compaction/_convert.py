"""Converting a large builtins input to its schema in slices, so the caller's loop keeps turning.

msgspec holds the GIL for a whole ``convert`` call: a 90 MB list of rows handed over as dicts
is one long stall of the event loop, whichever thread runs it. Where it is provably the same
conversion, the long list is converted a slice at a time (as ``list[T]``) with a checkpoint
between slices, the rest of the input with that list emptied, and the items are put back.

Same rules as :mod:`._slices`: only a plain ``list[T]`` (no length bounds) that is the
top-level value or a field of a top-level struct (not array-like, no ``__post_init__``) is cut;
anything else goes to :func:`to_exact_value` whole. Every check stays: each slice is validated
by msgspec against ``T``, keys that the schema would merge are looked for in every slice, and a
failure names the path in the whole input (``$.rows[1234].id``), never a value. When the rest
of the input does not convert, the whole input is converted to get msgspec's own first error.
NaN and depth are checked later, by the canonical encoder, exactly as for the typed value.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._canonical import to_exact_value
from ._messages import content_free
from ._perf import paused_gc
from ._pydantic import is_pydantic_schema
from ._raw import decode_raw_sliced
from ._refusals import keys_may_merge, merged_key_path

__all__ = ["SLICE_ITEMS_FROM", "convert_exact", "release"]

#: Lists shorter than this are converted with the rest (one call is cheap enough).
SLICE_ITEMS_FROM = 2048
#: Each slice aims at about this much work, far below the 50 ms a loop may be frozen.
_SLICE_SECONDS = 0.004
_FIRST_STEP = 256
_RELEASE_ITEMS = 8192
_ITEM_PATH = re.compile(r"`\$\[(\d+)\]")


async def convert_exact(
    response: Any, schema: Any, checkpoint: Callable[[], Awaitable[None]]
) -> tuple[Any, list[Any] | None]:
    """:func:`to_exact_value`, yielding to the loop between slices of a long list.

    Same value and the same ``ValueError`` cases as :func:`to_exact_value`; beside the value,
    the long list this function built itself, which :func:`release` may empty, else None.
    """
    if isinstance(response, msgspec.Raw) and not is_pydantic_schema(schema):
        return await decode_raw_sliced(response, schema, checkpoint)
    cut = _plan(response, schema)
    if cut is None:
        return to_exact_value(response, schema), None
    attr, items, item_list_type, outer = cut
    try:
        head: Any = msgspec.convert(outer, schema) if attr is not None else None
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return to_exact_value(response, schema), None  # msgspec's own first error, whole
    where = "$" if attr is None else f"$.{_encode_name(schema, attr)}"
    merge = keys_may_merge(schema)
    with paused_gc():
        converted = await _convert_items(items, item_list_type, where, checkpoint, merge=merge)
    if converted is None or (merge and merged_key_path(head, outer) is not None):
        # Two keys the schema reads as one: the whole check names the first pair (error path).
        return to_exact_value(response, schema), None
    if attr is None:
        return converted, converted
    return msgspec.structs.replace(head, **{attr: converted}), converted


def _plan(response: Any, schema: Any) -> tuple[str | None, list[Any], Any, Any] | None:
    """What to cut: (struct attribute or None, the items, ``list[T]``, the rest of the input)."""
    if is_pydantic_schema(schema) or isinstance(response, msgspec.Raw):
        return None
    try:
        info = _type_info(schema)  # TypeError too for an unhashable schema: not sliced
    except (TypeError, ValueError):
        return None
    if _plain_list(info) and type(response) is list and len(response) >= SLICE_ITEMS_FROM:
        return None, response, schema, None
    if not isinstance(info, mi.StructType) or type(response) is not dict:
        return None
    if info.array_like or hasattr(info.cls, "__post_init__"):
        return None
    types = {f.name: f.type for f in msgspec.structs.fields(info.cls)}
    for field in info.fields:
        items = response.get(field.encode_name)
        if _plain_list(field.type) and type(items) is list and len(items) >= SLICE_ITEMS_FROM:
            return field.name, items, types[field.name], {**response, field.encode_name: []}
    return None


# ``mi.type_info`` evaluates the schema's annotations anew each call (about 0.2 ms for a small
# struct): more than storing a 2 KB value costs, paid by every compaction. Types are immutable.
_type_info = functools.lru_cache(maxsize=256)(mi.type_info)


def _plain_list(info: mi.Type) -> bool:
    return isinstance(info, mi.ListType) and info.min_length is None and info.max_length is None


@functools.lru_cache(maxsize=256)
def _encode_names(schema: Any) -> dict[str, str]:
    return dict(zip(schema.__struct_fields__, schema.__struct_encode_fields__, strict=True))


def _encode_name(schema: Any, attr: str) -> str:
    return _encode_names(schema)[attr]


async def _convert_items(
    items: list[Any],
    list_type: Any,
    where: str,
    checkpoint: Callable[[], Awaitable[None]],
    *,
    merge: bool,
) -> list[Any] | None:
    """The items converted slice by slice; None when a slice has keys the schema merges."""
    converted: list[Any] = []
    merged = False
    start, step, count = 0, _FIRST_STEP, len(items)
    while start < count:
        began = time.perf_counter()
        chunk = items[start : start + step]
        try:
            part = msgspec.convert(chunk, list_type)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(
                "exact_response does not validate against exact_schema: "
                + _shifted(content_free(exc), where, start)
            ) from None
        except RecursionError:
            to_exact_value(chunk, list_type)  # raises the depth refusal
            raise
        merged = merged or (merge and merged_key_path(part, chunk) is not None)
        converted.extend(part)
        start += len(chunk)
        elapsed = time.perf_counter() - began
        step = max(1, min(step * 4, int(step * _SLICE_SECONDS / max(elapsed, 1e-6))))
        await checkpoint()
    return None if merged else converted


def _shifted(message: str, where: str, offset: int) -> str:
    """A slice's message with its path made a path in the whole input."""
    return _ITEM_PATH.sub(lambda m: f"`{where}[{int(m.group(1)) + offset}]", message, count=1)


async def release(owned: list[Any], checkpoint: Callable[[], Awaitable[None]]) -> None:
    """Empty a long list built by :func:`convert_exact` a slice at a time.

    Freeing 90 MB of decoded rows in one go takes about 90 ms; the caller's typed value is
    never touched (only a list this module built and nobody else holds).
    """
    while owned:
        del owned[-_RELEASE_ITEMS:]
        await checkpoint()
