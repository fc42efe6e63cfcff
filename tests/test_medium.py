"""Medium values (256 KB to 2 MiB): encoded whole, stored in one worker-thread call when alone.

Every guarantee of the streaming algorithm holds on this path too: the bytes are written to a
temp file, fsynced with their directory, read back, digest-checked and schema-validated before
the receipt; a value that does not validate, or a cancelled call, leaves no temp file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import response_compaction as rc
from response_compaction import _pool
from response_compaction._canonical import PIECE_BYTES, Span, iter_canonical
from response_compaction._digest import digest_hex
from response_compaction._store._aside import SLICE_ITEMS, free_in_slices, let_go
from response_compaction._store._medium import MEDIUM_BYTES
from response_compaction._store._turns import soon, storing
from response_compaction._store._verify import (
    DECODE_BESIDE_BYTES,
    WORKER_VERIFY_BYTES,
    checked_decode,
)
from response_compaction._worker import verify_path
from tests._store_support import (
    TEST_KEY,
    canonical,
    compact,
    entry_files,
    entry_path,
    hex_of,
    index_rows,
    ref_of,
    seed_key,
    store_root,
    stored_layout,
    temp_files,
)
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact
from tests.test_store_durability import FsyncRecorder

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
#: About 960 KB of canonical JSON: over the one-hop size of small values, under MEDIUM_BYTES.
MEDIUM_ROWS = 16_000


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


async def _ready_pool() -> None:
    _pool.POOL.start()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= 1, 60)


def test_a_long_array_the_sample_calls_small_is_one_piece() -> None:
    """A 300-item list projected under two pieces is one slice; a longer one is sliced."""
    small = big_exact(300)  # about 18 KB against 2 x 16 KB pieces
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(small, 16 << 10, layout))
    assert data == msgspec.json.encode(small, order="sorted")
    (span,) = layout
    assert len(span.slices) == 1
    assert span.counts == (300,)
    large = big_exact(1200)  # about 72 KB: more than two pieces
    layout = []
    data = b"".join(bytes(p) for p in iter_canonical(large, 16 << 10, layout))
    assert data == msgspec.json.encode(large, order="sorted")
    (span,) = layout
    assert len(span.slices) > 1


def test_a_spread_sample_sees_large_items_at_the_end() -> None:
    """Small items first and large ones last: the sample sees both, so the list is sliced."""
    rows = [Row(id=i, name="") for i in range(600)]
    rows += [Row(id=i, name="n" * 2000) for i in range(600, 700)]
    value = Exact(rows=rows, total=len(rows))
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, 64 << 10, layout))
    assert data == msgspec.json.encode(value, order="sorted")
    (span,) = layout
    assert len(span.slices) > 1


def test_a_dict_the_sample_calls_small_is_one_piece_without_a_span() -> None:
    """A dict projected under two pieces is written whole, with no mapping span, as an array
    is; one over it is sliced (an object left whole is decoded with its document on reads)."""
    small = {f"k{i:05d}": i for i in range(8000)}  # about 100 KB against 64 KB pieces
    layout: list[Span] = []
    pieces = [bytes(p) for p in iter_canonical(small, 64 << 10, layout)]
    assert b"".join(pieces) == msgspec.json.encode(small, order="sorted")
    assert layout == []
    assert len(pieces) == 1  # its whole encoding
    large = {f"k{i:05d}": i for i in range(12000)}  # about 150 KB: over two 64 KB pieces
    layout = []
    data = b"".join(bytes(p) for p in iter_canonical(large, 64 << 10, layout))
    assert data == msgspec.json.encode(large, order="sorted")
    (span,) = layout
    assert span.mapping
    assert len(span.slices) > 1


def test_a_medium_value_is_one_piece_at_the_default_size() -> None:
    """A 1 MB list of rows is encoded in one piece by default (no slices to cut or copy)."""
    value = big_exact(MEDIUM_ROWS)
    layout: list[Span] = []
    pieces = [bytes(p) for p in iter_canonical(value, PIECE_BYTES, layout)]
    assert max(len(p) for p in pieces) > PIECE_BYTES // 2
    (span,) = layout
    assert len(span.slices) == 1


def test_a_nan_in_a_value_encoded_whole_is_refused_with_its_path() -> None:
    """The whole encoding keeps the refusal of NaN, naming its path from the top."""
    values = [0.5] * 5000
    values[4321] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinity at `\$\[4321\]`"):
        b"".join(iter_canonical(values))


async def test_a_medium_value_stored_alone_is_verified_here_and_reads_back(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Stored alone, a ~1 MB value is verified without a pool worker and reads back equal."""
    await _ready_pool()
    value = big_exact(MEDIUM_ROWS)
    before = _pool.POOL.calls
    out = await compact(harness, value)
    assert _pool.POOL.calls == before
    assert 256 << 10 < out.receipt.exact_bytes <= MEDIUM_BYTES
    assert out.receipt.exact_cache == "stored"
    assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == rc.Found(
        value=value
    )
    root = store_root(workspace)
    assert temp_files(root) == []
    (span,) = msgspec.json.decode(stored_layout(root, hex_of(value)), type=list[Span])
    assert span.field == "rows"


async def test_a_medium_value_stored_again_is_renewed_and_the_file_written_meanwhile_dropped(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """The look for a live entry runs beside the temp file's write: a hit keeps the entry's
    file (same inode, not rewritten), reads back equal, and leaves no temp file behind."""
    value = big_exact(MEDIUM_ROWS)
    await compact(harness, value)
    root = store_root(workspace)
    before = _identity(entry_path(root, hex_of(value)))
    again = await compact(harness, value)
    assert again.receipt.exact_cache == "reused"
    assert _identity(entry_path(root, hex_of(value))) == before
    assert temp_files(root) == []
    assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == rc.Found(
        value=value
    )


async def test_a_medium_value_after_its_store_was_removed_makes_it_again(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """The store's directory removed between two puts: a medium value's put (its temp file
    created beside the look for a live entry) makes it again, then stores and reads back."""
    await compact(harness, big_exact(1))
    shutil.rmtree(store_root(workspace))
    value = big_exact(MEDIUM_ROWS)
    receipt = (await compact(harness, value)).receipt  # under a new key: the old one went too
    assert receipt.exact_cache == "stored"
    assert await rc.response_compaction_read_exact(harness, receipt.exact_ref, Exact) == rc.Found(
        value=value
    )
    assert temp_files(store_root(workspace)) == []


_DECODED_ON: list[str] = []


class _Tracked(msgspec.Struct, frozen=True):
    """A schema with code of its own: each decode notes the thread it ran on."""

    rows: list[Row]
    total: int

    def __post_init__(self) -> None:
        _DECODED_ON.append(threading.current_thread().name)


async def test_code_of_a_schema_never_runs_on_the_librarys_helper_threads(
    harness: rc.Harness,
) -> None:
    """Stored and then renewed, a medium value whose schema has a ``__post_init__`` is decoded
    on the worker thread that carries the caller's call (a ``hop`` thread, in a copy of the
    caller's context), never on another helper of the library's (which has no context of the
    caller's): the look for a live entry follows the write."""
    value = _Tracked(rows=big_exact(MEDIUM_ROWS).rows, total=MEDIUM_ROWS)
    opts = {"fallback": FALLBACK, "ladder": "none", "summarize_above_bytes": 32_000}
    _DECODED_ON.clear()
    first = await rc.response_compact(harness, value, _Tracked, Summary, opts)
    again = await rc.response_compact(harness, value, _Tracked, Summary, opts)
    assert (first.receipt.exact_cache, again.receipt.exact_cache) == ("stored", "reused")
    assert len(_DECODED_ON) >= 2
    helpers = [n for n in _DECODED_ON if n.startswith("response-compaction")]
    assert [n for n in helpers if n != "response-compaction-hop"] == []


_WATCHED: list[tuple[int, weakref.ref[Any]]] = []


class _Watched(msgspec.Struct, frozen=True, weakref=True):
    """A schema whose every instance can be watched until it dies, with its thread."""

    rows: list[Row]
    total: int

    def __post_init__(self) -> None:
        _WATCHED.append((threading.get_ident(), weakref.ref(self)))


@pytest.mark.parametrize("rows", [2_500, MEDIUM_ROWS], ids=["150 KB", "960 KB"])
async def test_a_value_nobody_wants_is_freed_only_after_the_call_returned(
    harness: rc.Harness, rows: int
) -> None:
    """The read-back's value of a compaction that returns the fallback, stored or renewed, is
    not freed inside the call (for 1 MB of rows that held the call 1-2 ms): it is still alive
    when the call returns, and dies in a ``drop`` helper once the caller's task has yielded.
    Both sizes of one-hop puts: a small value's and a medium one's."""
    value = _Watched(rows=big_exact(rows).rows, total=rows)
    assert 64 << 10 < len(canonical(value)) <= (256 << 10 if rows < MEDIUM_ROWS else MEDIUM_BYTES)
    opts = {"fallback": FALLBACK, "ladder": "none", "summarize_above_bytes": 32_000}
    for cache in ("stored", "reused"):
        _WATCHED.clear()
        out = await rc.response_compact(harness, value, _Watched, Summary, opts)
        assert (out.output.kind, out.receipt.exact_cache) == ("fallback", cache)
        # The bytes are decoded on the worker thread that carries the call (the encoder's
        # own copies are made here, on the loop's).
        (decoded,) = [ref for ident, ref in _WATCHED if ident != threading.get_ident()]
        alive = decoded()
        assert alive is not None
        assert alive is not value
        freed: list[str] = []
        done = threading.Event()

        def note(names: list[str] = freed, event: threading.Event = done) -> None:
            names.append(threading.current_thread().name)
            event.set()

        weakref.finalize(alive, note)
        del alive
        assert await anyio.to_thread.run_sync(done.wait, 10)
        assert freed[0].startswith("response-compaction-drop")


@pytest.mark.parametrize(
    ("rows", "beside_others"),
    [(50_000, False), (MEDIUM_ROWS, True)],
    ids=["over 2 MiB, in the caller", "medium beside others, in a worker thread"],
)
async def test_a_value_verified_here_nobody_wants_is_freed_in_a_helper(
    harness: rc.Harness, rows: int, beside_others: bool
) -> None:
    """A value whose schema cannot travel to a worker process (a local class) is verified in
    this process: over the medium size in the caller, and a medium one stored while another
    is being stored on the loop (it would go to the pool) in a worker thread. Nobody wants
    the read-back: it dies in a ``drop`` helper, a slice at a time, not on the loop's thread at
    the end of the call (52 MB froze the loop 95-104 ms there; a medium one was dropped with
    the worker's result, 0.8-2.2 ms per MB of rows). The call's later steps may overlap it."""
    born: list[int] = []
    died_on: dict[int, str] = {}
    last_died = threading.Event()

    def died(i: int) -> None:
        died_on[i] = threading.current_thread().name
        if i == born[-1]:
            last_died.set()

    class Local(msgspec.Struct, frozen=True, weakref=True):
        rows: list[Row]
        total: int

        def __post_init__(self) -> None:
            born.append(len(born))
            weakref.finalize(self, died, born[-1])

    value = Local(rows=big_exact(rows).rows, total=rows)
    size = len(canonical(value))
    assert (WORKER_VERIFY_BYTES <= size < MEDIUM_BYTES) if beside_others else size > MEDIUM_BYTES
    opts = {"fallback": FALLBACK, "ladder": "none", "summarize_above_bytes": 32_000}
    # As if another value were being stored on this loop: a medium one then goes to the pool.
    with storing() if beside_others else contextlib.nullcontext():
        out = await rc.response_compact(harness, value, Local, Summary, opts)
    assert (out.output.kind, out.receipt.exact_cache) == ("fallback", "stored")
    assert len(born) >= 2  # the caller's value, and the read-back's, made last
    assert await anyio.to_thread.run_sync(last_died.wait, 10)
    assert died_on[born[-1]].startswith("response-compaction-drop")
    assert 0 not in died_on  # the caller's own value lives on


async def test_a_medium_value_already_live_is_renewed_without_an_fsync(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """The file written beside the look for a live entry is discarded unsynced on a hit: the
    renewal costs no fsync (its index commit does not sync either)."""
    value = big_exact(MEDIUM_ROWS)
    await compact(harness, value)
    recorder = FsyncRecorder()
    with recorder(os.fsync):
        again = await compact(harness, value)
    assert again.receipt.exact_cache == "reused"
    assert recorder.calls == []
    assert temp_files(store_root(workspace)) == []


class _LaxExact(msgspec.Struct, frozen=True):
    rows: list[Row]
    total: int


async def test_a_live_medium_entry_that_does_not_validate_is_refused_and_leaves_no_temp(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Bytes live under a laxer schema, compacted again under one they break: the look-up's
    decode refuses them (ValueError), the file written beside it is removed, the entry stays."""
    rows = big_exact(MEDIUM_ROWS).rows
    lax = _LaxExact(rows=rows, total=-1)
    first = await rc.response_compact(harness, lax, _LaxExact, Summary, {
        "fallback": FALLBACK, "ladder": "none", "summarize_above_bytes": 32_000})  # fmt: skip
    with pytest.raises(ValueError, match=r">= 0 - at `\$\.total`"):
        await compact(harness, Exact(rows=rows, total=-1))
    root = store_root(workspace)
    assert temp_files(root) == []
    key = first.receipt.exact_ref.removeprefix("rc1:")
    assert entry_files(root) == index_rows(root) == {key}


async def test_a_medium_value_stored_beside_another_is_verified_by_a_worker(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """While another value is being stored on the loop, a pool worker verifies this one."""
    await _ready_pool()
    value = big_exact(MEDIUM_ROWS)
    before = _pool.POOL.calls
    with storing():  # another value being stored on this loop meanwhile
        out = await compact(harness, value)
    assert _pool.POOL.calls == before + 1
    assert out.receipt.exact_cache == "stored"
    assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == rc.Found(
        value=value
    )
    assert temp_files(store_root(workspace)) == []


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside another"])
async def test_a_medium_value_that_does_not_validate_leaves_nothing(
    harness: rc.Harness, workspace: rc.LocalWorkspace, beside: bool
) -> None:
    """Bytes that break the schema (total < 0) are refused, with no temp file or entry left."""
    await _ready_pool()
    await compact(harness, big_exact(1))
    bad = Exact(rows=big_exact(MEDIUM_ROWS).rows, total=-1)
    others = storing() if beside else contextlib.nullcontext()
    with others, pytest.raises(ValueError, match=r">= 0 - at `\$\.total`"):
        await compact(harness, bad)
    root = store_root(workspace)
    assert temp_files(root) == []
    assert entry_files(root) == index_rows(root) == {hex_of(big_exact(1))}


async def test_a_medium_value_is_fsynced_with_its_directory_before_the_receipt(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """The entry's file and its fan-out directory were fsynced by the time the receipt came."""
    await compact(harness, big_exact(1))  # the store and its directories exist already
    recorder = FsyncRecorder()
    value = big_exact(MEDIUM_ROWS)
    with recorder(os.fsync):
        await compact(harness, value)
    entry = entry_path(store_root(workspace), hex_of(value))
    assert _identity(entry) in recorder.synced
    assert _identity(entry.parent) in recorder.synced


async def test_the_exact_output_of_a_medium_value_is_the_decode_of_its_stored_bytes(
    harness: rc.Harness,
) -> None:
    """Under the threshold the output is the value decoded from the bytes read back: equal to
    the input, never the input object itself."""
    value = big_exact(MEDIUM_ROWS)
    options: dict[str, Any] = {"fallback": FALLBACK, "ladder": "cheap",
                               "summarize_above_bytes": MEDIUM_BYTES}  # fmt: skip
    out = await rc.response_compact(harness, value, Exact, Summary, options)
    assert isinstance(out.output, rc.ExactOutput)
    assert out.output.value == value
    assert out.output.value is not value
    assert out.output.value.rows[0] is not value.rows[0]


@pytest.mark.slow
@pytest.mark.parametrize("stored", [False, True], ids=["new", "stored before"])
async def test_a_busy_index_leaves_the_verified_value_to_a_patient_publish(
    tmp_path: Path, anyio_backend: str, stored: bool
) -> None:
    """Another process holds the write lock: the verified value waits to be published, and a
    deadline that ends the wait removes its temp file; once the lock is free it is stored. A
    value stored before too: its renewal finds the index busy and writes afresh (it raised
    the index's internal busy signal), and once the lock is free the next put renews it."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, big_exact(1))
    value = big_exact(MEDIUM_ROWS)
    if stored:
        await compact(harness, value)
    command = [sys.executable, "-m", "tests._store_child", "hold", str(ws), anyio_backend]
    async with await anyio.open_process(command, cwd=REPO) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 64)
        assert line == b"locked"
        with anyio.move_on_after(0.5) as scope:  # a deadline ends the patient wait
            await compact(harness, value)
        assert scope.cancelled_caught
        assert temp_files(store_root(ws)) == []
        await process.stdin.aclose()
        assert await process.wait() == 0
    before = rc.Found(value=value) if stored else rc.Missing()
    assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == before
    again = await compact(harness, value)
    assert again.receipt.exact_cache == ("reused" if stored else "stored")
    assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == rc.Found(
        value=value
    )


@pytest.mark.parametrize("rows", [2_000, MEDIUM_ROWS], ids=["in turn", "beside"])
def test_a_checked_decode_reports_the_digest_before_the_schema(rows: int) -> None:
    """Digest beside the decode or not: the value when both hold, a digest or length mismatch
    over any decode problem, and the decode problem when only the schema fails."""
    good, bad = big_exact(rows), Exact(rows=big_exact(rows).rows, total=-1)
    good_data, bad_data = canonical(good), canonical(bad)
    assert (len(bad_data) >= DECODE_BESIDE_BYTES) == (rows == MEDIUM_ROWS)
    good_hex, bad_hex = digest_hex(TEST_KEY, good_data), digest_hex(TEST_KEY, bad_data)
    assert checked_decode(good_data, good_hex, len(good_data), Exact, TEST_KEY) == good
    with pytest.raises(ValueError, match=r">= 0 - at `\$\.total`"):
        checked_decode(bad_data, bad_hex, len(bad_data), Exact, TEST_KEY)
    for data, wrong in ((bad_data, good_hex), (good_data, bad_hex)):
        with pytest.raises(ValueError, match="do not match their digest"):
            checked_decode(data, wrong, len(data), Exact, TEST_KEY)
    with pytest.raises(ValueError, match="not as long"):
        checked_decode(bad_data, bad_hex, len(bad_data) + 1, Exact, TEST_KEY)


def test_soon_outside_an_event_loop_runs_at_once() -> None:
    """With no loop to hand it to (a coroutine driven by hand, a loop closing), now."""
    ran: list[int] = []
    soon(ran.append, 1)
    assert ran == [1]


async def test_soon_drops_what_its_call_raises() -> None:
    """A scheduled free that raises does not end the run (on trio it would, as a crash)."""
    called = anyio.Event()

    def failing() -> None:
        called.set()
        raise RuntimeError("a free that failed")

    soon(failing)
    with anyio.fail_after(10):
        await called.wait()
    await anyio.lowlevel.checkpoint()  # the loop goes on


def test_a_value_let_go_is_freed_in_a_helper_thread() -> None:
    """``let_go`` empties the caller's list: the value dies in a ``drop`` helper thread."""
    freed: list[str] = []
    done = threading.Event()

    class Tree:
        def __del__(self) -> None:
            freed.append(threading.current_thread().name)
            done.set()

    values: list[Any] = [Tree()]
    let_go(values)
    assert values == []
    assert done.wait(10)
    assert freed == [freed[0]]
    assert freed[0].startswith("response-compaction-drop")


def test_a_sliced_free_frees_every_object_of_structs_lists_and_dicts() -> None:
    """``free_in_slices`` takes structs apart and empties large lists and dicts slice by
    slice: every object the tree held is gone at its end, the tree's root included."""
    alive: list[int] = [0]

    class Leaf:
        def __init__(self) -> None:
            alive[0] += 1

        def __del__(self) -> None:
            alive[0] -= 1

    class Holder(msgspec.Struct, frozen=True, weakref=True):
        items: list[Any]
        named: dict[str, Any]
        one: Any

    count = SLICE_ITEMS * 3 + 7
    root = Holder(
        items=[Leaf() for _ in range(count)] + [[Leaf(), {"x": Leaf()}]],
        named={f"k{i}": Leaf() for i in range(count)},
        one=Leaf(),
    )
    watch = weakref.ref(root)
    stack: list[Any] = [root, [Leaf() for _ in range(5)]]
    del root
    assert alive[0] == 2 * count + 8
    alive_at_start = alive[0]
    seen: list[int] = []  # how many were alive at each pause
    free_in_slices(stack, lambda _: seen.append(alive[0]))
    assert stack == []
    assert alive[0] == 0
    assert watch() is None
    # Slice by slice: the list's and the dict's leaves went at most SLICE_ITEMS at a time.
    assert len(seen) >= 6
    assert all(
        0 <= a - b <= SLICE_ITEMS + 2 for a, b in itertools.pairwise([alive_at_start, *seen])
    )


def test_a_sliced_free_lets_go_of_a_container_someone_else_holds_without_emptying_it() -> None:
    """A list or dict the tree shares with the caller (a ``default_factory`` handing out one
    of the caller's, say) is let go of whole: only containers nobody else holds are emptied."""
    kept_list = list(range(SLICE_ITEMS * 2 + 1))
    kept_dict = {f"k{i}": i for i in range(SLICE_ITEMS * 2 + 1)}

    class Holder(msgspec.Struct, frozen=True):
        items: list[int]
        named: dict[str, int]

    free_in_slices([Holder(items=kept_list, named=kept_dict), [kept_list, kept_dict]])
    assert kept_list == list(range(SLICE_ITEMS * 2 + 1))
    assert kept_dict == {f"k{i}": i for i in range(SLICE_ITEMS * 2 + 1)}


def test_a_worker_verification_hands_its_value_out_to_free_after_the_reply(
    tmp_path: Path,
) -> None:
    """``verify_path`` returns the decoded value beside the verdict (the worker frees it once
    its reply is sent), and no value with a problem."""
    good, bad = big_exact(100), Exact(rows=big_exact(100).rows, total=-1)
    for name, value in (("good", good), ("bad", bad)):
        (tmp_path / name).write_bytes(canonical(value))
    good_data = canonical(good)
    good_hex = digest_hex(TEST_KEY, good_data)
    assert verify_path(str(tmp_path / "good"), good_hex, len(good_data), Exact, TEST_KEY) == (
        None,
        good,
    )
    bad_data = canonical(bad)
    problem, value = verify_path(
        str(tmp_path / "bad"), digest_hex(TEST_KEY, bad_data), len(bad_data), Exact, TEST_KEY
    )
    assert problem is not None
    assert ">= 0" in problem
    assert value is None
    problem, value = verify_path(str(tmp_path / "good"), "0" * 64, len(good_data), Exact, TEST_KEY)
    assert problem is not None
    assert "digest" in problem
    assert value is None
