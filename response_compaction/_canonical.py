"""Canonical JSON and schema validation. Pure: no I/O, no event loop.

The canonical form is msgspec JSON with every object's keys sorted, no whitespace, UTF-8.
It is *not* RFC 8785 (numbers are msgspec's shortest round-trip form, strings are escaped
the msgspec way). NaN and infinities are refused instead of being written as ``null``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec

from ._encoding import TooDeepError
from ._messages import content_free
from ._pydantic import is_pydantic_schema, pydantic_decode, pydantic_exact_value
from ._refusals import duplicate_key_path, keys_may_merge, merged_key_path
from ._stream import PIECE_BYTES, TOO_DEEP, Span, iter_canonical

__all__ = [
    "PIECE_BYTES",
    "TOO_DEEP",
    "Span",
    "canonical_bytes",
    "decode_exact",
    "duplicate_keys_message",
    "iter_canonical",
    "merged_keys_message",
    "to_exact_value",
]


def to_exact_value(response: Any, schema: Any) -> Any:
    """Turn what the caller handed us into a value of ``schema``.

    ``msgspec.Raw`` is decoded as JSON against the schema; an instance of a struct schema is
    taken as it is (it is validated later through its canonical bytes); anything else is
    converted from builtins. Raises ``ValueError`` saying where and how it does not fit, never
    quoting a value or a key of the response (:func:`content_free`).
    A pydantic schema is validated by pydantic and comes back as plain data.
    """
    if is_pydantic_schema(schema):
        return pydantic_exact_value(response, schema)
    try:
        value, plain = _convert(response, schema)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(
            f"exact_response does not validate against exact_schema: {content_free(exc)}"
        ) from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if plain is not None and keys_may_merge(schema):
        # A schema with float, UUID, datetime... keys reads "1" and "1.0" as one key: the
        # input had two members, the value would keep one.
        path = merged_key_path(value, plain())
        if path is not None:
            raise ValueError(merged_keys_message(path))
    return value


def merged_keys_message(path: str) -> str:
    """The refusal of two keys that ``exact_schema`` reads as one, in the object at ``path``."""
    return (
        "exact_response has two keys that exact_schema reads as one key in the object"
        f" at `{path}`; decoding would keep only the last"
    )


def duplicate_keys_message(path: str) -> str:
    """The refusal of JSON text that names one key twice in the object at ``path``."""
    return (
        f"exact_response is JSON text with an object that names one key twice at `{path}`;"
        " decoding would keep only the last"
    )


def _convert(response: Any, schema: Any) -> tuple[Any, Callable[[], Any] | None]:
    """The value of ``schema``, and how to get the input as plain JSON to compare keys with."""
    if isinstance(response, msgspec.Raw):
        value = _decoder(schema).decode(response)
        data = bytes(memoryview(response))
        _refuse_duplicate_keys(data)
        return value, functools.partial(msgspec.json.decode, data)
    # Only a struct instance is taken as is: other "types" (typing.Any on 3.11 is one)
    # may refuse isinstance, and convert() handles them all.
    struct_schema = isinstance(schema, type) and issubclass(schema, msgspec.Struct)
    if struct_schema and isinstance(response, schema):
        return response, None
    return msgspec.convert(response, schema), lambda: response


def _refuse_duplicate_keys(data: bytes) -> None:
    path = duplicate_key_path(data)
    if path is not None:
        raise ValueError(duplicate_keys_message(path))


def decode_exact(data: bytes | memoryview, schema: Any) -> Any:
    """Decode canonical bytes against ``schema``; a content-free ``ValueError`` if not."""
    if is_pydantic_schema(schema):
        return pydantic_decode(data, schema)
    try:
        return _decoder(schema).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(content_free(exc)) from None
    except RecursionError:
        raise TooDeepError("the value nests too deeply to decode here") from None


@functools.lru_cache(maxsize=256)
def _decoder(schema: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(schema)


def canonical_bytes(value: Any) -> bytes:
    """The whole canonical encoding of ``value`` at once (for small values)."""
    return b"".join(iter_canonical(value))
