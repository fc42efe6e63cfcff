"""One encoder call for a value the streaming walk would encode in a few calls anyway. Pure.

The walk (``_stream``) encodes each array or object of up to ``FIRST_SLICE`` items in one call
(its first slice); for a value made only of such containers, the walk between those calls
(placeholders, slices, spans) cost more than the encoding: for 2 KB of rows, 16 us against
3 us in one call, and a 2 KB compaction's loop thread 160-176 against 116 us (tmpfs, the
minimum of 3000). Here is which values take one call, and the layout the walk would have
recorded for one, found in its encoding.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._encoding import ENCODER
from ._own import field_of, fields, is_array, is_container, is_struct, items_in
from ._span import Span

__all__ = ["FIRST_SLICE", "WHOLE_BYTES", "few_items", "spans_in"]

#: The walk's first slice of an array or object: this many items in one encoder call.
FIRST_SLICE = 16
#: Up to this size a value encoded in one call needs no layout: a read decodes one this small
#: whole (``_store._verify.GC_PAUSE_BYTES``).
WHOLE_BYTES = 64 << 10
#: A struct with more fields that hold items than this is streamed: one call for all of them
#: would hold the loop as long as this many of the walk's longest calls and more.
_FEW_FIELDS = 4
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def few_items(value: Any) -> bool:
    """Whether the walk would encode ``value`` in a few calls (then one call will do).

    No container it would cut or descend into (of over ``FIRST_SLICE`` items), and at most
    ``_FEW_FIELDS`` fields of a struct that are arrays or objects of one item or more.
    Lengths and fields are the value's own (what the encoder writes, ``_own``).
    """
    if is_container(value):
        return items_in(value) <= FIRST_SLICE
    if not is_struct(value) or type(value).__struct_config__.omit_defaults:
        return True  # one call when streamed too
    several = 0
    for name in type(value).__struct_fields__:
        field = field_of(value, name)
        if is_container(field):
            items = items_in(field)
            if items > FIRST_SLICE:
                return False
            several += items > 0  # the walk's call of its own, whatever its items hold
        elif is_struct(field):
            return False  # descended into by the walk: not looked into here
    return several <= _FEW_FIELDS


def spans_in(value: Any, whole: bytes) -> list[Span] | None:
    """The spans the walk records for ``value`` (its containers short), found in ``whole``.

    Each array of two items or more at the top or in a top-level struct's field is one slice.
    None where they are not found: an array-like struct with such a field (its members are
    not named), text that is not JSON, or members that do not tile the object (a Raw field
    with spaces around its text).
    """
    if is_array(value):
        end, items = len(whole), items_in(value)
        return [Span(None, 0, end, ((1, end - 1),), (items,))] if items > 1 else []
    if not is_struct(value) or type(value).__struct_config__.omit_defaults:
        return []  # a dict of 16 keys or fewer is one slice: no span (``mapping``)
    counts = {}
    for name, encoded in fields(value):
        field = field_of(value, name)
        if is_array(field) and items_in(field) > 1:
            counts[encoded] = items_in(field)
    if not counts:
        return []
    if type(value).__struct_config__.array_like:
        return None
    try:
        members = _MEMBERS.decode(whole)
    except msgspec.DecodeError:  # a Raw field's text is not JSON: the read-back refuses it
        return None
    spans = []
    at = 1  # past "{"; canonical JSON has no whitespace: members are key, ":", value, ","
    for key, member in members.items():
        at += len(ENCODER.encode(key)) + 1
        end = at + len(memoryview(member))
        if key in counts:
            if whole[at] != ord("[") or whole[end - 1] != ord("]"):
                return None
            spans.append(Span(key, at, end, ((at + 1, end - 1),), (counts[key],)))
        at = end + 1
    return spans if at == len(whole) else None
