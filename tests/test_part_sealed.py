"""Item counts a layout carries are believed only when the store's key sealed them."""

from __future__ import annotations

import hmac
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import anyio.lowlevel
import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import Span, iter_canonical
from response_compaction._part import part_of
from response_compaction._part_index import RootObject, forget_counts, index_document
from response_compaction._slices import decode_layout, encode_layout, open_layout, seal_layout
from response_compaction._store._verify import opened_layout, sealed_layout
from tests._store_support import TEST_KEY
from tests.schemas import FALLBACK, Exact, Summary, big_exact

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}
# Rows of a compacted value: over the size the encoder writes in one piece, so it is sliced.
ROWS = 40_000
_LAYOUTS = msgspec.json.Decoder(list[Span])


def encoded(value: Any, piece_bytes: int = 2000) -> tuple[bytes, list[Span]]:
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes, layout))
    return data, layout


def signer(key: bytes) -> Any:
    return lambda message: hmac.new(key, b"test\0" + message, "sha256").hexdigest()


def true_counts(data: bytes, span: Span) -> list[int]:
    return [len(msgspec.json.decode(b"[" + data[a:b] + b"]")) for a, b in span.slices]


def test_the_writer_counts_the_items_of_each_slice() -> None:
    """Each recorded count is the number of items the slice's bytes hold."""
    data, spans = encoded(big_exact(700))
    (span,) = spans
    assert len(span.slices) > 3
    assert list(span.counts) == true_counts(data, span)
    assert sum(span.counts) == 700


def test_counts_open_only_under_a_matching_seal() -> None:
    """The right signer keeps the counts; another key, changed counts, an old or a hint
    layout give spans without counts."""
    _, spans = encoded(big_exact(700))
    sign = signer(b"k" * 32)
    sealed = seal_layout(spans, sign)
    assert [s.counts for s in open_layout(sealed, sign)] == [spans[0].counts]
    assert open_layout(sealed, sign)[0].seal == ""
    assert open_layout(sealed, signer(b"x" * 32))[0].counts == ()
    assert decode_layout(sealed)[0].counts == ()
    (stored,) = _LAYOUTS.decode(sealed)
    shifted = (stored.counts[0] + 1, *stored.counts[1:-1], stored.counts[-1] - 1)
    tampered = encode_layout([msgspec.structs.replace(stored, counts=shifted)])
    assert open_layout(tampered, sign)[0].counts == ()
    old = msgspec.json.encode([[s.field, s.start, s.end, s.slices] for s in spans])
    assert open_layout(old, sign) == decode_layout(sealed)  # an older writer's row: a hint
    short = seal_layout([msgspec.structs.replace(spans[0], counts=spans[0].counts[1:])], sign)
    assert open_layout(short, sign)[0].counts == ()  # sealed, but cannot describe the slices


def test_a_seal_is_bound_to_its_entry() -> None:
    """A layout sealed for one entry does not open for another name or recorded digest."""
    _, spans = encoded(big_exact(700))
    stored = sealed_layout(TEST_KEY, "exact", "a" * 64, "a" * 64, spans)
    assert opened_layout(TEST_KEY, "exact", "a" * 64, "a" * 64, stored)[0].counts
    assert opened_layout(TEST_KEY, "exact", "b" * 64, "a" * 64, stored)[0].counts == ()
    assert opened_layout(TEST_KEY, "exact", "a" * 64, "b" * 64, stored)[0].counts == ()
    assert opened_layout(TEST_KEY, "summary", "a" * 64, "a" * 64, stored)[0].counts == ()
    assert sealed_layout(TEST_KEY, "exact", "a" * 64, "a" * 64, []) is None


async def test_sealed_counts_skip_the_scan() -> None:
    """With counts no slice is decoded to index the document (no checkpoint is needed), and
    parts equal those cut from the bytes alone."""
    data, spans = encoded(big_exact(2000), piece_bytes=4000)
    turns = 0

    async def checkpoint() -> None:
        nonlocal turns
        turns += 1
        await anyio.lowlevel.checkpoint()

    forget_counts()
    node = await index_document(data, spans, "sealed-" + secrets.token_hex(4), checkpoint)
    assert isinstance(node, RootObject)
    assert turns == 0
    for kwargs in (
        {"pointer": "/rows", "start": 1500, "max_bytes": 900},
        {"pointer": "/rows/1999"},
        {"pointer": "", "max_bytes": 256},
    ):
        assert part_of(node, **kwargs) == part_of(data, **kwargs), kwargs


def _root(tmp_path: Path) -> Path:
    return tmp_path / "ws" / "response-compaction-v1"


def _stored_span(tmp_path: Path) -> Span:
    with sqlite3.connect(_root(tmp_path) / "index.sqlite3") as conn:
        (blob,) = conn.execute("SELECT layout FROM entries WHERE kind = 'exact'").fetchone()
    conn.close()
    (span,) = _LAYOUTS.decode(blob)
    return span


def _rewrite_layout(tmp_path: Path, spans: list[Span], *, old: bool = False) -> None:
    blob = encode_layout(spans)
    if old:  # as written before counts and seals: four elements a span
        blob = msgspec.json.encode([[s.field, s.start, s.end, s.slices] for s in spans])
    with sqlite3.connect(_root(tmp_path) / "index.sqlite3") as conn:
        conn.execute("UPDATE entries SET layout = ? WHERE kind = 'exact'", (blob,))
    conn.close()


async def _compacted(harness: rc.Harness) -> tuple[Exact, str, str]:
    forget_counts()  # as in a fresh process: only the row can tell the counts
    value = big_exact(ROWS)
    ref = (await rc.response_compact(harness, value, Exact, Summary, OPTIONS)).receipt.exact_ref
    return value, ref, ref.removeprefix("rc1:")


async def test_a_compacted_entry_keeps_sealed_counts(harness: rc.Harness, tmp_path: Path) -> None:
    """The row a compaction writes opens, under the store's key, with the true counts."""
    _, _, hex_digest = await _compacted(harness)
    span = _stored_span(tmp_path)
    data = (_root(tmp_path) / "exact" / hex_digest[:2] / hex_digest).read_bytes()
    assert len(span.slices) > 3
    assert span.seal
    blob = encode_layout([span])
    (opened,) = opened_layout(TEST_KEY, "exact", hex_digest, hex_digest, blob)
    assert list(opened.counts) == true_counts(data, span)


def _shifted(span: Span) -> Span:
    """Counts that, if believed, show the item before the one asked for in slice 2 onwards
    (slice 1's own count is still right, so reading it would not notice)."""
    counts = (span.counts[0] + 1, *span.counts[1:-1], span.counts[-1] - 1)
    return msgspec.structs.replace(span, counts=counts)


async def test_first_read_believes_the_sealed_counts(harness: rc.Harness, tmp_path: Path) -> None:
    """The first read_part of an entry uses the row's sealed counts, not a scan: counts
    re-sealed with the store's key that contradict the slice read make it Broken."""
    _, ref, hex_digest = await _compacted(harness)
    span = _stored_span(tmp_path)
    wrong = msgspec.structs.replace(span, counts=(span.counts[0] - 1, *span.counts[1:]))
    resealed = sealed_layout(TEST_KEY, "exact", hex_digest, hex_digest, [wrong])
    assert resealed is not None
    _rewrite_layout(tmp_path, _LAYOUTS.decode(resealed))
    result = await rc.response_compaction_read_part(harness, ref, pointer="/rows/0")
    assert isinstance(result, rc.Broken)
    assert "sealed layout does not match" in result.detail


@pytest.mark.parametrize("seal", ["kept", "forged", "none", "old"])
async def test_counts_changed_in_the_index_are_ignored(
    harness: rc.Harness, tmp_path: Path, seal: str
) -> None:
    """Counts rewritten under the old seal, a seal made without the key, no seal at all, or
    a layout from before counts: the first read counts the items itself, rightly."""
    value, ref, _ = await _compacted(harness)
    shifted = _shifted(_stored_span(tmp_path))
    if seal == "forged":
        forged = seal_layout([shifted], signer(secrets.token_bytes(32)))
        (shifted,) = _LAYOUTS.decode(forged)
    elif seal == "none":
        shifted = msgspec.structs.replace(shifted, seal="")
    _rewrite_layout(tmp_path, [shifted], old=seal == "old")
    far = shifted.counts[0] + shifted.counts[1] - 1  # the first item of slice 3
    for args in ({"pointer": f"/rows/{far}"}, {"pointer": "/rows", "start": far, "stop": far + 3}):
        result = await rc.response_compaction_read_part(harness, ref, **args)
        assert isinstance(result, rc.Found)
        shown = result.value.value if "start" in args else [result.value.value]
        assert shown == msgspec.to_builtins(value.rows[far : far + len(shown)])
    whole = await rc.response_compaction_read_part(harness, ref, pointer="/rows", max_bytes=256)
    assert isinstance(whole, rc.Found)
    assert whole.value.total_items == ROWS


async def test_tampered_bytes_under_a_sealed_layout_read_broken(
    harness: rc.Harness, tmp_path: Path
) -> None:
    """A sealed layout vouches for nothing: a changed item far inside still reads Broken."""
    _, ref, hex_digest = await _compacted(harness)
    assert _stored_span(tmp_path).seal
    path = _root(tmp_path) / "exact" / hex_digest[:2] / hex_digest
    data = bytearray(path.read_bytes())
    data[data.rindex(b"nnnn")] = ord("m")
    path.write_bytes(bytes(data))
    result = await rc.response_compaction_read_part(harness, ref, pointer=f"/rows/{ROWS - 1}")
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail
