"""Cutting one large JSON array or object of a ``Raw`` input into slices that decode apart.

The container's text is cut into slices of about ``SLICE_BYTES``; each is decoded as the
container's own type (``[`` + elements + ``]`` as ``list[T]``, ``{`` + members + ``}`` as
``dict[str, V]``) with a checkpoint between steps, and checked for duplicate and merged keys
on its own. No byte of the input is trusted to say where an element ends: a cut is tried at a
comma that looks like a separator, and a slice only decodes when that comma lies between two
elements (or members) of this very container, since a cut inside a string or a nested value
leaves an open string or bracket. The container's end is where a structural decode of the text
from the slice's start stops with trailing characters; the slice up to it must decode too.

Problems are recorded, not raised, except a validation (or depth) error, which msgspec would
report first in the whole decode: the caller decides which part's problem the whole decode
names first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from ._canonical import TOO_DEEP
from ._messages import content_free
from ._refusals import duplicate_key_path, merged_key_path

__all__ = ["SLICE_BYTES", "Container", "NotCutError", "SliceError", "cut_container"]

#: Decoding and key-checking a slice this size holds the GIL for a few milliseconds.
SLICE_BYTES = 256 << 10
_TRIES = 8
_WINDOW = 4 * SLICE_BYTES
_WS = rb"[ \t\n\r]*"
_SKIP_WS = re.compile(_WS)
_STRING = rb'"(?:[^"\\]|\\.)*"'
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_ITEM_PATH = re.compile(r"\$\[(\d+)\]")
_SHAPES = {False: (b"[", b"]", list[msgspec.Raw]), True: (b"{", b"}", dict[str, msgspec.Raw])}

Checkpoint = Callable[[], Awaitable[None]]


class NotCutError(Exception):
    """The sliced decode does not apply here: decode the whole."""


class SliceError(Exception):
    """A slice does not validate (or nests too deeply): the whole decode's message, shifted."""


@dataclass(slots=True)
class Container:
    """One cut container: its value, where it ends, and the key problems found in it.

    Paths are relative to the container (``$`` is the container itself), in the notation of
    :func:`duplicate_key_path` (``dup``) and :func:`merged_key_path` (``merged``); each is
    the one the whole check would name first (the walks go last member first).
    """

    value: list[Any] | dict[str, Any]
    end: int  # offset of the closing bracket
    deep: bool = False  # the duplicate-key scanner recursed too deeply in a slice
    dup: str | None = None
    merged: str | None = None


@functools.lru_cache(maxsize=256)
def _decoder(container_type: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(container_type)


@functools.lru_cache(maxsize=4)
def _structural(mapping: bool) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(_SHAPES[mapping][2])


async def cut_container(
    data: memoryview,
    opened: int,
    container_type: Any,
    *,
    mapping: bool,
    where: str,
    merge: bool,
    checkpoint: Checkpoint,
) -> Container | None:
    """The container whose bracket is at ``opened``, decoded slice by slice; None if empty.

    ``where`` is the container's path in the whole input, for validation messages.
    Raises :class:`SliceError` for a slice that does not validate, :class:`NotCutError`
    when no cut fits.
    """
    start = _SKIP_WS.match(data, opened + 1).end()  # type: ignore[union-attr]  # always matches
    if bytes(data[start : start + 1]) in (_SHAPES[mapping][1], b""):
        return None
    separators = _separators(data, start, mapping=mapping)
    found = Container({} if mapping else [], -1)
    while True:
        end, chunk, part = await _next_cut(
            data, start, separators, _decoder(container_type), mapping, checkpoint
        )
        if isinstance(part, SliceError):
            raise SliceError(_shifted(str(part), where, mapping, len(found.value)))
        base = len(found.value)
        _absorb(found, part, mapping)
        await checkpoint()
        _check_keys(found, chunk, part, base, mapping=mapping, merge=merge)
        await checkpoint()
        if bytes(data[end : end + 1]) == _SHAPES[mapping][1]:
            found.end = end
            return found
        start = end + 1


def _absorb(found: Container, part: Any, mapping: bool) -> None:
    if mapping:
        members: dict[str, Any] = found.value  # type: ignore[assignment]
        before = len(members)
        members.update(part)  # a repeated key keeps its first place and its last value
        if len(members) != before + len(part):
            found.dup = "$"  # a key decoded in an earlier slice: the object names it twice
    else:
        found.value.extend(part)  # type: ignore[union-attr]


def _check_keys(
    found: Container, chunk: bytes, part: Any, base: int, *, mapping: bool, merge: bool
) -> None:
    """Record the slice's key problems; a later slice's replace an earlier one's.

    The whole checks walk the last member first, so the last slice with a problem is the
    one they name, except a key given twice in the container itself (named before its members).
    """
    if mapping or b"{" in chunk:  # without an object there is no key to give twice
        try:
            path = duplicate_key_path(chunk)
        except RecursionError:
            found.deep = True
            path = None
        if path is not None and found.dup != "$":
            found.dup = path if mapping else _shifted_path(path, base)
    if merge:
        path = merged_key_path(part, msgspec.json.decode(chunk))
        if path is not None:
            found.merged = path if mapping else _shifted_path(path, base)


def _separators(data: memoryview, start: int, *, mapping: bool) -> list[re.Pattern[bytes]]:
    """Patterns of the comma before the next element: a precise one first, then a broad one.

    A separator that also opens the first element's first key (``,{"id":``) rarely matches
    inside nested values, where a bare ``,{`` is everywhere (a chapter of sections of groups).
    """
    first = bytes(data[start : start + 1])
    broad = b"," + _WS + (b'"' if mapping else re.escape(first))
    value = start
    if mapping:
        key = re.compile(_STRING + _WS + b":" + _WS).match(data, start)
        if key is None:
            return [re.compile(broad)]
        value = key.end()
    opening = re.compile(rb"\{" + _WS + b"(" + _STRING + b")" + _WS + b":").match(data, value)
    if opening is not None:
        member = (_STRING + _WS + b":" + _WS) if mapping else b""
        precise = b"," + _WS + member + rb"\{" + _WS + re.escape(opening.group(1)) + _WS + b":"
        return [re.compile(precise), re.compile(broad)]
    if mapping and bytes(data[value : value + 1]):
        lead = re.escape(bytes(data[value : value + 1]))
        return [re.compile(b"," + _WS + _STRING + _WS + b":" + _WS + lead), re.compile(broad)]
    return [re.compile(broad)]


async def _next_cut(
    data: memoryview,
    start: int,
    separators: list[re.Pattern[bytes]],
    decoder: msgspec.json.Decoder[Any],
    mapping: bool,
    checkpoint: Checkpoint,
) -> tuple[int, bytes, Any]:
    """The next slice: where it ends (a comma, or the closing bracket), its text and value.

    The value is a :class:`SliceError` (not raised) when the slice is a real one that does
    not validate.
    """
    # Elements longer than a few slices are left to the whole decode: a separator pattern
    # tried at every comma of the rest of a 90 MB document is a long step by itself.
    # An object's slice costs about twice an array's per byte (hashing, and the key scan
    # sees every member): smaller slices keep its steps as short.
    size = SLICE_BYTES // 2 if mapping else SLICE_BYTES
    limit = min(start + _WINDOW, len(data))
    # The last slice first: what follows the container is never searched for separators.
    end = _closer(data, start, min(start + size + size // 2, limit), mapping)
    if end is not None:
        found = _slice(data, start, end, decoder, mapping)
        if found is None:
            raise NotCutError
        return found
    for separator in separators:
        commas: list[int] = []
        for match in separator.finditer(data, min(start + size, limit), limit):
            commas.append(match.start())
            if len(commas) == _TRIES:
                break
        high = commas[0] if commas else limit
        end = _closer(data, start, high, mapping) if high > start + size + size // 2 else None
        for cut in [end] if end is not None else commas:
            found = _slice(data, start, cut, decoder, mapping)
            if found is not None:
                return found
            await checkpoint()
        if end is not None:
            break  # the container ends before any of these commas: no other cut can fit
    raise NotCutError


def _slice(
    data: memoryview, start: int, cut: int, decoder: msgspec.json.Decoder[Any], mapping: bool
) -> tuple[int, bytes, Any] | None:
    chunk = b"".join((_SHAPES[mapping][0], data[start:cut], _SHAPES[mapping][1]))
    part = _decoded(chunk, decoder, mapping)
    return None if part is None else (cut, chunk, part)


def _closer(data: memoryview, start: int, high: int, mapping: bool) -> int | None:
    """The container's closing bracket when it lies before ``high``, else None."""
    window = b"".join((_SHAPES[mapping][0], data[start:high]))
    try:
        _structural(mapping).decode(window)
    except msgspec.DecodeError as exc:
        trailing = _TRAILING.search(str(exc))
        if trailing is None:
            return None  # truncated: the container goes on past ``high`` (or is malformed)
        stop = int(trailing.group(1)) - 1  # msgspec counts bytes from 1
    except RecursionError:
        return None
    else:
        stop = len(window)
    closer = len(window[:stop].rstrip(b" \t\n\r")) - 1
    if closer < 1 or window[closer : closer + 1] != _SHAPES[mapping][1]:
        return None
    return start + closer - 1


def _decoded(
    chunk: bytes, decoder: msgspec.json.Decoder[Any], mapping: bool
) -> list[Any] | dict[str, Any] | SliceError | None:
    """The slice's value; None when the cut is not between two members."""
    try:
        part: list[Any] | dict[str, Any] = decoder.decode(chunk)
    except msgspec.ValidationError as exc:  # first: it is a subclass of DecodeError
        try:
            _structural(mapping).decode(chunk)
        except msgspec.DecodeError:
            return None  # the cut closed a nested value early: not a real error
        return SliceError(
            f"exact_response does not validate against exact_schema: {content_free(exc)}"
        )
    except msgspec.DecodeError:
        return None  # a wrong cut, or malformed text (then the whole decode says where)
    except RecursionError:
        return SliceError(TOO_DEEP)
    return part or None  # an empty slice would accept a stray comma (`[1,,2]`, `[1,]`)


def _shifted(message: str, where: str, mapping: bool, base: int) -> str:
    """A slice's message with its path (``$[i]...``, ``$[...]``) made a path in the input."""
    if mapping:
        return message.replace("`$", f"`{where}", 1)
    return re.sub(
        r"`\$\[(\d+)\]", lambda m: f"`{where}[{int(m.group(1)) + base}]", message, count=1
    )


def _shifted_path(path: str, base: int) -> str:
    """A slice's path ``$[i]...`` as the container's ``$[base + i]...``."""
    return _ITEM_PATH.sub(lambda m: f"$[{int(m.group(1)) + base}]", path, count=1)
