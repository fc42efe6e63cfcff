"""Many medium values on one loop: what the caller's process does per value, and in what order.

A medium value being gathered finishes in its first CPU turn (its tail used to queue behind
every other task's turn, so 32 values were all encoded before the first was written); the
pool's workers are called on the event loop, with no worker thread; when a worker verifies
a value this process wrote, it hashes what it read back and this process compares that with
its own digest of the bytes it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked

import response_compaction as rc
from response_compaction import _pool, _store, _verifiers
from response_compaction._canonical import iter_canonical
from response_compaction._digest import digest_hex
from response_compaction._store import open_store
from response_compaction._store._turns import cpu_turn, next_turn
from response_compaction._store._verify import check_reply
from tests._store_support import (
    TEST_KEY,
    canonical,
    compact_at_once,
    ref_of,
    store_root,
    temp_files,
)
from tests.schemas import Exact, big_exact

pytestmark = pytest.mark.anyio

#: About 320 KB of canonical JSON: over the one-hop size of small values, quick to encode.
ROWS = 5_300


async def _ready_pool() -> None:
    _pool.POOL.start()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= 1, 60)


async def test_a_medium_value_is_gathered_before_tasks_queued_behind_it_take_a_turn(
    workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every piece of a medium value is gathered in its first turn, before queued tasks run.

    The pieces are encoded beforehand, and the time budget the first turn's gather also stops
    on (half a CPU turn) is a minute here: the encoding of 320 KB exceeded 5 ms on a loaded
    machine, and so could a preempted gather of the encoded pieces.
    """
    monkeypatch.setattr(_store, "STEPS_SECONDS", 120.0)
    store = await open_store(workspace)
    value = big_exact(ROWS)
    assert len(canonical(value)) > 256 << 10
    encoded = list(iter_canonical(value))
    assert len(encoded) > 1
    events: list[str] = []

    def pieces() -> Iterator[bytes | memoryview]:
        for piece in encoded:
            events.append("piece")
            yield piece
        events.append("end")

    async def other() -> None:
        async with turn:
            events.append("other")

    turn = cpu_turn()
    async with anyio.create_task_group() as tg:
        await turn.acquire()  # the put, then the others, queue on it in this order
        tg.start_soon(lambda: store.put("exact", pieces(), key=None, schema=Exact,
                                        ttl_seconds=3600, max_entries=100,
                                        want_value_up_to=0))  # fmt: skip
        await wait_all_tasks_blocked()
        for _ in range(3):
            tg.start_soon(other)
        await wait_all_tasks_blocked()
        turn.release()
    assert events.count("other") == 3
    assert events.index("end") < events.index("other")
    assert temp_files(store_root(workspace)) == []


async def test_a_task_whose_timer_fell_due_during_a_step_runs_before_the_next_step() -> None:
    """Between two CPU steps (slices of a large read) a sleeper whose deadline passed runs.

    asyncio runs a due timer's callback behind the task already queued, and the task it wakes
    one pass later still: with one checkpoint between steps a 1 ms heartbeat waited for two
    more 4 ms slices (90 MB of strings read back froze it 28-44 ms; 15-25 with three).
    """
    order: list[str] = []
    asleep = anyio.Event()

    async def sleeper() -> None:
        asleep.set()
        await anyio.sleep(0.001)
        order.append("woke")

    async def stepper() -> None:
        await asleep.wait()
        began = anyio.current_time()
        async with cpu_turn():
            while anyio.current_time() < began + 0.005:  # a step that outlasts the deadline
                pass
            order.append("step 0")
            await next_turn()
            order.append("step 1")

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        tg.start_soon(stepper)
    assert order == ["step 0", "woke", "step 1"]


async def test_a_step_cancelled_between_turns_raises_its_cancellation() -> None:
    """Cancelled while it waits to take the turn back (another task holds it), a step ends
    with its cancellation, holding the turn its block then lets go of: not a RuntimeError
    for releasing a lock it did not hold (a deadline during a large read or compaction)."""
    turn = cpu_turn()
    scope = anyio.CancelScope()
    other_began = anyio.Event()

    async def other() -> None:
        async with turn:
            other_began.set()
            scope.cancel()  # the stepper now waits for the turn this task holds
            for _ in range(5):
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        with scope:
            async with turn:
                tg.start_soon(other)
                await next_turn()  # lets other take the turn, then waits to take it back
        assert scope.cancelled_caught
    assert other_began.is_set()
    assert not turn.lock.locked()
    async with turn:  # free for the next step
        pass


async def test_a_worker_hashes_what_it_reads_back_without_a_thread_here(tmp_path: Path) -> None:
    """A worker reading back a file (a FIFO that waits for the test) holds no thread here,
    and replies with the keyed digest of the bytes it read and no problem."""
    await _ready_pool()
    data = canonical(big_exact(3))
    path = tmp_path / "value.tmp"
    os.mkfifo(path)
    replies = []

    async def ask() -> None:
        replies.append(await _verifiers.verify_unknown(str(path), len(data), Exact, TEST_KEY))

    limiter = anyio.to_thread.current_default_thread_limiter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await wait_all_tasks_blocked()
        assert limiter.borrowed_tokens == 0  # waiting on the socket, not in a worker thread
        await anyio.to_thread.run_sync(path.write_bytes, data)  # the worker's open returns
    (reply,) = replies
    assert reply == {"problem": None, "digest": digest_hex(TEST_KEY, data)}
    check_reply(reply, digest_hex(TEST_KEY, data))


@pytest.mark.parametrize("cut", ["short", "invalid"])
async def test_a_worker_reports_bytes_read_back_that_are_short_or_invalid(
    tmp_path: Path, cut: str
) -> None:
    """Short bytes come back with no digest; bytes that break the schema with their digest."""
    await _ready_pool()
    good = canonical(Exact(rows=big_exact(3).rows, total=3))
    bad = canonical(Exact(rows=big_exact(3).rows, total=-1))
    data = good[:-1] if cut == "short" else bad
    path = tmp_path / "value.tmp"
    path.write_bytes(data)
    size = len(good) if cut == "short" else len(bad)
    reply = await _verifiers.verify_unknown(str(path), size, Exact, TEST_KEY)
    assert reply is not _pool.NOT_DONE
    if cut == "short":
        assert reply == {"problem": "the bytes read back are not as long as those written",
                         "digest": None}  # fmt: skip
    else:
        assert reply["digest"] == digest_hex(TEST_KEY, bad)
        assert ">= 0" in reply["problem"]
    with pytest.raises(ValueError, match=r"long|>= 0"):
        check_reply(reply, digest_hex(TEST_KEY, data))


def test_a_digest_that_differs_from_the_writers_wins_over_a_decode_problem() -> None:
    """Bytes read back under another digest are refused as such, whatever their decode said."""
    ours = digest_hex(TEST_KEY, b'{"a":1}')
    theirs = digest_hex(TEST_KEY, b'{"a":2}')
    with pytest.raises(ValueError, match="do not match their digest"):
        check_reply({"problem": None, "digest": theirs}, ours)
    with pytest.raises(ValueError, match="do not match their digest"):
        check_reply({"problem": "Expected `int`", "digest": theirs}, ours)
    with pytest.raises(ValueError, match="Expected `int`"):
        check_reply({"problem": "Expected `int`", "digest": ours}, ours)
    check_reply({"problem": None, "digest": ours}, ours)


async def test_many_medium_values_at_once_get_the_writers_digests(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Eight medium values at once: verified by workers, each receipt names its own digest."""
    await _ready_pool()
    values = [Exact(rows=big_exact(16_000).rows, total=i) for i in range(8)]  # ~960 KB each
    before = _pool.POOL.calls
    receipts = await compact_at_once(harness, values)
    assert _pool.POOL.calls > before
    for i, value in enumerate(values):
        assert receipts[i].exact_ref == ref_of(value)
        assert receipts[i].exact_cache == "stored"
        found = await rc.response_compaction_read_exact(harness, receipts[i].exact_ref, Exact)
        assert found == rc.Found(value=value)
    assert temp_files(store_root(workspace)) == []
