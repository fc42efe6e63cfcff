"""JSON text inside a value (``msgspec.Raw``): made canonical, or refused. Pure: no I/O.

msgspec writes a ``Raw`` as it is. Inside a larger value its text may hold more than one value
(``1,"rows":[]`` adds a member beside it), name a key twice, or spell its value in a way
canonical JSON does not (spaces, unsorted keys, ``1e15``). Stored like that, the entry decodes
to a value other than the one handed in, and a part of it is not what ``read_part`` says. So
each ``Raw`` inside a value is decoded (one JSON value, no key named twice, nothing canonical
JSON refuses) and replaced by its canonical text: the value it holds is kept, its spelling is
not, as for a whole input given as ``Raw`` (decoded against the schema, then re-encoded).

Only schemas that can hold a ``Raw`` are walked (a ``Raw`` or ``Any`` somewhere in them).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._encoding import ENCODER
from ._own import field_of, is_struct, plain, post_inits
from ._refusals import duplicate_key_path, nodes, path_of, type_nodes

__all__ = ["NodeBudgetSpentError", "canonical_raws", "may_hold_raw"]

_PLAIN = (str, int, float, bool, bytes, type(None))
#: The exact types of items that cannot hold a Raw, checked a whole container at a time in C.
_LEAVES = frozenset(_PLAIN)


class NodeBudgetSpentError(Exception):
    """The walk met more nodes than it was allowed: run it again off the event loop."""


class _BadRawError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@functools.lru_cache(maxsize=256)
def may_hold_raw(schema: Any, *, raw_input: bool) -> bool:
    """Whether a value of ``schema`` may hold a ``Raw`` inside it.

    A whole input given as ``Raw`` is decoded against the schema, which yields a ``Raw`` only
    where the schema names one; any other input may carry one wherever the schema says Any.
    """
    try:
        types = list(type_nodes(mi.type_info(schema)))
    except (TypeError, ValueError):
        return True  # a schema msgspec cannot describe: look
    kinds = (mi.RawType,) if raw_input else (mi.RawType, mi.AnyType)
    return any(isinstance(node, kinds) for node in types)


def canonical_raws(value: Any, budget: int | None = None) -> Any:
    """``value`` with every ``Raw`` inside it canonical (the same object if none changed).

    Raises ``ValueError`` naming the path of a ``Raw`` that is not one JSON value free of
    repeated keys; :class:`NodeBudgetSpentError` after
    ``budget`` nodes (None: no bound).
    """
    walk = _Walk(budget)
    try:
        return walk.value(value)
    except _BadRawError:
        path, reason = _first_bad(value)
        raise ValueError(f"exact_response holds a msgspec.Raw that {reason} at `{path}`") from None
    except RecursionError:
        raise ValueError("exact_response nests too deeply for canonical JSON") from None


class _Walk:
    __slots__ = ("left",)

    def __init__(self, budget: int | None) -> None:
        self.left = budget

    def value(self, item: Any) -> Any:
        if isinstance(item, _PLAIN):
            return item
        if self.left is not None:
            self.left -= 1
            if self.left < 0:
                raise NodeBudgetSpentError
        if isinstance(item, msgspec.Raw):
            return _canonical_raw(item)
        # As msgspec writes it (``_own``): a subclass's methods may show other items, and a
        # container rebuilt from them was stored in place of the caller's.
        kind = type(item)
        if kind is not dict and kind is not list and kind is not tuple:
            item = plain(item)
            kind = type(item)
        # Plain loops, not comprehensions or helpers: one frame per level of nesting, so a
        # value nested as deep as the encoder takes is walked too.
        if kind is dict:
            if _only_leaves(item.values()):
                return item  # nothing to look into
            new: dict[Any, Any] = {}
            same = True
            for key, old in item.items():
                new[key] = fresh = self.value(old)
                same = same and fresh is old
            return item if same else new
        if kind is list or kind is tuple:
            if _only_leaves(item):
                return item
            items: list[Any] = []
            same = True
            for old in item:
                fresh = self.value(old)
                items.append(fresh)
                same = same and fresh is old
            if same:
                return item
            return items if kind is list else tuple(items)  # the array either way
        if is_struct(item) and not post_inits(item):
            changed = {}
            for name in type(item).__struct_fields__:
                old = field_of(item, name)
                new_value = self.value(old)
                if new_value is not old:
                    changed[name] = new_value
            return msgspec.structs.replace(item, **changed) if changed else item
        if isinstance(item, enum.Enum) or _has_fields(type(item)) or is_struct(item):
            # msgspec writes a Raw inside these as it is (an enum's value, a dataclass field).
            # A struct with a __post_init__ too: a copy of it would run it on what it is given.
            try:
                builtins = msgspec.to_builtins(item, builtin_types=(msgspec.Raw,))
            except (TypeError, ValueError):
                return item  # the encoder refuses it, with a type name
            fresh = self.value(builtins)
            return item if fresh is builtins else fresh
        return item  # sets cannot hold a Raw (unhashable); other objects are msgspec's to refuse


def _has_fields(kind: type) -> bool:
    """A dataclass or an attrs class: msgspec writes its fields, a Raw among them as it is."""
    return hasattr(kind, "__dataclass_fields__") or hasattr(kind, "__attrs_attrs__")


def _only_leaves(children: Iterable[Any]) -> bool:
    """Whether every one of ``children`` is a leaf (their types checked in C, at once)."""
    return _LEAVES.issuperset(map(type, children))


def _canonical_raw(raw: msgspec.Raw) -> msgspec.Raw:
    data = bytes(memoryview(raw))
    try:
        decoded = msgspec.json.decode(data)
    except msgspec.DecodeError:
        raise _BadRawError("is not one JSON value") from None
    if duplicate_key_path(data) is not None:
        raise _BadRawError("names one key twice in an object")
    # Decoded JSON holds no NaN, lone surrogate or non-str key (the decode refuses them), so
    # the plain canonical encoder is enough: encode_checked's scans would find nothing.
    text = ENCODER.encode(decoded)
    return raw if text == data else msgspec.Raw(text)


def _first_bad(value: Any) -> tuple[str, str]:
    """The path of the first ``Raw`` :func:`_canonical_raw` refuses, and why (a rare walk)."""
    for item, where in nodes(value):
        if isinstance(item, msgspec.Raw):
            try:
                _canonical_raw(item)
            except _BadRawError as bad:
                return path_of(where), bad.reason
    return "$", "could not be checked"
