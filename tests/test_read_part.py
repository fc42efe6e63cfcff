"""``response_compaction_read_part``: verified, bounded parts of a stored value."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec
import pytest

import response_compaction as rc
import response_compaction.sync as rc_sync
from response_compaction import _pool
from response_compaction._part import part_of
from tests._store_support import FaultyBackend, entry_path, store_root, with_backend
from tests.conftest import FakeClock
from tests.schemas import FALLBACK, Exact, Summary, big_exact

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}
DOC: dict[str, Any] = {
    "meta": {"source": "test", "count": 3},
    "rows": [{"id": i, "name": f"row-{i}", "tags": ["a", "b"]} for i in range(200)],
    "text": "é✓" * 400 + "tail",
    "a/b": {"~x": [1, 2, 3]},
    "empty": [],
    "flag": True,
}


async def store(harness: rc.Harness, value: Any) -> str:
    compacted = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    return compacted.receipt.exact_ref


async def part(harness: rc.Harness, ref: str, **kwargs: Any) -> rc.Part:
    result = await rc.response_compaction_read_part(harness, ref, **kwargs)
    assert isinstance(result, rc.Found), result
    return result.value


def size(part: rc.Part) -> int:
    return len(part.json.encode())


def window(part: rc.Part) -> tuple[int, int]:
    assert isinstance(part.start, int)
    assert isinstance(part.stop, int)
    return part.start, part.stop


async def test_whole_small_value_is_complete(harness: rc.Harness) -> None:
    """A value that fits comes back whole, canonical, decoded and complete."""
    ref = await store(harness, DOC)
    got = await part(harness, ref)
    assert got.value == DOC
    assert got.json.encode() == msgspec.json.encode(DOC, order="sorted")
    assert got.complete
    assert not got.outline
    assert got.total_items == len(DOC)
    assert got.next_start is msgspec.UNSET


async def test_array_windows_page_through_every_item(harness: rc.Harness) -> None:
    """Paging /rows with next_start yields every row once, in order, each page within bound."""
    ref = await store(harness, DOC)
    seen: list[Any] = []
    start: int | None = 0
    while start is not None:
        got = await part(harness, ref, pointer="/rows", start=start, max_bytes=512)
        assert size(got) <= 512
        assert got.start == start
        assert got.value == DOC["rows"][slice(*window(got))]
        assert got.total_items == 200
        assert not got.outline
        seen.extend(got.value)
        start = None if got.next_start is msgspec.UNSET else got.next_start
    assert seen == DOC["rows"]


async def test_window_stop_is_respected(harness: rc.Harness) -> None:
    """``stop`` ends the window; the part says more follows after it."""
    ref = await store(harness, DOC)
    got = await part(harness, ref, pointer="/rows", start=10, stop=12)
    assert got.value == DOC["rows"][10:12]
    assert (got.start, got.stop, got.next_start) == (10, 12, 12)
    assert not got.complete


async def test_window_past_the_end_is_empty(harness: rc.Harness) -> None:
    """A window that starts past the end is an empty array, with nothing after it."""
    ref = await store(harness, DOC)
    got = await part(harness, ref, pointer="/rows", start=500)
    assert got.value == []
    assert got.next_start is msgspec.UNSET


async def test_object_windows_go_by_members_in_key_order(harness: rc.Harness) -> None:
    """An object too big to show whole is cut between whole members, in key order."""
    ref = await store(harness, DOC)
    got = await part(harness, ref, max_bytes=256)
    keys = sorted(DOC)
    assert not got.outline
    assert got.value == {k: DOC[k] for k in keys[slice(*window(got))]}
    assert size(got) <= 256


async def test_outline_when_not_one_item_fits(harness: rc.Harness) -> None:
    """When the first item is too big, the part outlines items: key, type, size, length."""
    ref = await store(harness, {"rows": DOC["rows"], "z": 1})
    got = await part(harness, ref, max_bytes=256)
    assert got.outline
    assert not got.complete
    rows_bytes = len(msgspec.json.encode(DOC["rows"]))
    assert got.value == [
        {"key": "rows", "type": "array", "bytes": rows_bytes, "items": 200},
        {"key": "z", "type": "number", "bytes": 1},
    ]
    assert got.next_start is msgspec.UNSET


async def test_outline_of_array_of_big_objects(harness: rc.Harness) -> None:
    """An array whose items are too big is outlined by index, windowed by next_start."""
    value = [{"k": "v" * 400, "n": i} for i in range(50)]
    ref = await store(harness, value)
    got = await part(harness, ref, max_bytes=256)
    assert got.outline
    first = len(msgspec.json.encode(value[0]))
    assert got.value[0] == {"index": 0, "type": "object", "bytes": first, "keys": 2}
    assert size(got) <= 256
    assert got.next_start == got.stop
    assert 0 < window(got)[1] < 50


async def test_nested_pointer_with_escapes(harness: rc.Harness) -> None:
    """RFC 6901 escapes: ~1 is '/', ~0 is '~'; array indexes step into arrays."""
    ref = await store(harness, DOC)
    got = await part(harness, ref, pointer="/a~1b/~0x/2")
    assert got.value == 3
    assert got.json == "3"
    assert got.complete
    assert got.total_items is msgspec.UNSET
    assert (await part(harness, ref, pointer="/rows/7/name")).value == "row-7"
    assert (await part(harness, ref, pointer="/flag")).value is True


async def test_unicode_string_cut_on_character_boundary(harness: rc.Harness) -> None:
    """A long string is cut between characters, marked, and pages on from next_start."""
    ref = await store(harness, DOC)
    text = DOC["text"]
    got = await part(harness, ref, pointer="/text", max_bytes=300)
    assert size(got) <= 300
    assert not got.complete
    assert got.value.endswith("…[cut]")
    shown = got.value.removesuffix("…[cut]")
    assert text.startswith(shown)
    assert (got.start, got.stop, got.next_start) == (0, len(shown), len(shown))
    rebuilt = shown
    start = got.next_start
    while start is not msgspec.UNSET:
        got = await part(harness, ref, pointer="/text", start=start, max_bytes=300)
        assert size(got) <= 300
        rebuilt += got.value.removesuffix("…[cut]")
        start = got.next_start
    assert rebuilt == text
    assert got.complete is False  # the last page started past 0


async def test_number_longer_than_the_bound_is_cut_like_a_string(harness: rc.Harness) -> None:
    """A 4000-digit integer never breaks max_bytes: its digits page like a string's characters."""
    number = 7 * 10**3999 + 1
    ref = await store(harness, {"n": number})
    got = await part(harness, ref, pointer="/n", max_bytes=256)
    assert size(got) <= 256
    assert not got.complete
    assert got.total_bytes == 4000
    digits = got.value.removesuffix("…[cut]")
    start = got.next_start
    while start is not msgspec.UNSET:
        got = await part(harness, ref, pointer="/n", start=start, max_bytes=256)
        assert size(got) <= 256
        digits += got.value.removesuffix("…[cut]")
        start = got.next_start
    assert int(digits) == number
    whole = await part(harness, ref, pointer="/n", max_bytes=4000)
    assert (whole.value, whole.complete) == (number, True)


@pytest.mark.parametrize(
    ("pointer", "problem"),
    [
        ("rows", ValueError),
        ("/a~2", ValueError),
        ("/nope", LookupError),
        ("/rows/200", LookupError),
        ("/rows/" + "9" * 5000, LookupError),
        ("/rows/01", LookupError),
        ("/rows/-", LookupError),
        ("/flag/x", LookupError),
    ],
)
async def test_pointer_errors(harness: rc.Harness, pointer: str, problem: type[Exception]) -> None:
    """Malformed pointers raise ValueError; pointers that name nothing raise LookupError."""
    ref = await store(harness, DOC)
    with pytest.raises(problem):
        await rc.response_compaction_read_part(harness, ref, pointer=pointer)


@pytest.mark.parametrize("kwargs", [{"max_bytes": 255}, {"start": -1}, {"stop": -2}])
async def test_bad_requests_raise_before_io(harness: rc.Harness, kwargs: dict[str, Any]) -> None:
    """A bound under 256 or a negative window raises ValueError, even for a missing entry."""
    with pytest.raises(ValueError, match="must be"):
        await rc.response_compaction_read_part(harness, "rc1:" + "0" * 64, **kwargs)


async def test_missing_and_malformed_refs(harness: rc.Harness) -> None:
    """Missing and Broken read exactly as read_exact reads them."""
    assert await rc.response_compaction_read_part(harness, "rc1:" + "0" * 64) == rc.Missing()
    broken = await rc.response_compaction_read_part(harness, "../etc/passwd")
    assert isinstance(broken, rc.Broken)
    assert broken == await rc.response_compaction_read_exact(harness, "../etc/passwd", Any)


async def test_tampered_entry_reads_broken(harness: rc.Harness, tmp_path: Path) -> None:
    """One flipped byte (still valid JSON) makes read_part Broken, never Found."""
    value = big_exact(50)
    ref = (await rc.response_compact(harness, value, Exact, Summary, OPTIONS)).receipt.exact_ref
    hex_digest = ref.removeprefix("rc1:")
    path = tmp_path / "ws" / "response-compaction-v1" / "exact" / hex_digest[:2] / hex_digest
    data = bytearray(path.read_bytes())
    data[data.index(b"nnnn")] = ord("m")
    path.write_bytes(bytes(data))
    result = await rc.response_compaction_read_part(harness, ref, pointer="/rows/0")
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail
    assert "mnnn" not in result.detail


def test_blocking_twin(tmp_path: Path) -> None:
    """``sync.response_compaction_read_part`` reads the same part without an event loop."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    ref = rc_sync.response_compact(harness, DOC, Any, Summary, OPTIONS).receipt.exact_ref
    result = rc_sync.response_compaction_read_part(harness, ref, pointer="/rows", start=3, stop=5)
    assert isinstance(result, rc.Found)
    assert result.value.value == DOC["rows"][3:5]
    assert rc_sync.response_compaction_read_part(harness, "bad") == rc.Broken(
        detail="malformed exact_ref 'bad': expected 'rc1:' followed by 64 lowercase hex"
    )


async def test_rewritten_row_cannot_vouch_for_rewritten_bytes(
    harness: rc.Harness, tmp_path: Path
) -> None:
    """Bytes replaced together with the index row's digest still read Broken: the digest
    checked is the one in the reference."""
    ref = await store(harness, DOC)
    hex_digest = ref.removeprefix("rc1:")
    root = tmp_path / "ws" / "response-compaction-v1"
    path = root / "exact" / hex_digest[:2] / hex_digest
    forged = msgspec.json.encode(DOC | {"flag": False}, order="sorted")
    assert len(forged) == path.stat().st_size + 1  # "false" is one byte longer than "true"
    path.write_bytes(forged)
    with sqlite3.connect(root / "index.sqlite3") as conn:
        conn.execute(
            "UPDATE entries SET digest = ?, size = ? WHERE key = ?",
            (hashlib.sha256(forged).hexdigest(), len(forged), hex_digest),
        )
    conn.close()
    result = await rc.response_compaction_read_part(harness, ref, pointer="/flag")
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail


async def test_tampered_bytes_read_broken_even_when_the_pointer_fails(
    harness: rc.Harness, tmp_path: Path
) -> None:
    """A pointer that names nothing in tampered bytes is Broken, not a LookupError."""
    ref = await store(harness, DOC)
    hex_digest = ref.removeprefix("rc1:")
    path = tmp_path / "ws" / "response-compaction-v1" / "exact" / hex_digest[:2] / hex_digest
    path.write_bytes(path.read_bytes().replace(b'"flag"', b'"flah"'))
    result = await rc.response_compaction_read_part(harness, ref, pointer="/flag")
    assert isinstance(result, rc.Broken)
    with pytest.raises(LookupError):
        await rc.response_compaction_read_part(harness, await store(harness, DOC), pointer="/no")


async def test_expired_entry_reads_missing(harness: rc.Harness, clock: FakeClock) -> None:
    """Past its TTL an entry reads Missing through read_part, as through read_exact."""
    compacted = await rc.response_compact(harness, DOC, Any, Summary, OPTIONS | {"ttl_seconds": 5})
    ref = compacted.receipt.exact_ref
    assert isinstance(await rc.response_compaction_read_part(harness, ref), rc.Found)
    clock.advance(6)
    assert await rc.response_compaction_read_part(harness, ref) == rc.Missing()
    assert await rc.response_compaction_read_exact(harness, ref, Any) == rc.Missing()


@contextlib.contextmanager
def no_idle_worker() -> Iterator[None]:
    """Hold every idle pool worker meanwhile, so that work meant for one finds none."""
    held = []
    while (worker := _pool.POOL.checkout()) is not None:
        held.append(worker)
    try:
        yield
    finally:
        for worker in held:
            _pool.POOL.checkin(worker)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["pool", "thread"])
async def test_large_entry_without_layout_is_cut_away_from_the_loop(
    harness: rc.Harness, tmp_path: Path, where: str
) -> None:
    """Over 8 MiB with no layout (a plain dict), the part comes from a pool worker, or from a
    thread when none is idle, verified either way: the same part, LookupError, Broken."""
    rows = [{"id": i, "name": "n" * 40, "tags": ["a", "b"]} for i in range(150_000)]
    value = {"rows": rows, "total": len(rows)}
    ref = await store(harness, value)
    data = msgspec.json.encode(value, order="sorted")
    assert len(data) > 8 << 20
    opened: list[str] = []

    async def before_open(mode: str) -> None:
        opened.append(mode)

    watched = with_backend(harness, FaultyBackend(before_open=before_open))
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= 1, 60)
    calls = _pool.POOL.calls
    hex_digest = ref.removeprefix("rc1:")
    path = tmp_path / "ws" / "response-compaction-v1" / "exact" / hex_digest[:2] / hex_digest
    with no_idle_worker() if where == "thread" else contextlib.nullcontext():
        got = await part(watched, ref, pointer="/rows", start=149_990, max_bytes=4096)
        with pytest.raises(LookupError, match="out of range"):
            await rc.response_compaction_read_part(harness, ref, pointer="/rows/150000")
        path.write_bytes(path.read_bytes().replace(b'"total":150000', b'"total":150001'))
        broken = await rc.response_compaction_read_part(harness, ref, pointer="/total")
    assert _pool.POOL.calls - calls == (3 if where == "pool" else 0)
    assert "rb" not in opened  # the loop's task never read the whole entry
    assert got == rc.Part(
        **msgspec.structs.asdict(part_of(data, "/rows", start=149_990, max_bytes=4096))
    )
    assert got.value == rows[149_990:]
    assert broken == rc.Broken(
        detail="exact entry does not verify: the bytes do not hash to the reference"
    )


async def _awaited_from_deep(levels: int, read: Any) -> Any:
    return await read() if levels == 0 else await _awaited_from_deep(levels - 1, read)


async def _deep_value_stored(harness: rc.Harness) -> tuple[Any, str]:
    """A value 450 lists deep, stored: (the value, its exact_ref)."""
    value: Any = "leaf"
    for _ in range(450):
        value = [value]
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    return value, out.receipt.exact_ref


async def test_a_deep_value_is_cut_from_a_deep_callers_stack(harness: rc.Harness) -> None:
    """A deep caller's stack (a framework's) left too few frames: read_part raised RecursionError.

    Found by an adversarial review with 450 levels read 560 awaits down; now the cut moves to
    a worker thread, whose stack is shallow.
    """
    value, ref = await _deep_value_stored(harness)

    async def read() -> Any:
        return await rc.response_compaction_read_part(harness, ref)

    part = await _awaited_from_deep(560, read)
    assert isinstance(part, rc.Found)
    assert msgspec.json.decode(part.value.json) == value


async def test_a_deep_value_is_read_exact_from_a_deep_callers_stack(harness: rc.Harness) -> None:
    """read_exact said Broken ("does not verify") where the caller's stack was deep."""
    value, ref = await _deep_value_stored(harness)

    async def read() -> Any:
        return await rc.response_compaction_read_exact(harness, ref, Any)

    found = await _awaited_from_deep(560, read)
    assert isinstance(found, rc.Found)
    assert found.value == value


@pytest.mark.parametrize(
    "value", [{"rows": [1, 2, 3]}, {"text": "x" * (9 << 20)}], ids=["small", "pool"]
)
async def test_an_entry_grown_to_a_sparse_terabyte_reads_broken(
    harness: rc.Harness, value: dict[str, Any]
) -> None:
    """read_part read the whole file (MemoryError); it now reads one byte past the row's size.

    The file stays our own regular file with one link: only its size changed (adversarial
    review). 9 MB without a layout is cut in a pool worker (or a thread), which read it whole.
    """
    out = await rc.response_compact(harness, value, dict, Summary, OPTIONS)
    ref = out.receipt.exact_ref
    path = entry_path(store_root(harness.fs), ref.split(":")[1])
    with path.open("r+b") as file:
        file.truncate(1 << 40)  # sparse: no disk used
    part = await rc.response_compaction_read_part(harness, ref)
    assert isinstance(part, rc.Broken)
    assert "does not verify" in part.detail
