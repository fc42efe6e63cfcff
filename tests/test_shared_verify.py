"""A large file verified by several workers at once, each decoding a share of its slices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction import _pool, _verifiers
from response_compaction._canonical import Span, decode_exact, iter_canonical
from response_compaction._digest import digest_hex
from response_compaction._slices import share_decodes
from response_compaction._stream import _Stream
from response_compaction._verifiers import MAX_SHARES, SHARED_VERIFY_BYTES
from tests._store_support import compact, ref_of
from tests.schemas import Exact, Row, big_exact


class Typed(msgspec.Struct, frozen=True):
    items: list[int]
    labels: dict[str, int]
    note: str = ""


class Loose(msgspec.Struct, frozen=True):
    """``Typed``'s fields with any values: what a writer may be handed."""

    items: list[Any]
    labels: dict[str, Any]
    note: Any = ""


def _encoded(value: Any, piece_bytes: int) -> tuple[bytes, tuple[Span, ...]]:
    """The streamed walk's bytes and layout: what a writer records for any value it slices
    (``iter_canonical`` encodes a small value of short containers in one call, no layout)."""
    layout: list[Span] = []
    walk = _Stream(piece_bytes, layout, True).value(value, top=True)
    data = b"".join(bytes(p) for p in walk)
    assert data == b"".join(bytes(p) for p in iter_canonical(value, piece_bytes))
    return data, tuple(layout)


def _whole_ok(data: bytes, schema: Any) -> bool:
    try:
        decode_exact(data, schema)
    except ValueError:
        return False
    return True


# A ``msgspec.Raw`` of blanks is written as it is: a slice of it holds no element.
ints_or_not = (
    st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(max_size=8)
    | st.sampled_from([msgspec.Raw(b" "), msgspec.Raw(b"\n\t ")])
)


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(ints_or_not, max_size=40),
    labels=st.dictionaries(st.text(max_size=10), ints_or_not, max_size=30),
    note=st.text(max_size=5) | st.integers(),
    piece_bytes=st.integers(min_value=1, max_value=300),
    shares=st.integers(min_value=1, max_value=4),
)
def test_every_share_vouching_is_exactly_the_whole_decode_succeeding(
    items: list[Any], labels: dict[str, Any], note: Any, piece_bytes: int, shares: int
) -> None:
    """Shares of a struct's fields, any of them (items, labels, the rest) maybe invalid: all
    shares succeed exactly when one whole decode does."""
    data, spans = _encoded(Loose(items=items, labels=labels, note=note), piece_bytes)
    outcomes = [share_decodes(data, Typed, spans, share, shares) for share in range(shares)]
    if spans:
        assert all(outcome is not None for outcome in outcomes) == _whole_ok(data, Typed)
    else:  # nothing was streamed in slices: no share can vouch, the whole decode decides
        assert outcomes == [None] * shares


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(st.integers(), min_size=2, max_size=60),
    piece_bytes=st.integers(min_value=1, max_value=100),
    shares=st.integers(min_value=1, max_value=4),
)
def test_the_shares_decode_every_item_once(items: list[int], piece_bytes: int, shares: int) -> None:
    """A top-level list: the shares' decoded items are the list's items, each exactly once."""
    data, spans = _encoded(items, piece_bytes)
    assert spans  # two items or more are streamed in slices
    decoded: list[int] = []
    for share in range(shares):
        outcome = share_decodes(data, list[int], spans, share, shares)
        assert outcome is not None
        decoded.extend(item for part in outcome for item in part)
    assert decoded == items


def test_a_layout_naming_the_wrong_field_vouches_for_nothing() -> None:
    """A span renamed to another list field of the struct fails share 0's placement check."""

    class Two(msgspec.Struct, frozen=True):
        a: list[int]
        b: list[int]

    data, spans = _encoded(Two(a=list(range(300)), b=[1]), 64)
    (span,) = [s for s in spans if s.field == "a"]
    assert share_decodes(data, Two, (span,), 0, 2) is not None
    forged = (msgspec.structs.replace(span, field="b"),)
    assert share_decodes(data, Two, forged, 0, 2) is None


def test_a_share_of_blanks_vouches_for_nothing() -> None:
    """A share whose only slice is whitespace decodes as an empty list, but the document
    (``[1,      ]``) is not JSON: that share fails."""
    data = b"[1,      ]"
    spans = (Span(None, 0, len(data), ((1, 2), (3, len(data) - 1))),)
    with pytest.raises(ValueError, match="malformed"):
        decode_exact(data, list[int])
    assert share_decodes(data, list[int], spans, 0, 2) is not None
    assert share_decodes(data, list[int], spans, 1, 2) is None


# ------------------------------------------------------------------ through the workers


@pytest.fixture
async def pool_of_two() -> int:
    """The pool started and idle; how many workers share a file. Needs two usable cores."""
    cores = _pool.usable_cores()
    if cores < 2:
        pytest.skip("one usable core: one worker, nothing to share")
    _pool.POOL.start()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= cores, 60)
    return min(cores, MAX_SHARES)


def _large(total: int = 1) -> Exact:
    value = big_exact(90_000, name_len=30)
    assert len(msgspec.json.encode(value)) > SHARED_VERIFY_BYTES
    return Exact(rows=value.rows, total=total)


@pytest.mark.anyio
async def test_a_large_value_is_verified_by_every_idle_worker(
    harness: rc.Harness, pool_of_two: int
) -> None:
    """A value over SHARED_VERIFY_BYTES stored alone: one request per share, and it reads back."""
    value = _large()
    before = _pool.POOL.calls
    out = await compact(harness, value)
    assert out.receipt.exact_cache == "stored"
    assert _pool.POOL.calls == before + pool_of_two
    found = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert found == rc.Found(value=value)


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["last item", "outside the slices"])
async def test_a_share_that_cannot_vouch_leaves_the_verdict_to_a_whole_verification(
    harness: rc.Harness, tmp_path: Path, pool_of_two: int, where: str
) -> None:
    """Bytes that break the schema in the last share's slices, or in share 0's rest of the
    document: refused with the whole decode's own message, after one more request."""
    value = _large(total=-1 if where == "outside the slices" else 1)
    if where == "last item":
        value.rows[-1] = Row(id="x", name="n")  # type: ignore[arg-type] # encodes as a string
    data = msgspec.json.encode(value, order="sorted")
    with pytest.raises(ValueError, match="Expected") as whole:
        decode_exact(data, Exact)
    before = _pool.POOL.calls
    with pytest.raises(ValueError, match="Expected") as refused:
        await compact(harness, value)
    assert str(refused.value) == str(whole.value)
    assert _pool.POOL.calls == before + pool_of_two + 1


@pytest.mark.anyio
async def test_a_value_whose_bytes_are_not_json_is_refused(
    harness: rc.Harness, pool_of_two: int
) -> None:
    """``msgspec.Raw`` items are written as they are: a last item of blanks alone in the last
    share leaves a trailing comma. Refused by the whole verification, never stored."""
    row = msgspec.Raw(b'{"id":1,"name":"n"}' + b" " * (1 << 18))
    # Written in two slices (16 rows, then the blanks), the blanks alone in the last share.
    value = Exact(rows=[row] * 16 + [msgspec.Raw(b" " * (3 << 20))], total=1)  # type: ignore[arg-type]
    before = _pool.POOL.calls
    with pytest.raises(ValueError, match="malformed"):
        await compact(harness, value)
    assert _pool.POOL.calls == before + pool_of_two + 1
    missing = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert missing == rc.Missing()


@pytest.mark.anyio
async def test_every_share_checks_the_digest_of_the_bytes_it_read(
    tmp_path: Path, pool_of_two: int
) -> None:
    """Bytes that decode but are not those the digest names: no share vouches for them."""
    data, spans = _encoded(_large(), 1 << 20)
    path = tmp_path / "temp"
    path.write_bytes(data)
    key = b"k" * 32
    digest = digest_hex(key, data)
    before = _pool.POOL.calls
    assert await _verifiers.verify(str(path), digest, len(data), Exact, key, spans) is None
    assert _pool.POOL.calls == before + pool_of_two
    wrong = digest_hex(key, data + b" ")
    problem = await _verifiers.verify(str(path), wrong, len(data), Exact, key, spans)
    assert problem == "the bytes read back do not match their digest"
    assert _pool.POOL.calls == before + 2 * pool_of_two + 1
