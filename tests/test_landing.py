"""Large values decoded while they are read: each slice only once the bytes under it landed.

``_store._landing`` reads a large entry (or a compaction's read-back) into fresh private
memory in a helper and hashes it, while the caller decodes slice after slice of what has
landed. These tests hold the decode to never looking at a byte before it landed (bytes not
yet landed are garbage here), the read to the file's exact bytes and digest, and the public
API to "found means the value stored".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction._canonical import Span, iter_canonical
from response_compaction._slices import decode_sliced
from response_compaction._store import _reading
from response_compaction._store._fileio import current_backend
from response_compaction._store._landing import Landing, ShortReadError, decoded_landing
from response_compaction._store._reads import Read, check_landed
from response_compaction._store._tx import Row as IndexRow
from response_compaction._store._verify import verify_file
from tests._store_support import LARGE, TEST_KEY, compact, read_helpers_around
from tests.schemas import Exact, big_exact
from tests.test_slices_properties import Holder, values

pytestmark = pytest.mark.anyio
#: Entries from this size are decoded as they land, lowered from 32 MiB for these tests.
LANDING_BYTES = 4 << 20


@pytest.fixture(autouse=True)
def _landing_from_4_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reading, "HASHED_BYTES", LANDING_BYTES)


class Trickle:
    """Bytes that land only as far as the decode asks (``landed``); garbage past that."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.buffer = bytearray(b"\xff" * len(data))  # never JSON: a peek fails its slice
        self.asked: list[int] = []

    async def landed(self, end: int) -> None:
        self.asked.append(end)
        self.buffer[:end] = self.data[:end]
        await anyio.lowlevel.checkpoint()


def _decode_trickling(data: bytes, schema: Any, spans: tuple[Span, ...]) -> tuple[Any, int]:
    """The sliced decode of ``data`` as it trickles in: (value, checkpoints taken)."""
    trickle, calls = Trickle(data), 0

    async def checkpoint() -> None:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()

    view = memoryview(trickle.buffer)
    value = anyio.run(decode_sliced, view, schema, spans, checkpoint, trickle.landed)
    return value, calls


@settings(max_examples=120, deadline=None)
@given(
    items=st.lists(values, min_size=1, max_size=40),
    labels=st.dictionaries(st.text(max_size=20), values, min_size=1, max_size=40),
    as_struct=st.booleans(),
    piece_bytes=st.integers(min_value=1, max_value=400),
)
def test_every_slice_is_decoded_from_landed_bytes_alone(
    items: list[Any], labels: dict[str, Any], as_struct: bool, piece_bytes: int
) -> None:
    """Each slice decodes from bytes landed just far enough for it: same value, no slice
    failed (a slice that looked past what had landed would fail, and the count fall short)."""
    value: Any = Holder(items=items, labels=labels) if as_struct else labels
    schema: Any = Holder if as_struct else dict[str, Any]
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes, layout))
    decoded, calls = _decode_trickling(data, schema, tuple(layout))
    assert decoded == msgspec.json.decode(data, type=schema)
    assert calls == 2 * sum(len(span.slices) for span in layout)


def test_the_decode_asks_for_no_more_than_each_slice_needs() -> None:
    """The bytes asked for grow slice by slice: the decode starts before the rest landed."""
    value = big_exact(3000)
    layout: list[Span] = []
    data = b"".join(iter_canonical(value, 4096, layout))
    trickle, (span,) = Trickle(data), layout
    decoded = anyio.run(
        decode_sliced, memoryview(trickle.buffer), Exact, tuple(layout),
        anyio.lowlevel.checkpoint, trickle.landed,
    )  # fmt: skip
    assert decoded == value
    assert trickle.asked[: len(span.slices)] == [b + 1 for _, b in span.slices]
    assert trickle.asked[-1] == len(data)  # the rest of the document, once the slices are in


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_forged_boundary_met_while_landing_falls_back_to_the_whole_decode(where: str) -> None:
    """A layout whose cut is off by a byte is found out as its slice lands: the whole
    document, once landed, decodes to the value (never garbage, never a wrong value)."""
    value = big_exact(3000)
    layout: list[Span] = []
    data = b"".join(iter_canonical(value, 4096, layout))
    (span,) = layout
    slices = list(span.slices)
    i = {"first": 0, "middle": len(slices) // 2, "last": len(slices) - 2}[where]
    (a, b), (_, d) = slices[i], slices[i + 1]
    slices[i : i + 2] = [(a, b - 1), (b, d)]  # still tiles the array: only the bytes say no
    forged = (Span(span.field, span.start, span.end, tuple(slices)),)
    decoded, calls = _decode_trickling(data, Exact, forged)
    assert decoded == value
    assert calls == 2 * i  # the slices before the forged one, then the whole decode


def test_a_cut_that_skips_a_byte_of_an_element_is_refused_as_it_lands() -> None:
    """``[1e5,2]`` cut around its ``e`` decodes, slice by slice, as ``[1.0, 5.0, 2.0]``:
    the byte after each slice must be a comma (or the closing bracket), checked once landed."""
    data = b"[1e5,2]"
    forged = (Span(None, 0, len(data), ((1, 2), (3, 4), (5, 6))),)
    decoded, calls = _decode_trickling(data, list[float], forged)
    assert decoded == [100000.0, 2.0]
    assert calls == 0


# ----------------------------------------------------------------------------- the read


def _content(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def _keyed(data: bytes) -> str:
    return hmac.new(TEST_KEY, data, hashlib.sha256).hexdigest()


@pytest.fixture
def file_of(tmp_path: Path) -> Any:
    """``file_of(content)``: a file holding ``content``, open for reading (by the Landing)."""
    paths: list[Path] = []

    def make(content: bytes) -> int:
        paths.append(tmp_path / f"f{len(paths)}")
        paths[-1].write_bytes(content)
        return os.open(paths[-1], os.O_RDONLY)

    return make


@pytest.mark.parametrize("size", [1, (2 << 20) - 1, 2 << 20, (7 << 20) + 3])
async def test_landed_bytes_are_the_files_and_their_digest(file_of: Any, size: int) -> None:
    """Every piece size and remainder: the bytes and the keyed digest of exactly them."""
    content = _content(size)
    landing = Landing(file_of(content), size, TEST_KEY)
    backend = current_backend()
    await landing.landed(size, backend)
    assert bytes(landing.view) == content
    data, digest = await landing.read(backend)
    assert bytes(data) == content
    assert digest == _keyed(content)


async def test_a_file_longer_than_its_size_is_read_a_byte_past_it(file_of: Any) -> None:
    """A byte more than the row's size: the digest then covers it, and refuses it."""
    content = _content(3 << 20)
    landing = Landing(file_of(content), len(content) - 10, TEST_KEY)
    data, digest = await landing.read(current_backend())
    assert bytes(data) == content[: len(content) - 9]
    assert digest == _keyed(content[: len(content) - 9])


async def test_a_file_shorter_than_its_size_never_lands_in_full(file_of: Any) -> None:
    """A file cut since its fstat: asking for bytes it no longer has is ``ShortReadError``."""
    content = _content(3 << 20)
    landing = Landing(file_of(content), len(content) + 100, TEST_KEY)
    backend = current_backend()
    await landing.landed(len(content), backend)  # all it has
    with pytest.raises(ShortReadError):
        await landing.landed(len(content) + 1, backend)
    data, digest = await landing.read(backend)
    assert (bytes(data), digest) == (content, _keyed(content))


async def test_later_writes_to_the_file_never_show_in_what_landed(
    file_of: Any, tmp_path: Path
) -> None:
    content = _content(5 << 20)
    landing = Landing(file_of(content), len(content), TEST_KEY)
    data, _ = await landing.read(current_backend())
    with (tmp_path / "f0").open("r+b") as file:  # rewritten in place, same inode
        file.write(b"\0" * len(content))
    assert bytes(data) == content
    assert bytes(landing.view) == content


async def _within(landing: Landing, seconds: float) -> tuple[Any, str]:
    """The landing's read once it ended; ``TimeoutError`` (a hang guard) if it never does."""
    with anyio.fail_after(seconds):
        return await anyio.to_thread.run_sync(landing.wait, abandon_on_cancel=True)


async def test_a_stopped_landing_reads_no_further() -> None:
    """Fed by a pipe, so each read waits for what the test writes: once stopped, the helper
    ends after the read under way (it would otherwise wait for the rest forever)."""
    r, w = os.pipe()
    landing = Landing(r, 1 << 20, TEST_KEY)
    backend = current_backend()
    try:
        os.write(w, b"x" * 100)
        await landing.landed(100, backend)
        landing.stop()
        with contextlib.suppress(BrokenPipeError):  # the helper may have ended already
            os.write(w, b"y" * 100)  # ends the read under way, if any
        data, digest = await _within(landing, 30)
    finally:
        os.close(w)
    assert bytes(data) in (b"x" * 100, b"x" * 100 + b"y" * 100)
    assert digest == ""  # not hashed: nobody checks a stopped read


async def test_a_decode_cancelled_while_landing_stops_the_read() -> None:
    """Cancelled at its first turn, the decode of bytes still landing tells the helper to
    stop: the pipe feeding it is never written to the end, yet the read ends."""
    value = big_exact(3000)
    layout: list[Span] = []
    data = b"".join(iter_canonical(value, 4096, layout))
    r, w = os.pipe()
    landing = Landing(r, len(data), TEST_KEY)
    backend = current_backend()
    check_calls: list[int] = []
    try:
        os.write(w, data[: layout[0].slices[0][1] + 1])  # the first slice, no more
        async with anyio.create_task_group() as group:
            group.cancel_scope.cancel()

            async def decode() -> None:
                await decoded_landing(
                    backend, landing, Exact, tuple(layout), lambda d, h: check_calls.append(1)
                )

            group.start_soon(decode)
        with contextlib.suppress(BrokenPipeError):  # the helper may have ended already
            os.write(w, b" ")  # ends the read under way, if any
        await _within(landing, 30)
    finally:
        os.close(w)
    assert check_calls == []  # cancelled: nothing checked, nothing handed out


def test_bytes_that_landed_must_be_as_many_as_the_row_says() -> None:
    """A digest that passes over one byte more than the row's size is still refused: the
    value was decoded from the row's size (a file cut to a forged size, then restored)."""
    data = _content(1000)
    row = IndexRow(digest="", size=len(data) - 1, expires_at=0.0, layout=None)
    read = Read(row, b"")
    with pytest.raises(ValueError, match="not as long as its row says"):
        check_landed(read, "exact", _keyed(data), TEST_KEY, data, _keyed(data))
    check_landed(read._replace(row=row._replace(size=len(data))), "exact", _keyed(data),
                 TEST_KEY, data, _keyed(data))  # fmt: skip


# ----------------------------------------------------------------------------- through the API


async def test_a_large_value_reads_back_exactly(
    harness: rc.Harness, large: tuple[str, Path]
) -> None:
    ref, _ = large
    for _ in range(2):  # the second read too: the first left nothing behind
        assert await rc.response_compaction_read_exact(harness, ref, Exact) == rc.Found(value=LARGE)


async def test_a_large_value_compacted_as_exact_is_the_value(harness: rc.Harness) -> None:
    """The compaction's read-back decodes as it lands too, and hands back that value."""
    compacted = await compact(harness, LARGE, summarize_above_bytes=1 << 30)
    assert compacted.output.kind == "exact"
    assert compacted.output.value == LARGE


class Other(msgspec.Struct, frozen=True):
    rows: list[dict[str, int]]
    total: int


async def test_a_large_value_read_as_another_schema_reads_broken(
    harness: rc.Harness, large: tuple[str, Path]
) -> None:
    """The bytes check but do not validate: Broken, saying why without the content."""
    ref, _ = large
    result = await rc.response_compaction_read_exact(harness, ref, Other)
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail
    assert "nnnn" not in result.detail


def _first(data: bytes) -> bytes:
    at = data.index(b"nnnn")  # an "m" there: still valid JSON, still a valid Exact
    return data[:at] + b"m" + data[at + 1 :]


def _last(data: bytes) -> bytes:
    at = data.rindex(b"nnnn")
    return data[:at] + b"m" + data[at + 1 :]


@pytest.mark.parametrize("tamper", [_first, _last], ids=["first", "last"])
async def test_a_flipped_byte_in_a_large_entry_reads_broken(
    harness: rc.Harness, large: tuple[str, Path], tamper: Any
) -> None:
    """Same size, so it lands and decodes (to another valid value): the digest refuses it."""
    ref, path = large
    path.write_bytes(tamper(path.read_bytes()))
    result = await rc.response_compaction_read_exact(harness, ref, Exact)
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail
    assert "mnnn" not in result.detail


def _opened(path: Path) -> int:
    """How many of this process's fds are open on ``path``."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(fd) == str(path)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads fds in /proc")
@pytest.mark.parametrize("turns", [0, 1, 3, 10, 30])
async def test_a_read_cancelled_while_landing_closes_its_file_and_leaves_the_next_read_whole(
    harness: rc.Harness, large: tuple[str, Path], turns: int
) -> None:
    """Cancelled after a few turns of the loop (before its hop, in it, or in the decode):
    the entry file is closed all the same, and the next read of the entry is whole. (That a
    cancelled landing stops its helper is shown with a pipe, above.)"""
    ref, path = large
    with anyio.fail_after(60):  # a hang guard only
        async with anyio.create_task_group() as group:

            async def read() -> None:
                await rc.response_compaction_read_exact(harness, ref, Exact)

            group.start_soon(read)
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
        while _opened(path):  # the helper, told to stop, closes the file
            await anyio.lowlevel.checkpoint()
    assert await rc.response_compaction_read_exact(harness, ref, Exact) == rc.Found(value=LARGE)


async def test_a_failed_read_is_raised_and_never_lands(tmp_path: Path) -> None:
    """The helper's read failing (here: a directory) is raised by ``read``; asking for bytes
    is ``ShortReadError``, never a wait forever."""
    landing = Landing(os.open(tmp_path, os.O_RDONLY), 10, TEST_KEY)
    backend = current_backend()
    with pytest.raises(ShortReadError):
        await landing.landed(1, backend)
    with pytest.raises(IsADirectoryError):
        await landing.read(backend)


# ----------------------------------------------------------------------------- the read-back


class Recording:
    """The library's own backend, noting the blocking calls it runs (``land_file`` among them)."""

    def __init__(self) -> None:
        self.inner = current_backend()
        self.name = self.inner.name
        self.ran: list[str] = []

    async def open(self, path: str, mode: Any, opener: Any) -> Any:
        return await self.inner.open(path, mode, opener)

    async def run(self, fn: Any, *args: Any) -> Any:
        self.ran.append(getattr(fn, "__name__", ""))
        return await self.inner.run(fn, *args)


@pytest.fixture(scope="module")
def written() -> tuple[bytes, str, tuple[Span, ...]]:
    """:data:`LARGE` as a compaction writes it: its bytes, keyed digest and layout."""
    layout: list[Span] = []
    data = b"".join(iter_canonical(LARGE, 1 << 20, layout))
    assert len(data) > LANDING_BYTES
    assert layout
    return data, _keyed(data), tuple(layout)


async def _read_back(
    backend: Recording, path: Path, written: tuple[bytes, str, tuple[Span, ...]], *, want: bool
) -> Any:
    data, hex_digest, spans = written
    return await verify_file(backend, str(path), hex_digest, len(data), Exact, spans, TEST_KEY,
                             want_value=want, use_worker=False, land=True)  # fmt: skip


@pytest.mark.parametrize("want", [True, False])
async def test_a_compactions_read_back_lands_the_file_written(
    tmp_path: Path, written: tuple[bytes, str, tuple[Span, ...]], want: bool
) -> None:
    """The bytes written, read back as they land: the value (or None when nobody wants it)."""
    path, backend = tmp_path / "temp", Recording()
    path.write_bytes(written[0])
    assert await _read_back(backend, path, written, want=want) == (LARGE if want else None)
    assert "land_file" in backend.ran


def _grown(data: bytes) -> bytes:
    return data + b" "


def _cut(data: bytes) -> bytes:
    return data[:-1]


@pytest.mark.parametrize(
    ("tamper", "why"),
    [(_first, "match their digest"), (_last, "match their digest"),
     (_grown, "not as long"), (_cut, "not as long")],
)  # fmt: skip
@pytest.mark.parametrize("want", [True, False])
async def test_a_file_changed_between_write_and_read_back_is_refused(
    tmp_path: Path, written: tuple[bytes, str, tuple[Span, ...]], tamper: Any, why: str,
    want: bool,
) -> None:  # fmt: skip
    """Whatever changed the temp file after it was written (a flipped byte that still
    decodes, a byte more or less), the read-back refuses it, saying why without content."""
    path, backend = tmp_path / "temp", Recording()
    path.write_bytes(tamper(written[0]))
    with pytest.raises(ValueError, match=why) as raised:
        await _read_back(backend, path, written, want=want)
    assert "land_file" in backend.ran
    assert "nnn" not in str(raised.value)


@pytest.mark.parametrize(("rows", "expected"), [(10_000, "0 0"), (100_000, "0 1")])
def test_only_a_large_value_is_read_by_a_helper_as_it_is_decoded(
    tmp_path: Path, rows: int, expected: str
) -> None:
    """A fresh process: no read helper before ``read_exact``; one after it for a large value
    (the landing read), none for a smaller one (read whole, then decoded)."""
    call = "rc.response_compaction_read_exact(harness, ref, Exact)"
    assert read_helpers_around(tmp_path / "ws", rows, call) == expected.split()
