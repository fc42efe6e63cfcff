"""Concurrent compactions on one event loop (issue 10): group commit, CPU turns, NaN scans.

Group commit: publishes queued while another holds the store's writer turn go out together,
in one transaction, each with its own result. The blocking step is driven through
``publish_grouped``'s ``patiently`` parameter (the store passes its retrying thread runner),
so each test decides when the first publish ends without sleeping.
"""

from __future__ import annotations

import os
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
import pytest

import response_compaction as rc
from response_compaction import _pool
from response_compaction._canonical import iter_canonical
from response_compaction._store import _indexes, open_store
from response_compaction._store._commit import Publication, publish, publish_all
from response_compaction._store._group import publish_grouped
from response_compaction._store._index import Row
from response_compaction._store._turns import STEPS_SECONDS, cpu_turn
from tests._store_support import (
    compact_at_once,
    entry_files,
    hex_of,
    index_rows,
    ref_of,
    store_root,
    temp_files,
)
from tests.schemas import Exact
from tests.schemas import Row as ExactRow

pytestmark = pytest.mark.anyio


def _value(i: int, rows: int = 1) -> Exact:
    return Exact(rows=[ExactRow(id=i * 1000 + n, name=f"row {n}") for n in range(rows)], total=rows)


async def _temp_items(workspace: rc.LocalWorkspace, count: int) -> tuple[str, list[Publication]]:
    """``count`` temp files in the store's ``tmp/``, each ready to publish under its own key."""
    store = await open_store(workspace)
    items = []
    for i in range(count):
        data = b"".join(iter_canonical(_value(i)))
        key = hex_of(_value(i))
        name = f"{secrets.token_hex(12)}.tmp"
        with open(os.path.join(store.root, "tmp", name), "xb") as file:  # noqa: ASYNC230
            file.write(data)
        items.append(Publication(name, "exact", key, Row(key, len(data), 1e12, None), 1.0, 100))
    return store.root, items


async def test_publishes_queued_behind_a_publish_go_out_together(
    workspace: rc.LocalWorkspace,
) -> None:
    """Two publishes queued behind a third share one publish_all, each with its own result."""
    root, items = await _temp_items(workspace, 3)
    index = _indexes.acquire(root)
    calls: list[tuple[str, int]] = []
    first_may_end = anyio.Event()

    async def patiently(fn: Callable[..., Any], *args: Any) -> Any:
        calls.append((fn.__name__, len(args[1]) if fn is publish_all else 1))
        if len(calls) == 1:
            await first_may_end.wait()
        return fn(*args)

    results: dict[int, bool] = {}

    async def one(i: int) -> None:
        results[i] = await publish_grouped(patiently, index, items[i])

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await anyio.wait_all_tasks_blocked()  # the first holds the turn, inside its publish
            tg.start_soon(one, 1)
            tg.start_soon(one, 2)
            await anyio.wait_all_tasks_blocked()  # both queued on the writer turn
            first_may_end.set()
    finally:
        _indexes.release(index)
    assert calls == [("publish", 1), ("publish_all", 2)]
    assert results == {0: False, 1: False, 2: False}
    root_path = Path(root)
    assert entry_files(root_path) == {item.key for item in items}
    assert index_rows(root_path) == {item.key for item in items}
    assert temp_files(root_path) == []


async def test_a_failed_group_fails_its_owner_and_the_others_publish_again(
    workspace: rc.LocalWorkspace,
) -> None:
    """The group's owner gets the error; the other member publishes on its own and succeeds."""
    root, items = await _temp_items(workspace, 3)
    index = _indexes.acquire(root)
    calls: list[str] = []
    first_may_end = anyio.Event()

    async def patiently(fn: Callable[..., Any], *args: Any) -> Any:
        calls.append(fn.__name__)
        if len(calls) == 1:
            await first_may_end.wait()
        if fn is publish_all:
            raise OSError(28, "No space left on device")
        return fn(*args)

    outcomes: dict[int, object] = {}

    async def one(i: int) -> None:
        try:
            outcomes[i] = await publish_grouped(patiently, index, items[i])
        except OSError as exc:
            outcomes[i] = exc.errno

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(one, 1)
            tg.start_soon(one, 2)
            await anyio.wait_all_tasks_blocked()
            first_may_end.set()
    finally:
        _indexes.release(index)
    assert calls == ["publish", "publish_all", "publish"]
    assert sorted(outcomes.values(), key=str) == sorted([False, 28, False], key=str)
    assert index_rows(Path(root)) == {items[0].key} | {
        items[i].key for i in (1, 2) if outcomes[i] is False
    }


async def test_a_rename_failing_in_a_group_fails_only_its_item(
    workspace: rc.LocalWorkspace,
) -> None:
    """publish_all: an item whose temp file is gone gets its OSError; the others are recorded."""
    root, items = await _temp_items(workspace, 3)
    os.unlink(os.path.join(root, "tmp", items[1].temp_name))
    index = _indexes.acquire(root)
    try:
        results = publish_all(index, items)
    finally:
        _indexes.release(index)
    assert results[0] is False
    assert results[2] is False
    assert isinstance(results[1], FileNotFoundError)
    assert index_rows(Path(root)) == {items[0].key, items[2].key}
    assert entry_files(Path(root)) == {items[0].key, items[2].key}


async def test_a_lone_publish_takes_the_single_publish_path(
    workspace: rc.LocalWorkspace,
) -> None:
    """With nothing else queued, the publish is _commit.publish itself (the fault seam's view)."""
    root, items = await _temp_items(workspace, 1)
    index = _indexes.acquire(root)
    seen: list[object] = []

    async def patiently(fn: Callable[..., Any], *args: Any) -> Any:
        seen.append(fn)
        return fn(*args)

    try:
        assert await publish_grouped(patiently, index, items[0]) is False
    finally:
        _indexes.release(index)
    assert seen == [publish]


async def test_concurrent_large_compactions_are_verified_by_workers_and_read_back(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Twelve ~640 KB compactions at once: workers verify all but maybe the first (stored
    while no other was yet, unless its encode outlasted its turn), and every receipt reads
    back."""
    _pool.POOL.start()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= 1, 60)
    values = [_value(i, rows=12_000) for i in range(12)]
    before = _pool.POOL.calls
    receipts = await compact_at_once(harness, values)
    # With every worker busy, the others waited for one instead of decoding on the loop. The
    # first is verified here only if it was stored before any other began (under load its
    # encode can outlast its turn, and the others' then start first).
    assert before + len(values) - 1 <= _pool.POOL.calls <= before + len(values)
    for i, value in enumerate(values):
        assert receipts[i].exact_ref == ref_of(value)
        assert receipts[i].exact_cache == "stored"
        found = await rc.response_compaction_read_exact(harness, receipts[i].exact_ref, Exact)
        assert found == rc.Found(value=value)
    assert len(index_rows(store_root(workspace))) >= len(values)
    assert temp_files(store_root(workspace)) == []


async def test_cpu_steps_yield_holding_the_turn_once_they_ran_long_enough() -> None:
    """Steps that ran STEPS_SECONDS back to back: the next takes the yield branch, then restarts."""
    turn = cpu_turn()
    turn.spent = STEPS_SECONDS / 2
    async with turn:
        short = turn.spent  # below the bound: no yield, the count goes on
    turn.spent = STEPS_SECONDS  # as if steps had just run that long without a yield
    async with turn:
        long = turn.spent  # the yield happened holding the turn: counting starts again
    assert short == STEPS_SECONDS / 2
    assert long == 0.0  # (what the block then spent is real time: a preemption could pass 10 ms)
    assert not turn.lock.locked()


async def test_a_turn_that_yields_lets_a_due_timer_run_before_its_next_step() -> None:
    """A heartbeat whose timer is already due runs at the yield, not after one more step."""
    turn = cpu_turn()
    beats: list[int] = []

    async def heartbeat(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep(0.001)  # in the same step: the timer is set before the parent runs
        beats.append(1)

    async with anyio.create_task_group() as tg:
        await tg.start(heartbeat)
        due = time.perf_counter() + 0.002
        while time.perf_counter() < due:  # a CPU-bound step: the timer falls due meanwhile
            pass
        turn.spent = STEPS_SECONDS
        async with turn:  # the yield branch
            assert beats == [1]


async def test_a_first_piece_slow_to_encode_gives_the_loop_a_turn_before_the_next(
    workspace: rc.LocalWorkspace,
) -> None:
    """Encoding that held the loop past the first gather's budget yields before the next piece,
    even when the value is small (the first steps of a 562k-key dict took 40 ms in one turn)."""
    store = await open_store(workspace)
    data = msgspec.json.encode(Exact(rows=[], total=0), order="sorted")
    events: list[str] = []

    def pieces() -> Iterator[bytes]:
        due = time.perf_counter() + STEPS_SECONDS
        while time.perf_counter() < due:  # a CPU-bound encoder step
            pass
        yield data[:5]
        events.append("next piece")
        yield data[5:]

    async def other() -> None:
        events.append("other task")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        stored = await store.put("exact", pieces(), key=None, schema=Exact, ttl_seconds=60,
                                 max_entries=100, want_value_up_to=len(data))  # fmt: skip
    assert events == ["other task", "next piece"]
    assert stored.value == Exact(rows=[], total=0)


async def test_a_nan_among_many_floats_is_refused_with_its_path() -> None:
    """The narrowed scan of a long list still finds a NaN, and names where it is."""
    values = [0.5] * 5000
    values[4321] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinity at `\$\[4321\]`"):
        b"".join(iter_canonical(values))


async def test_float_bytes_that_look_like_a_nan_are_not_refused() -> None:
    """A finite float whose bytes hold the NaN marker makes the scan suspicious, not a refusal."""
    (lookalike,) = struct.unpack(">d", b"\x40\xcb\x7f\xf0\x00\x00\x00\x01")
    values: list[float | None] = [0.25] * 3000
    values[1234] = lookalike
    values[7] = None  # a null in the output, so the scan runs at all
    assert b"".join(iter_canonical(values)) == msgspec.json.encode(values)
