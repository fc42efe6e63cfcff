"""Option validation. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ._models import CompactionOptions
from ._pydantic import is_pydantic_schema, resolve_pydantic_fallback

__all__ = ["MAX_TTL_SECONDS", "resolve_options"]


def resolve_options(options: object, summary_schema: Any) -> CompactionOptions[Any]:
    """Validate ``options`` (a ``CompactionOptions`` or a mapping) against ``summary_schema``.

    Returns a ``CompactionOptions`` whose fallback is a validated value of the summary schema
    (or the caller's fallback function, which is called, and its result checked, later).
    Raises ``ValueError`` naming the offending key: also for integers beyond what the store
    can hold (a TTL over 100 years) and for text that is not valid Unicode.
    """
    if is_pydantic_schema(summary_schema, "summary_schema"):
        rest, fallback = resolve_pydantic_fallback(options, summary_schema)
        resolved = resolve_options(rest, Any)
        _check_grounded(resolved.grounded, summary_schema)
        return msgspec.structs.replace(resolved, fallback=fallback)
    if isinstance(options, CompactionOptions):
        # msgspec does not validate on construction: check the fields as if they were decoded.
        data: dict[str, Any] = {f: getattr(options, f) for f in options.__struct_fields__}
        if _fallback_function(options.fallback) is None:  # a function stays one (below)
            data["fallback"] = _builtins_of_fallback(options.fallback)
    elif isinstance(options, Mapping):
        data = dict(options)
        if "fallback" in data and isinstance(data["fallback"], msgspec.Struct):
            data["fallback"] = _builtins_of_fallback(data["fallback"])
    else:
        raise ValueError(  # noqa: TRY004 - the contract: wrongly typed options are ValueError
            f"options must be CompactionOptions or a mapping, got {type(options).__name__}"
        )
    function = _fallback_function(data.get("fallback"))
    try:
        if function is None:
            resolved = msgspec.convert(data, CompactionOptions[summary_schema])
        else:  # msgspec cannot check a function: check the rest, then put it back
            checked = msgspec.convert({**data, "fallback": None}, CompactionOptions[Any])
            resolved = msgspec.structs.replace(checked, fallback=function)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid compaction options: {exc}") from None
    _check_limits(resolved)
    _check_grounded(resolved.grounded, summary_schema)
    return resolved


def _fallback_function(fallback: object) -> Any:
    # A struct instance or a class is a value here, never a function to call.
    if callable(fallback) and not isinstance(fallback, msgspec.Struct | type):
        return fallback
    return None


def _check_grounded(fields: tuple[str, ...], summary_schema: Any) -> None:
    # By Python name (as grounding looks them up), a pydantic model's too.
    known = getattr(
        summary_schema, "__struct_fields__", getattr(summary_schema, "model_fields", None)
    )
    for name in fields:
        if known is not None and name not in known:
            raise ValueError(
                f"invalid compaction options: grounded names {name!r}, which is not a field "
                f"of {getattr(summary_schema, '__name__', 'the summary schema')}"
            )


#: Upper bounds the store can represent: expiry times are floats (a TTL of 10**400 seconds
#: overflowed after the value was written) and counts and sizes are SQLite 64-bit integers.
MAX_TTL_SECONDS = 100 * 366 * 86400
_INT64 = 2**63 - 1
_UPPER = {
    "ttl_seconds": MAX_TTL_SECONDS,
    "max_entries": _INT64,
    "summarize_above_bytes": _INT64,
}


def _check_limits(options: CompactionOptions[Any]) -> None:
    # Checked here, before any work, so nothing is stored under options that fail later.
    for key, upper in _UPPER.items():
        if getattr(options, key) > upper:
            raise ValueError(
                f"invalid compaction options: Expected `int` <= {upper} - at `$.{key}`"
            )
    for key in ("instructions", "ladder"):
        try:
            getattr(options, key).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "invalid compaction options: a string that is not valid Unicode"
                f" (a lone surrogate) - at `$.{key}`"
            ) from None


def _builtins_of_fallback(fallback: object) -> Any:
    # to_builtins (not a JSON round trip) so the fallback comes back unchanged: JSON would turn
    # a NaN into null. What cannot be converted at all is a wrongly typed option.
    try:
        return msgspec.to_builtins(fallback)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"invalid compaction options: fallback: {exc}") from None
