"""Where a NaN written as ``null`` could pass validation: the scan canonical JSON may skip. Pure.

msgspec writes NaN and infinities as ``null``, so the encoder scans its output for ``null``
and, when a value holds one, re-encodes the value as msgpack to tell a real ``None`` from a
NaN (0.5 ms per MB of short strings; 1.3 ms per MB of rows, which hold nulls; on the event
loop, before the first write). A ``null`` only passes the read-back's validation where the
schema takes ``None``; anywhere else that validation refuses it. So when the schema says where
``null`` may stand, only those places need looking at:

* :func:`null_refused`: nowhere. Nothing to look at.
* :func:`null_places`: a few fields of flat records (a list of rows with an optional column,
  the shape of most large tool responses). Those values are looked at, a C-level pass each.

Skipping is also a place a NaN could hide: a struct's unknown fields are skipped on decode,
so every struct instance must be of exactly its schema type (a subclass may carry more
fields), unless the struct forbids unknown fields. Anything else (``Any``, ``Raw``, custom
types, dataclasses, TypedDicts, NamedTuples, array-like structs, nested containers of
optional values) keeps the scan.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._pydantic import is_pydantic_schema

__all__ = ["null_places", "null_refused", "nulls_left_to_schema"]

# Types that decode nothing from JSON null, and containers of them.
_NEVER_NULL = (
    mi.StrType, mi.IntType, mi.BoolType, mi.FloatType, mi.BytesType, mi.ByteArrayType,
    mi.DateTimeType, mi.DateType, mi.TimeType, mi.TimeDeltaType, mi.UUIDType, mi.DecimalType,
)  # fmt: skip
_OF_ITEMS = (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)
#: Values of these types are never written as ``null`` by mistake (a float may be a NaN).
_NOT_FLOAT = frozenset({type(None), int, bool, str})
_MAY_BE_FLOAT = _NOT_FLOAT | {float}
#: Items looked at in one pass at most (a pass holds the loop): beyond, the scan in pieces.
MAX_ITEMS = 200_000

#: ``check(value)``: True when no NaN or infinity sits where ``null`` would validate.
Check = Callable[[Any], bool]


def nulls_left_to_schema(value: Any, schema: Any) -> bool:
    """Whether the read-back's validation refuses every ``null`` a NaN in ``value`` makes.

    Then the encoder need not scan for it. A struct instance must be of the schema's own type
    (a subclass's extra fields are skipped); where ``null`` validates, the values there are
    looked at (:func:`null_places`).
    """
    if is_pydantic_schema(schema):
        return False
    if isinstance(value, msgspec.Struct) and type(value) is not schema:
        return False
    if null_refused(schema):
        return True
    check = null_places(schema)
    try:
        return check is not None and check(value)
    except (TypeError, AttributeError):  # not the schema's shape (unvalidated): scan it
        return False


@functools.lru_cache(maxsize=256)
def null_refused(schema: Any) -> bool:
    """Whether every position of ``schema`` refuses JSON null, and its decoder skips nothing.

    The top-level value is the caller's to check (exactly the schema's type).
    """
    try:
        return _refuses(mi.type_info(schema), top=True)
    except (TypeError, ValueError):
        return False


def _refuses(root: Any, *, top: bool = False) -> bool:
    """:func:`null_refused` of a node of ``msgspec.inspect``'s types."""
    stack: list[tuple[Any, bool]] = [(root, top)]
    seen: set[int] = set()
    while stack:
        node, top = stack.pop()
        if _leaf(node):
            continue
        if isinstance(node, _OF_ITEMS):
            stack.append((node.item_type, False))
        elif isinstance(node, mi.TupleType | mi.UnionType):
            items = node.item_types if isinstance(node, mi.TupleType) else node.types
            stack.extend((item, False) for item in items)
        elif isinstance(node, mi.DictType):
            stack.extend(((node.key_type, False), (node.value_type, False)))
        elif isinstance(node, mi.StructType):
            if node.array_like or not (top or node.forbid_unknown_fields):
                return False
            if id(node.cls) not in seen:  # a recursive schema meets itself again
                seen.add(id(node.cls))
                stack.extend((field.type, False) for field in node.fields)
        else:
            return False
    return True


def _leaf(node: Any) -> bool:
    """A type that decodes nothing from null and holds no other value."""
    if isinstance(node, _NEVER_NULL):
        return True
    if isinstance(node, mi.LiteralType):
        return all(isinstance(v, str | int) for v in node.values)
    if isinstance(node, mi.EnumType):
        return all(isinstance(member.value, str | int) for member in node.cls)
    return False


def _optional_leaf(node: Any) -> bool:
    """A union of :func:`_leaf` types and ``None``: ``null`` validates, nothing below it."""
    if not isinstance(node, mi.UnionType):
        return False
    return all(isinstance(t, mi.NoneType) or _leaf(t) for t in node.types)


@functools.lru_cache(maxsize=256)
def null_places(schema: Any) -> Check | None:
    """A check of the only places where ``null`` validates in a value of struct ``schema``.

    For a struct whose fields are values that refuse ``null``, optional values, flat records
    (structs of such fields), and lists or str-keyed dicts of those. None: not that shape.
    """
    try:
        root = mi.type_info(schema)
    except (TypeError, ValueError):
        return None
    if not isinstance(root, mi.StructType) or root.array_like or _hides_slots(root.cls):
        return None
    checks: list[Check] = []
    for field in root.fields:
        check = _field_check(field.name, field.type)
        if check is False:
            return None
        if check is not True:
            checks.append(check)
    return lambda value: all(check(value) for check in checks)


def _hides_slots(cls: type) -> bool:
    """Whether ``cls`` reads its attributes its own way: what it shows, not what it writes."""
    return cls.__getattribute__ is not object.__getattribute__  # type: ignore[comparison-overlap]


def _field_check(name: str, node: Any) -> Check | bool:
    """True: nothing to look at; False: not a shape handled here; else the check."""
    get = operator.attrgetter(name)
    if _refuses(node):
        return True
    if _optional_leaf(node):
        return lambda value: _finite([get(value)])
    if isinstance(node, mi.DictType) and not isinstance(node.key_type, mi.StrType):
        return False
    if not isinstance(node, mi.ListType | mi.VarTupleType | mi.DictType):
        return False
    items = _dict_values(get) if isinstance(node, mi.DictType) else _list_items(get)
    item = node.value_type if isinstance(node, mi.DictType) else node.item_type
    if _optional_leaf(item):
        return lambda value: _finite(items(value))
    record = _record(item)
    if record is None:
        return False
    cls, optional = record
    return lambda value: _records_finite(items(value), cls, optional)


def _list_items(get: Callable[[Any], Any]) -> Callable[[Any], Iterable[Any]]:
    """The items of a list or tuple field; TypeError if it is another kind of sequence.

    A subclass may hide items from iteration, not from the encoder.
    """

    def items(value: Any) -> Iterable[Any]:
        found = get(value)
        if type(found) not in (list, tuple) or len(found) > MAX_ITEMS:
            raise TypeError  # (too many: looked at in one pass, they would hold the loop)
        return found  # type: ignore[no-any-return]

    return items


def _dict_values(get: Callable[[Any], Any]) -> Callable[[Any], Iterable[Any]]:
    """The values of a dict field; TypeError if it is another kind of mapping."""

    def values(value: Any) -> Iterable[Any]:
        found = get(value)
        if type(found) is not dict or len(found) > MAX_ITEMS:
            raise TypeError
        return found.values()

    return values


def _record(node: Any) -> tuple[type, tuple[str, ...]] | None:
    """A flat record: (its struct class, its optional fields); None if not one.

    Its fields refuse ``null`` everywhere, or are optional values (``_optional_leaf``).
    """
    if not isinstance(node, mi.StructType) or node.array_like or _hides_slots(node.cls):
        return None
    optional = []
    for field in node.fields:
        if _optional_leaf(field.type):
            optional.append(field.name)
        elif not _refuses(field.type):
            return None
    return node.cls, tuple(optional)


def _records_finite(records: Iterable[Any], cls: type, optional: tuple[str, ...]) -> bool:
    """Whether ``records`` are all ``cls`` instances whose optional fields hold no NaN.

    ``records``: a list, tuple or dict view (iterated more than once).
    """
    if not set(map(type, records)) <= {cls}:
        return False  # a subclass's extra fields would be skipped on decode: scan instead
    return all(_finite(map(operator.attrgetter(name), records)) for name in optional)


def _finite(values: Iterable[Any]) -> bool:
    """Whether no value is a NaN or an infinity (one C-level pass when none is a float).

    Any type but these and ``float`` says no: an enum whose value is a NaN, a float
    subclass, are written as ``null`` too (the scan looks at them).
    """
    values = list(values)  # as many as the records or items the caller bounded
    kinds = set(map(type, values))
    if kinds <= _NOT_FLOAT:
        return True
    if not kinds <= _MAY_BE_FLOAT:
        return False
    return not any(type(v) is float and not math.isfinite(v) for v in values)
