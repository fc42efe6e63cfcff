"""Converting a large builtins input to its schema in slices, so the caller's loop keeps turning.

msgspec holds the GIL for a whole ``convert`` call: a 90 MB list of rows handed over as dicts
is one long stall of the event loop, whichever thread runs it. Where it is provably the same
conversion, each long container is converted a slice at a time (a slice of a list as
``list[T]``, a slice of a mapping's items as ``dict[str, V]``) with a checkpoint between
slices, the rest of the input with those containers emptied, and the containers are put back.

Same rules as :mod:`._slices`: only a plain ``list[T]`` or ``dict[str, V]`` (no length or key
constraints) that is the top-level value or a field of a top-level struct (not array-like, no
``__post_init__``) is cut; anything else goes to :func:`to_exact_value` whole. Every check
stays: each slice is validated by msgspec against the container's type, keys that the schema
would merge are looked for in every slice, and a failure names the path in the whole input
(``$.rows[1234].id``, ``$.labels[...]``), never a key or a value. The rest of the input is
converted first; when it does not convert, the whole input is converted to get msgspec's own
first error. NaN and depth are checked later, by the canonical encoder, exactly as for the
typed value.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._canonical import TOO_DEEP, to_exact_value
from ._messages import content_free
from ._perf import paused_gc
from ._pydantic import is_pydantic_schema
from ._raw import decode_raw_sliced
from ._refusals import keys_may_merge, merged_key_path
from ._slices import plain_container, type_info

__all__ = ["SLICE_ITEMS_FROM", "convert_exact", "release"]

#: Containers shorter than this are converted with the rest (one call is cheap enough).
SLICE_ITEMS_FROM = 16
#: Each slice aims at about this much work, far below the 50 ms a loop may be frozen.
_SLICE_SECONDS = 0.004
# Small: one item may be a whole chapter of nested structs (38 KB); steps grow by time.
_FIRST_STEP = 8
_ITEM_PATH = re.compile(r"`\$\[(\d+)\]")


async def convert_exact(
    response: Any, schema: Any, checkpoint: Callable[[], Awaitable[None]]
) -> tuple[Any, list[Any] | None]:
    """:func:`to_exact_value`, yielding to the loop between slices of long containers.

    Same value and the same ``ValueError`` cases as :func:`to_exact_value`; beside the value,
    the containers this function built itself, which :func:`release` may empty, else None.
    """
    if isinstance(response, msgspec.Raw) and not is_pydantic_schema(schema):
        return await decode_raw_sliced(response, schema, checkpoint)
    plan = _plan(response, schema)
    if plan is None:
        return to_exact_value(response, schema), None
    cuts, outer = plan
    try:
        head: Any = msgspec.convert(outer, schema) if outer is not None else None
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return to_exact_value(response, schema), None  # msgspec's own first error, whole
    merge = keys_may_merge(schema)
    converted: dict[str | None, list[Any] | dict[str, Any]] = {}
    with paused_gc():
        for cut in cuts:  # in the input's order, as msgspec meets them
            found = await _convert_items(cut, checkpoint, merge=merge)
            if found is None:
                break
            converted[cut.attr] = found
    if len(converted) < len(cuts) or (merge and merged_key_path(head, outer) is not None):
        # Two keys the schema reads as one: the whole check names the first pair (error path).
        return to_exact_value(response, schema), None
    if head is None:
        return converted[None], [converted[None]]
    put_back = {str(attr): value for attr, value in converted.items()}
    return msgspec.structs.replace(head, **put_back), list(put_back.values())


@dataclass(frozen=True, slots=True)
class _Cut:
    attr: str | None  # struct attribute to put the container back into; None for the top level
    items: list[Any] | dict[Any, Any]
    type: Any  # list[T] or dict[str, V]
    where: str  # its path in the whole input


def _plan(response: Any, schema: Any) -> tuple[list[_Cut], Any] | None:
    """What to cut, in the input's order, and the rest of the input (None: nothing is left)."""
    if is_pydantic_schema(schema) or isinstance(response, msgspec.Raw):
        return None
    try:
        info = type_info(schema)  # TypeError too for an unhashable schema: not sliced
    except (TypeError, ValueError):
        return None
    if _long(plain_container(info), response):
        return [_Cut(None, response, schema, "$")], None
    if not isinstance(info, mi.StructType) or type(response) is not dict:
        return None
    if info.array_like or hasattr(info.cls, "__post_init__"):
        return None
    fields = {f.encode_name: f for f in info.fields}
    types = {f.name: f.type for f in msgspec.structs.fields(info.cls)}
    cuts = []
    for key, value in response.items():
        field = fields.get(key)
        if field is not None and _long(plain_container(field.type), value):
            cuts.append(_Cut(field.name, value, types[field.name], f"$.{key}"))
    if not cuts:
        return None
    emptied: dict[str, Any] = {cut.where[2:]: {} if type(cut.items) is dict else [] for cut in cuts}
    return cuts, {**response, **emptied}


def _long(mapping: bool | None, value: Any) -> bool:
    if mapping is None or type(value) is not (dict if mapping else list):
        return False
    return len(value) >= SLICE_ITEMS_FROM


async def _convert_items(
    cut: _Cut, checkpoint: Callable[[], Awaitable[None]], *, merge: bool
) -> list[Any] | dict[str, Any] | None:
    """The container converted slice by slice; None when a slice has keys the schema merges."""
    mapping = type(cut.items) is dict
    converted: Any = {} if mapping else []
    members = iter(cut.items.items()) if isinstance(cut.items, dict) else None
    start, step, count = 0, _FIRST_STEP, len(cut.items)
    while start < count:
        began = time.perf_counter()
        chunk: Any
        if members is not None:
            chunk = dict(itertools.islice(members, step))
        else:
            chunk = cut.items[start : start + step]
        try:
            part = msgspec.convert(chunk, cut.type)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(
                "exact_response does not validate against exact_schema: "
                + _shifted(content_free(exc), cut.where, start, mapping=mapping)
            ) from None
        except RecursionError:
            to_exact_value(chunk, cut.type)  # raises the depth refusal
            raise ValueError(TOO_DEEP) from None  # it did not (more stack there): still one
        if merge and merged_key_path(part, chunk) is not None:
            return None
        if mapping:
            converted.update(part)
        else:
            converted.extend(part)
        start += len(chunk)
        elapsed = time.perf_counter() - began
        step = max(1, min(step * 4, int(step * _SLICE_SECONDS / max(elapsed, 1e-6))))
        await checkpoint()
    return converted  # type: ignore[no-any-return]


def _shifted(message: str, where: str, offset: int, *, mapping: bool) -> str:
    """A slice's message with its path made a path in the whole input."""
    if mapping:  # `$[...]`, or `key` in `$`: the slice is the mapping itself
        return message.replace("`$", f"`{where}", 1)
    return _ITEM_PATH.sub(lambda m: f"`{where}[{int(m.group(1)) + offset}]", message, count=1)


async def release(owned: list[Any], checkpoint: Callable[[], Awaitable[None]]) -> None:
    """Empty the containers built by :func:`convert_exact`, a slice at a time.

    Freeing 90 MB of decoded rows in one go takes about 90 ms; the caller's typed value is
    never touched (only containers this module built and nobody else holds). Slices are
    sized by time, since one item may be a row or a whole chapter of nested structs.
    """
    step = _FIRST_STEP
    while owned:
        began = time.perf_counter()
        container = owned[-1]
        if isinstance(container, dict):
            for _ in range(min(step, len(container))):
                container.popitem()
        else:
            del container[-step:]
        if not container:
            owned.pop()
            step = _FIRST_STEP  # a dict's item costs far more to drop than a list's
            await checkpoint()
            continue
        elapsed = time.perf_counter() - began
        step = max(1, min(step * 4, int(step * _SLICE_SECONDS / max(elapsed, 1e-6))))
        await checkpoint()
