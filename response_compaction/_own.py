"""What the encoder writes of a container or a struct: its own items and slots. Pure.

msgspec writes a list, tuple or dict subclass's own items and a struct's own field
slots, and looks at an object's type, not at what ``__class__`` claims. A subclass's
``__len__``, ``__iter__``, ``__getitem__`` or ``values``, a struct's ``__getattribute__``, or
a mock that passes ``isinstance(x, list)`` may say otherwise: a ``__len__`` over the count
made the walk's slices come back empty forever, a ``values`` that hid a NaN had it stored as
``null``, a ``__getattribute__`` sealed counts its bytes did not hold. Every walk that decides
what is written or refused (the streamed encoder, the one-call layout, the refusal walk) reads
through these, so it sees what msgspec writes.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "field_of",
    "fields",
    "is_array",
    "is_container",
    "is_struct",
    "items_in",
    "plain",
    "post_inits",
]


def plain(value: Any) -> Any:
    """``value``, a subclass of list, tuple or dict as a copy of its own items.

    Anything else (an exact container too) is ``value`` itself.
    """
    kind = type(value)
    if kind is list or kind is tuple or kind is dict:
        return value
    if issubclass(kind, list):
        return list.copy(value)
    if issubclass(kind, tuple):
        return tuple.__getitem__(value, slice(None))
    if issubclass(kind, dict):
        return dict(dict.items(value))  # the table's own pairs: copy() asks __getitem__
    return value  # a set subclass too: msgspec writes what its __iter__ gives


def is_container(value: Any) -> bool:
    """Whether ``value`` is a list, tuple or dict by its type (not by ``__class__``)."""
    return issubclass(type(value), list | tuple | dict)


def is_array(value: Any) -> bool:
    """Whether ``value`` is a list or tuple by its type."""
    return issubclass(type(value), list | tuple)


def is_struct(value: Any) -> bool:
    """Whether ``value`` is a msgspec struct by its type."""
    return issubclass(type(value), msgspec.Struct)


def items_in(container: Any) -> int:
    """How many items ``container`` (an :func:`is_container`) holds: its own count."""
    kind = type(container)
    if issubclass(kind, list):
        return list.__len__(container)
    if issubclass(kind, tuple):
        return tuple.__len__(container)
    return dict.__len__(container)


def field_of(value: msgspec.Struct, name: str) -> Any:
    """The struct field ``name`` as its slot holds it (a ``__getattribute__`` is not asked)."""
    return object.__getattribute__(value, name)


def fields(value: msgspec.Struct) -> list[tuple[str, str]]:
    """The struct's fields, each with its encoded name, from its type (not the instance)."""
    kind = type(value)
    return list(zip(kind.__struct_fields__, kind.__struct_encode_fields__, strict=True))


def post_inits(value: msgspec.Struct) -> bool:
    """Whether a copy of the struct runs its ``__post_init__`` (``msgspec.structs.replace``).

    Such a copy is not what msgspec writes of the struct: its ``__post_init__`` may change the
    fields, or refuse what stands in for them (a Raw placeholder).
    """
    return hasattr(type(value), "__post_init__")
