"""Pydantic v2 models as exact and summary schemas (the ``pydantic`` extra). Pure: no I/O.

A schema is "pydantic" when it is a pydantic model or dataclass, or a typing construct that
holds one (``list[Page]``, ``Page | None``). pydantic then validates (on the way in, on every
read back, and the model's summary), and the canonical bytes are those of the model's plain
data (``by_alias``) encoded exactly as the msgspec path encodes it: equal data, equal bytes,
equal digest. pydantic is imported only when such a schema shows up, so the core install runs
without it; a model class whose pydantic is not v2 raises ``ValueError`` naming the extra.

Error messages carry the location and pydantic's message, never the input (pydantic puts the
offending value in ``str(exc)``; we rebuild the text from ``errors(include_input=False)``).
"""

from __future__ import annotations

import functools
import sys
import typing
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "is_pydantic_schema",
    "pydantic_decode",
    "pydantic_exact_value",
    "pydantic_fallback_value",
    "pydantic_json_schema",
    "pydantic_plain",
    "resolve_pydantic_fallback",
]

_EXTRA = (
    "{role} is a pydantic model, which needs pydantic v2: "
    "pip install 'response-compaction[pydantic]'"
)


def is_pydantic_schema(schema: Any, role: str = "exact_schema") -> bool:
    """Whether ``schema`` is or holds a pydantic model; ``ValueError`` if pydantic v2 is absent."""
    try:
        found = _mentions_pydantic(schema)
    except TypeError:  # unhashable: not a type we could cache, nor a model
        return False
    if found:
        _require_v2(role)
    return found


@functools.lru_cache(maxsize=256)
def _mentions_pydantic(schema: Any) -> bool:
    stack, seen = [schema], 0
    while stack and seen < 1000:
        seen += 1
        item = stack.pop()
        if isinstance(item, type) and (
            "__pydantic_validator__" in vars(item)
            or any(
                base.__name__ == "BaseModel" and base.__module__.partition(".")[0] == "pydantic"
                for base in item.__mro__
            )
        ):
            return True
        stack.extend(typing.get_args(item))
    return False


def _require_v2(role: str) -> Any:
    try:
        import pydantic
    except ImportError:
        raise ValueError(_EXTRA.format(role=role)) from None
    if not str(getattr(pydantic, "VERSION", "1")).startswith("2"):
        raise ValueError(_EXTRA.format(role=role))
    return pydantic


@functools.lru_cache(maxsize=256)
def _adapter(schema: Any) -> Any:
    import pydantic

    return pydantic.TypeAdapter(schema)


#: ``document`` of :func:`_describe` when the input was JSON text.
_JSON = object()

# Error types whose pydantic message is a template filled from the schema, a type name or a
# count, never from the input. Anything else (a custom validator's "Value error, ...", a union
# tag quoted from the input, uuid_parsing's "found `K` at 0") is reduced to its type.
_SAFE_TYPES = frozenset(
    {
        "missing", "extra_forbidden", "none_required", "json_invalid", "json_type",
        "int_type", "int_parsing", "int_from_float", "float_type", "float_parsing",
        "finite_number", "bool_type", "bool_parsing", "string_type", "bytes_type",
        "list_type", "tuple_type", "set_type", "dict_type", "model_type", "dataclass_type",
        "model_attributes_type", "greater_than", "greater_than_equal", "less_than",
        "less_than_equal", "multiple_of", "string_too_short", "string_too_long", "too_short",
        "too_long", "string_pattern_mismatch", "literal_error", "enum", "datetime_type",
        "datetime_parsing", "date_type", "date_parsing", "time_type", "time_parsing",
        "uuid_type", "decimal_type", "decimal_parsing", "url_type",
        "url_parsing", "timezone_aware", "timezone_naive",
    }
)  # fmt: skip


def _describe(exc: Any, schema: Any, document: Any = _JSON) -> str:
    """``msg - at `$.a[0].b``` for the first error (and how many more), without the input.

    Path steps that are not names from the schema (dict keys from the document) are ``[...]``.
    An int step is an index only where the Python ``document`` holds a list or tuple there:
    pydantic puts an int key of a dict in the path the same way (an account number is
    content). In JSON (the default) keys are strings, so ints are indexes.
    """
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    first = errors[0]
    names = _field_names(schema)
    steps: list[str] = []
    node = document
    for p in first["loc"]:
        if isinstance(p, int):
            index = node is _JSON or isinstance(node, list | tuple)
            steps.append(f"[{p}]" if index else "[...]")
        else:
            steps.append(f".{p}" if p in names else "[...]")
        node = node if node is _JSON else _child(node, p)
    path = "$" + "".join(steps)
    message = first["msg"] if first["type"] in _SAFE_TYPES else f"invalid ({first['type']})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{message} - at `{path}`{more}"


def _child(node: Any, step: Any) -> Any:
    """What ``node`` holds at ``step``; None where it cannot be followed (ints: not indexes)."""
    try:
        if isinstance(node, list | tuple | dict):
            return node[step]
        return getattr(node, step) if isinstance(step, str) else None
    except (LookupError, TypeError, AttributeError):
        return None


@functools.lru_cache(maxsize=256)
def _field_names(schema: Any) -> frozenset[str]:
    """Every property name in the schema's JSON schemas, by alias and by name."""
    names: set[str] = set()
    for by_alias in (True, False):
        try:
            stack: list[Any] = [_adapter(schema).json_schema(by_alias=by_alias)]
        except Exception:  # noqa: S112 - a schema pydantic cannot render has no names to show
            continue
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                properties = node.get("properties")
                if isinstance(properties, dict):
                    names.update(properties)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return frozenset(names)


def pydantic_exact_value(response: Any, schema: Any) -> Any:
    """Validate ``response`` with pydantic; return its plain data, ready for canonical JSON."""
    import pydantic

    adapter = _adapter(schema)
    try:
        if isinstance(response, msgspec.Raw):
            value = adapter.validate_json(bytes(response))
        else:
            value = adapter.validate_python(response)
    except pydantic.ValidationError as exc:
        raise ValueError(
            "exact_response does not validate against exact_schema: "
            + _describe(exc, schema, _JSON if isinstance(response, msgspec.Raw) else response)
        ) from None
    # warnings=False: a field assigned a wrong type is reported by the read-back's check,
    # without pydantic's serializer warning, which quotes the value.
    return _plain(adapter.dump_python(value, by_alias=True, warnings=False))


def pydantic_decode(data: bytes | memoryview | str, schema: Any) -> Any:
    """Decode JSON with pydantic; ``ValueError`` (path and message, no content) if it fails."""
    import pydantic

    try:
        return _adapter(schema).validate_json(bytes(data) if isinstance(data, memoryview) else data)
    except pydantic.ValidationError as exc:
        raise ValueError(_describe(exc, schema)) from None


def pydantic_plain(value: Any) -> Any:
    """A pydantic model instance as plain data (by alias); anything else unchanged."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(value, pydantic.BaseModel):
        return value
    return _plain(value.model_dump(by_alias=True, warnings=False))  # see above: no quoted value


def plain_hook(obj: Any) -> Any:
    """An msgspec ``enc_hook``: a pydantic model (also inside lists) as its plain data."""
    plain = pydantic_plain(obj)
    if plain is obj:
        raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")
    return plain


def _plain(data: Any) -> Any:
    # Builtins msgspec encodes the way it encodes the same data from a Struct (datetimes,
    # UUIDs, decimals, enums); pydantic-only values (URLs, secrets) become pydantic's JSON form.
    return msgspec.to_builtins(data, enc_hook=_jsonable)


def _jsonable(obj: Any) -> Any:
    import pydantic_core

    return pydantic_core.to_jsonable_python(obj)


def pydantic_json_schema(schema: Any) -> dict[str, Any]:
    """The pydantic JSON schema for validating ``schema`` (by alias), to be made strict."""
    out: dict[str, Any] = _adapter(schema).json_schema(mode="validation")
    return out


def resolve_pydantic_fallback(options: Any, summary_schema: Any) -> tuple[Any, Any]:
    """Split ``options`` into (options with a placeholder fallback, the validated fallback).

    The caller validates everything else the msgspec way; the fallback is validated here. When
    there is no fallback to split off, ``options`` comes back as it is and the fallback is None.
    """
    import pydantic

    from ._models import CompactionOptions

    if isinstance(options, CompactionOptions):
        fallback = options.fallback
        rest: Any = msgspec.structs.replace(options, fallback=None)
    elif isinstance(options, Mapping) and "fallback" in options:
        fallback = options["fallback"]
        rest = {**options, "fallback": None}
    else:
        return options, None
    if callable(fallback) and not isinstance(fallback, pydantic.BaseModel | type):
        return rest, fallback  # a fallback function: its result is checked when it is called
    return rest, _summary(fallback, summary_schema, "invalid compaction options: fallback")


def pydantic_fallback_value(made: Any, summary_schema: Any) -> Any:
    """What a fallback function returned, validated against a pydantic summary schema."""
    return _summary(made, summary_schema, "the fallback function's result is not a summary")


def _summary(value: Any, summary_schema: Any, what: str) -> Any:
    import pydantic

    try:
        # As plain data: pydantic takes a model instance as it is (revalidate_instances is
        # "never"), with whatever was assigned to it after construction.
        return _adapter(summary_schema).validate_python(pydantic_plain(value))
    except pydantic.ValidationError as exc:
        raise ValueError(f"{what}: {_describe(exc, summary_schema)}") from None
