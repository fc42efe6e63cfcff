"""The streaming canonical encoder: pieces a loop can hash and write between steps. Pure.

Large values are encoded as a stream of pieces whose concatenation is byte-identical to a
whole encoding: long sequences and string-keyed mappings are encoded in slices, and structs
are encoded around placeholders for their container fields. Callers can hash and write each
piece and yield to their event loop in between, so a 90 MB value never freezes it for long.
A long sequence or mapping that a spread sample of its items says fits in two pieces is
encoded in one: cutting it would cost more than the pause it saves.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from ._encoding import ENCODER, RefusedError, encode_checked
from ._own import field_of, fields, is_array, is_container, is_struct, plain, post_inits
from ._pydantic import pydantic_plain
from ._refusals import first_problem, refused
from ._span import Span
from ._whole import FIRST_SLICE, WHOLE_BYTES, few_items, spans_in

__all__ = ["PIECE_BYTES", "TOO_DEEP", "Span", "iter_canonical"]

#: Pieces aim at about this size: large enough to amortise per-call overhead, small enough
#: that encoding one holds the GIL for a few milliseconds.
PIECE_BYTES = 1 << 20

_HOLE = re.compile(rb"\x00(\d+)\x00")
#: An array or object whose sample projects at most this many times ``piece_bytes`` is
#: encoded in one piece: slicing it costs more (a copy of each slice, one encoder call and
#: one scan per slice: 3.3 against 1.5 ms for 1 MB of short strings) than it saves.
_WHOLE_PIECES = 2
_SAMPLE_ITEMS = 16
_MAPPING_SHARE = 4
#: A large dict's keys are checked this many at a time, one step of the loop each (mapping).
_KEY_RUN = 1 << 16
_Items = list[Any] | tuple[Any, ...] | dict[str, Any]
TOO_DEEP = (
    "exact_response nests too deeply for canonical JSON (the bound is Python's recursion"
    " limit, about 1000 levels by default)"
)


def iter_canonical(
    value: Any,
    piece_bytes: int = PIECE_BYTES,
    layout: list[Span] | None = None,
    *,
    scan_nulls: bool = True,
) -> Iterator[bytes | memoryview]:
    """Yield the canonical encoding of ``value`` in pieces of roughly ``piece_bytes``.

    The concatenation of the pieces equals ``msgspec.json.encode(value, order="sorted")``
    exactly. Raises ``ValueError`` naming the path of the first NaN or infinity, lone surrogate
    or pair of keys that would become one JSON key, and for nesting beyond the recursion
    limit: each would store a value other than the one handed in. When ``layout``
    is a list, a :class:`Span` is appended for each array streamed in slices at the top level
    or as a field of a top-level struct, so a reader can decode it slice by slice.
    ``scan_nulls=False``: NaN and infinities are written as ``null`` for the caller's schema
    to refuse (``_nulls.nulls_left_to_schema``).
    """
    value = pydantic_plain(value)
    return _guarded(value, _Stream(piece_bytes, layout, scan_nulls).top(value))


def _guarded(value: Any, pieces: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    try:
        yield from pieces
    except RefusedError as exc:
        # Pieces are encoded apart, so a piece's path is relative: name it from the top.
        raise refused(first_problem(value) or exc.problem) from None
    except RecursionError:
        # Values nested about a thousand levels deep exceed msgspec's (and this module's)
        # recursion: a clear ValueError, not a RecursionError from deep inside the encoder.
        raise ValueError(TOO_DEEP) from None


class _Stream:
    """One encoding in progress: ``pos`` counts the bytes yielded so far."""

    def __init__(self, piece_bytes: int, spans: list[Span] | None, scan_nulls: bool) -> None:
        self.piece_bytes = piece_bytes
        self.spans = spans
        self.pos = 0
        self.encode = functools.partial(encode_checked, scan_nulls=scan_nulls)
        self.encode_whole = functools.partial(encode_checked, scan_nulls=scan_nulls, str_keys=True)

    def emit(self, piece: bytes | memoryview) -> bytes | memoryview:
        self.pos += len(piece)
        return piece

    def top(self, value: Any) -> Iterator[bytes | memoryview]:
        """The whole value: in one call when its containers are few and short, else streamed.

        Streamed, each container of at most ``FIRST_SLICE`` items is one encoder call anyway
        (its first slice), so one call for a few of them holds the loop no longer than a few
        of those; the walk between them (placeholders, slices, spans) is what it saves. Over
        ``WHOLE_BYTES``, or over one piece, the layout the walk would record is found in the
        encoding, a step apart, and the encoding is handed on in pieces. A struct with a
        ``__post_init__`` takes one call whatever its size: the walk copies it with
        placeholders, and the copy runs it.
        """
        if not few_items(value) and not (is_struct(value) and post_inits(value)):
            yield from self.value(value, top=True)
            return
        try:
            whole = self.encode_whole(value)
        except RefusedError:
            raise
        except (TypeError, ValueError):
            # Non-str keys: written as strings a dict at a time, as the walk does (the whole
            # value through to_builtins took 700 ms where the walk took 13, and refused a Raw).
            yield from self.value(value, top=True)
            return
        if len(whole) <= min(WHOLE_BYTES, self.piece_bytes):
            yield self.emit(whole)
            return
        yield self.emit(b"")  # a step of its own
        if self.spans is not None:
            spans = spans_in(value, whole)
            if spans is None:  # not found: the walk records them (encoded twice, rare)
                yield self.emit(b"")
                yield from self.value(value, top=True)
                return
            self.spans += spans
        view = memoryview(whole)
        for at in range(0, len(whole), self.piece_bytes):
            yield self.emit(view[at : at + self.piece_bytes])

    def value(
        self, value: Any, *, top: bool = False, field: str | None = None
    ) -> Iterator[bytes | memoryview]:
        record = self.spans is not None and (top or field is not None)
        value = plain(value)  # what the encoder writes, whatever a subclass says (``_own``)
        if is_array(value) and len(value) > 1:
            yield from self.sequence(value, record, field)
        elif type(value) is dict and len(value) > 1:
            yield from self.mapping(value, record, field)
        elif (
            is_struct(value)
            and not type(value).__struct_config__.omit_defaults
            and not post_inits(value)  # its skeleton would be rebuilt through __post_init__
        ):
            yield from self.struct(value, top=top)
        else:
            yield self.emit(self.encode(value))

    def sequence(
        self, seq: list[Any] | tuple[Any, ...], record: bool, field: str | None
    ) -> Iterator[bytes | memoryview]:
        opened = self.pos
        yield self.emit(b"[")
        slices: list[tuple[int, int]] = []
        counts: list[int] = []
        start, step, count = 0, FIRST_SLICE, len(seq)
        whole = self.one_piece(seq, count)
        if whole is not None:
            began = self.pos
            yield self.emit(memoryview(whole)[1:-1])
            slices.append((began, self.pos))
            counts.append(count)
            start = count
        while start < count:
            if start:
                yield self.emit(b",")
            if step == 1 and _is_container(seq[start]):
                # One element alone is already too big for a piece: descend into it.
                record = False
                yield from self.value(seq[start])
                start += 1
                continue
            chunk = seq[start : start + step]
            body = self.encode(chunk)
            began = self.pos
            yield self.emit(memoryview(body)[1:-1])
            slices.append((began, self.pos))
            counts.append(len(chunk))
            start += len(chunk)
            step = _next_step(step, len(body), self.piece_bytes)
        yield self.emit(b"]")
        if record and self.spans is not None:
            self.spans.append(Span(field, opened, self.pos, tuple(slices), tuple(counts)))

    def mapping(
        self, mapping: dict[str, Any], record: bool, field: str | None
    ) -> Iterator[bytes | memoryview]:
        # msgspec sorts str keys by code point, which is what sorted() does, so sorted slices
        # concatenate into the same order a whole encoding uses. Keys are checked (type, order)
        # a run at a time, an empty piece (a loop step) between runs: over 562k keys decoded
        # from JSON the type check took 22-26 ms, the sort 29-30, each in one C call.
        keys: list[str] = []
        in_order = True
        members = iter(mapping)
        while run := list(itertools.islice(members, _KEY_RUN)):
            if not _str_keys(run):  # sorted as msgspec writes them, which sorted() is not
                yield self.emit(self.encode(mapping))
                return
            in_order = in_order and _ascending(keys[-1:] + run[:1]) and _ascending(run)
            keys += run
            if len(keys) < len(mapping) or len(keys) >= _KEY_RUN // 4:
                yield self.emit(b"")  # the encoding too is a step apart (62k keys: 4 + 7 ms)
        # Whole up to the same size as an array: building a dict per slice cost more than
        # encoding the dict (10.9 against 3.3 ms for 62k keys, a third of a 10 MB value's
        # encode). Left whole, it is decoded with the rest of its document on reads (its
        # field check, then the outer decode): a 10 MB read's longest turn went from 10-16
        # to 21 ms. Larger ones are cut in the smaller slices a reader needs (below).
        whole = self.one_piece(mapping, len(mapping), keys)
        if whole is not None:  # one slice: no span (see below)
            yield self.emit(whole)
            return
        opened = self.pos
        yield self.emit(b"{")
        if not in_order:  # a step of its own (a dict built in no order: one C call)
            keys.sort()
        slices: list[tuple[int, int]] = []
        counts: list[int] = []
        start, step, count = 0, FIRST_SLICE, len(keys)
        while start < count:
            if start:
                yield self.emit(b",")
            if step == 1 and _is_container(mapping[keys[start]]):
                record = False  # one member alone is too big for a piece: no slice holds it
                yield self.emit(self.encode(keys[start]))
                yield self.emit(b":")
                yield from self.value(mapping[keys[start]])
                start += 1
                continue
            chunk_keys = keys[start : start + step]
            body = self.encode({k: mapping[k] for k in chunk_keys})
            began = self.pos
            yield self.emit(memoryview(body)[1:-1])
            slices.append((began, self.pos))
            counts.append(len(chunk_keys))
            start += len(chunk_keys)
            # A reader decodes an object's slice about 3x slower per byte than an array's
            # (hashing and inserting each key): smaller slices keep its turns as short.
            step = _next_step(step, len(body), max(1, self.piece_bytes // _MAPPING_SHARE))
        yield self.emit(b"}")
        # A dict that fit one slice gains nothing from a span: small layouts stay small.
        if record and self.spans is not None and len(slices) > 1:
            span = Span(field, opened, self.pos, tuple(slices), tuple(counts), mapping=True)
            self.spans.append(span)

    def one_piece(self, items: _Items, count: int, keys: list[str] | None = None) -> Any:
        """The whole encoding of a long array or object that a spread sample says is small.

        None for fewer than ``_SAMPLE_ITEMS ** 2`` items (the sample would cost more than a
        sixteenth of the encoding; slices of so few items cost nothing to cut), or when the
        sample projects more than ``_WHOLE_PIECES`` times ``piece_bytes``: it is then sliced
        (the sample is a few items, so the regular path meets any problem with it again, and
        reports it).
        """
        if count < _SAMPLE_ITEMS * _SAMPLE_ITEMS:
            return None
        picks = [i * count // _SAMPLE_ITEMS for i in range(_SAMPLE_ITEMS)]
        if isinstance(items, dict):  # sampled through ``keys``: the dict's keys, in its order
            named = keys if keys is not None else list(items)
            sample: Any = {key: items[key] for key in map(named.__getitem__, picks)}
        else:
            sample = [items[i] for i in picks]
        try:
            sampled = len(ENCODER.encode(sample))
        except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
            return None
        if sampled * count > _WHOLE_PIECES * self.piece_bytes * _SAMPLE_ITEMS:
            return None
        return self.encode(items)

    def struct(self, value: msgspec.Struct, *, top: bool) -> Iterator[bytes | memoryview]:
        names = [name for name, _ in fields(value) if _is_container(field_of(value, name))]
        if not names:
            yield self.emit(self.encode(value))
            return
        placeholders = {name: msgspec.Raw(b"\x00%d\x00" % i) for i, name in enumerate(names)}
        skeleton = self.encode(msgspec.structs.replace(value, **placeholders))
        parts = _HOLE.split(skeleton)
        # split() alternates text and captured hole numbers: text, n, text, n, ..., text.
        if len(parts) != 2 * len(names) + 1:
            yield self.emit(self.encode(value))
            return
        encoded_names = dict(fields(value))
        for i in range(0, len(parts) - 1, 2):
            if parts[i]:
                yield self.emit(parts[i])
            name = names[int(parts[i + 1])]
            yield from self.value(field_of(value, name), field=encoded_names[name] if top else None)
        if parts[-1]:
            yield self.emit(parts[-1])


def _str_keys(keys: list[Any]) -> bool:
    # The set of key types, built in C: 9 ms for 562k keys, against 13 for all() over them.
    return set(map(type, keys)) == {str}


def _ascending(keys: list[str]) -> bool:
    """Whether ``keys`` (distinct) are in code point order, compared in C."""
    return all(map(operator.lt, keys, itertools.islice(keys, 1, None)))


def _is_container(value: Any) -> bool:
    return is_container(value) or is_struct(value)


def _next_step(step: int, body_bytes: int, piece_bytes: int) -> int:
    per_item = max(body_bytes / step, 1.0)
    return max(1, min(step * 4, int(piece_bytes / per_item)))
