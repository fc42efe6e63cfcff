"""One call of the canonical encoder, with the checks that keep it the value handed in. Pure.

msgspec writes NaN and infinities as ``null``; a lone surrogate cannot be UTF-8; an int- or
float-keyed dict has its keys written as strings, so two keys may become one. Each would
store a value other than the one handed in: :func:`encode_checked` refuses them with
:class:`RefusedError`, naming the path relative to what it was given.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ._own import is_array, plain
from ._refusals import first_problem

__all__ = ["ENCODER", "RefusedError", "TooDeepError", "encode_checked", "line_safe"]

ENCODER = msgspec.json.Encoder(order="sorted")
# A float64 in msgpack is 0xcb + 8 big-endian bytes; NaN and +-inf have all exponent bits set.
_NON_FINITE_MSGPACK = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")
_MSGPACK = msgspec.msgpack.Encoder()
# sre's literal search reads bytes about twice as fast as ``b"null" in data`` (measured on
# 10 MB of canonical JSON: 5.2 against 8.0 ms), and this scan covers every byte written.
_NULL = re.compile(rb"null")
#: A suspicious scan of a longer list is narrowed to its suspicious parts before any walk.
_NARROW_ITEMS = 64
# JSON leaves U+0085, U+2028 and U+2029 unescaped, and str.splitlines (and some hosts) break
# lines at them: JSON shown in a text of lines could start a line of its own.
_LINE_BREAKS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def line_safe(data: bytes) -> bytes:
    """``data`` (JSON) with its line-breaking characters escaped: the same value, one line."""
    if all(raw not in data for raw, _ in _LINE_BREAKS):  # "…" and curly quotes pass at once
        return data
    for raw, escaped in _LINE_BREAKS:
        data = data.replace(raw, escaped)
    return data


class RefusedError(ValueError):
    """A piece holds something canonical JSON refuses; ``problem`` says what, relative to it."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class TooDeepError(ValueError):
    """A decode ran out of stack; on a shallower one (a worker thread's) it may not."""


def encode_checked(value: Any, *, scan_nulls: bool = True, str_keys: bool = False) -> bytes:
    """``value``'s canonical JSON; :class:`RefusedError` if it would not be ``value``.

    ``scan_nulls=False`` leaves a NaN or infinity written as ``null`` to the caller, whose
    schema refuses ``null`` wherever a NaN could stand (``_nulls.nulls_left_to_schema``).
    ``str_keys=True``: the encoder's ``TypeError`` (a non-str key, or a type it cannot write)
    is raised as it is, for a caller that then encodes the value in parts.
    """
    try:
        data = ENCODER.encode(value)
    except TypeError:
        if str_keys:
            raise
        return _encode_non_str_keys(value)
    except UnicodeEncodeError:
        _refuse(value)  # names the path of the string that could not be encoded
        # A str-like object the walk cannot see into. Not the error itself: it holds the text.
        raise RefusedError("a string that is not valid Unicode (a lone surrogate)") from None
    if scan_nulls and _NULL.search(data) is not None:
        _refuse_non_finite(value)
    return data


def _encode_non_str_keys(value: Any) -> bytes:
    # msgspec sorts only str keys. JSON keys are strings anyway, so an int- or float-keyed dict
    # (dict[int, X] is a fine schema) is written with its keys as the strings a decoder turns
    # back into them, sorted like any other keys. Keys that would become the same string
    # (1 and "1") or a non-finite float ("nan") would change the value: refused first.
    _refuse(value)
    try:
        # A Raw is JSON text already (the walk's placeholders are Raws): passed through as is.
        builtins = msgspec.to_builtins(
            value, str_keys=True, order="sorted", builtin_types=(msgspec.Raw,)
        )
        return ENCODER.encode(builtins)
    except TypeError as exc:
        raise ValueError(f"exact_response cannot be encoded as JSON: {exc}") from None


def _refuse_non_finite(value: Any) -> None:
    # msgspec writes NaN and infinities as null. A null in the output is usually a real None;
    # a msgpack scan (floats stay floats there) tells the two apart cheaply, and only a
    # suspicious scan, or a value msgpack cannot hold (an integer beyond 64 bits), pays for a
    # walk of the value.
    try:
        suspicious = _NON_FINITE_MSGPACK.search(_MSGPACK.encode(value)) is not None
    except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
        suspicious = True
    if not suspicious:
        return
    value = plain(value)  # its own items: a subclass's __len__ or slices may hide some
    if is_array(value) and len(value) > _NARROW_ITEMS:
        # Bytes inside a float or a string can look like a NaN (one 1 MB value in 16 of
        # random rows did): scan parts and walk only the parts still suspicious, not 1 MB.
        step = -(-len(value) // 16)
        for start in range(0, len(value), step):
            _refuse_non_finite(value[start : start + step])
        return
    _refuse(value)


def _refuse(value: Any) -> None:
    problem = first_problem(value)
    if problem is not None:
        raise RefusedError(problem)
