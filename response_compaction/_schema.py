"""msgspec type -> strict structured-output JSON schema. Pure: no I/O.

Strict mode wants an object root, ``additionalProperties: false`` on every object, every
property listed in ``required``, and no ``default``/``allOf``/``not``/``if``. We inline
``$ref``s, drop defaults and validation keywords the strict subset does not promise to
honour (msgspec still checks every constraint when the reply is decoded, which stays the only
acceptance gate), and refuse shapes strict mode cannot express.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec

from ._errors import SchemaError
from ._pydantic import is_pydantic_schema, pydantic_json_schema

__all__ = ["schema_name", "strict_json_schema"]

_KEEP = frozenset({"type", "properties", "items", "anyOf", "enum", "const", "description", "title"})
_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


def schema_name(summary_schema: Any) -> str:
    """A name for the schema as the API wants it: ``[A-Za-z0-9_-]{1,64}``."""
    name = getattr(summary_schema, "__name__", None) or "summary"
    return _NAME_BAD.sub("_", name)[:64] or "summary"


def strict_json_schema(summary_schema: Any) -> dict[str, Any]:
    """The strict JSON schema for ``summary_schema``; :class:`SchemaError` if there is none."""
    try:
        hash(summary_schema)
    except TypeError:
        raise SchemaError(
            f"summary_schema must be a type, got a {type(summary_schema).__name__} value"
        ) from None
    return _strict_json_schema(summary_schema)


@functools.lru_cache(maxsize=128)
def _strict_json_schema(summary_schema: Any) -> dict[str, Any]:
    pydantic = is_pydantic_schema(summary_schema, "summary_schema")  # ValueError: no extra
    try:
        if pydantic:
            raw = pydantic_json_schema(summary_schema)
        else:
            raw = msgspec.json.schema(summary_schema)
    except (TypeError, ValueError) as exc:
        raise SchemaError(
            f"summary_schema is not a msgspec type (nor a pydantic model): {exc}"
        ) from None
    defs: dict[str, Any] = raw.get("$defs", {})
    converted: dict[str, Any] = _convert(raw, defs, (), "$")
    if converted.get("type") != "object":
        raise SchemaError(
            "summary_schema must be an object type (a msgspec.Struct or pydantic model): "
            "strict structured output needs an object at the root"
        )
    return converted


def _convert(node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...], at: str) -> Any:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            raise SchemaError(f"recursive summary schemas are not supported ({name} at {at})")
        return _convert(defs[name], defs, (*seen, name), at)
    for bad in ("allOf", "not", "if", "oneOf", "prefixItems"):
        if bad in node:
            raise SchemaError(f"summary_schema uses {bad!r} at {at}, which strict mode refuses")
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP}
    if "anyOf" in node:
        out["anyOf"] = [_convert(x, defs, seen, at) for x in node["anyOf"]]
    kind = node.get("type")
    if "enum" in node and kind is None:
        values = [v for v in node["enum"] if v is not None]
        if len(values) < len(node["enum"]):  # Literal["a", None]: strict mode wants a union
            if not values:
                return {"type": "null"}
            return {"anyOf": [_convert({"enum": values}, defs, seen, at), {"type": "null"}]}
        out["type"] = _enum_type(values, at)
    if kind == "object":
        props = node.get("properties")
        # forbid_unknown_fields Structs already say additionalProperties: false.
        if props is None or node.get("additionalProperties", False) is not False:
            raise SchemaError(
                f"summary_schema has a free-form mapping at {at}; strict mode needs fixed "
                "properties (use a Struct instead of dict)"
            )
        out["properties"] = {
            key: _convert(value, defs, seen, f"{at}.{key}") for key, value in props.items()
        }
        out["required"] = list(props)
        out["additionalProperties"] = False
    elif kind == "array":
        if "items" not in node:
            raise SchemaError(f"summary_schema has an array of unknown items at {at}")
        out["items"] = _convert(node["items"], defs, seen, f"{at}[]")
    elif kind is None and "anyOf" not in node and "enum" not in node and "const" not in node:
        raise SchemaError(f"summary_schema has an untyped value (Any) at {at}")
    return out


def _enum_type(values: list[Any], at: str) -> str | list[str]:
    kinds = {type(v) for v in values}
    if kinds <= {str}:
        return "string"
    if kinds <= {int}:
        return "integer"
    raise SchemaError(f"summary_schema has a mixed enum at {at}")
