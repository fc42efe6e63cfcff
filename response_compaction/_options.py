"""Option validation. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ._models import CompactionOptions

__all__ = ["resolve_options"]


def resolve_options(options: object, summary_schema: Any) -> CompactionOptions[Any]:
    """Validate ``options`` (a ``CompactionOptions`` or a mapping) against ``summary_schema``.

    Returns a ``CompactionOptions`` whose fallback is a validated value of the summary schema.
    Raises ``ValueError`` naming the offending key.
    """
    if isinstance(options, CompactionOptions):
        # msgspec does not validate on construction: check the fields as if they were decoded.
        data: dict[str, Any] = {f: getattr(options, f) for f in options.__struct_fields__}
        data["fallback"] = msgspec.json.decode(msgspec.json.encode(options.fallback))
    elif isinstance(options, Mapping):
        data = dict(options)
        if "fallback" in data and isinstance(data["fallback"], msgspec.Struct):
            data["fallback"] = msgspec.json.decode(msgspec.json.encode(data["fallback"]))
    else:
        raise ValueError(  # noqa: TRY004 - the contract: wrongly typed options are ValueError
            f"options must be CompactionOptions or a mapping, got {type(options).__name__}"
        )
    try:
        return msgspec.convert(data, CompactionOptions[summary_schema])
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid compaction options: {exc}") from None
