"""A verification finding every worker busy is queued behind one: one deep, and never misread.

The worker reads its next request the moment it is done, whatever the caller's event loop is
doing. The files are FIFOs: a worker's open waits until the test writes, so which job a worker
is on is the test's to say. Once a call on a worker fails or is cancelled, the call queued
with it gets no reply of another's, and the worker is killed, not handed out again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked

from response_compaction import _pool, _verifiers
from response_compaction._digest import digest_hex
from tests._store_support import TEST_KEY, canonical
from tests.schemas import Exact, big_exact

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent

#: ``ask(i)``: one verification of a test, its reply kept by the test.
Ask = Callable[[int], Coroutine[Any, Any, None]]
#: Bound on a wait that only a broken queue makes long (a worker that never comes).
GUARD_SECONDS = 30


async def _ready_pool() -> int:
    """Every worker of the pool idle and ready: how many there are."""
    cores = _pool.usable_cores()
    _pool.POOL.start()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= cores, 60)
    return cores


@pytest.fixture
def make_fifos(tmp_path: Path) -> Iterator[Callable[[int], list[Path]]]:
    """Make FIFOs; afterwards, unblock any worker still opening one (a failed test's workers
    outlived pytest otherwise): opened read-write here, the worker's open returns."""
    made: list[Path] = []

    def make(count: int) -> list[Path]:
        paths = [tmp_path / f"value-{len(made) + i}.tmp" for i in range(count)]
        for path in paths:
            os.mkfifo(path)
        made.extend(paths)
        return paths

    yield make
    for path in made:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


def _opened_for_writing(path: Path, seconds: float) -> int | None:
    """Open FIFO ``path`` for writing, blocking this thread (and its event loop) for at most
    ``seconds`` until a worker opens it for reading; None if none did."""
    opened: list[int] = []
    opener = threading.Thread(target=lambda: opened.append(os.open(path, os.O_WRONLY)))
    opener.start()
    opener.join(seconds)
    if not opened:  # let the opener go: a reader of our own, then both closed
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        opener.join()
        os.close(opened[0])
        os.close(reader)
        return None
    return opened[0]


async def _write(fifo: Path, data: bytes) -> None:
    """Write ``data`` to ``fifo`` once a worker opens it; abandoned if the test gives up (the
    worker may be gone: the open would wait for ever), unblocked at teardown."""
    await anyio.to_thread.run_sync(fifo.write_bytes, data, abandon_on_cancel=True)


def _asking(fifos: list[Path], size: int, replies: dict[int, object]) -> Ask:
    """``ask(i)``: verify FIFO ``i`` (``size`` bytes expected), its reply into ``replies[i]``."""

    async def ask(i: int) -> None:
        replies[i] = await _verifiers.verify_unknown(str(fifos[i]), size, Exact, TEST_KEY)

    return ask


async def _ask_in(scope: anyio.CancelScope, ask: Ask, i: int) -> None:
    with scope:
        await ask(i)


async def test_a_verification_finding_every_worker_busy_is_queued_behind_one(
    make_fifos: Callable[[int], list[Path]],
) -> None:
    """One job per worker, and one more each: with the event loop held, a worker done with
    its job opens the file of the job queued behind it (its request was sent before)."""
    cores = await _ready_pool()
    # Each file its own value, all of one length: a reply read by the wrong call shows.
    values = [canonical(Exact(rows=big_exact(3).rows, total=i)) for i in range(2 * cores)]
    assert len({len(value) for value in values}) == 1
    fifos = make_fifos(2 * cores)
    replies: dict[int, object] = {}
    ask = _asking(fifos, len(values[0]), replies)
    with anyio.fail_after(GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            for i in range(2 * cores):  # one by one: job i + cores is queued behind job i
                tg.start_soon(ask, i)
                await wait_all_tasks_blocked()
            # The loop's thread is held from here until the queued job's file is open.
            fifos[0].write_bytes(values[0])  # the first worker's job
            queued = _opened_for_writing(fifos[cores], seconds=10)
            assert queued is not None, "the job behind the first was not sent to its worker"
            os.write(queued, values[cores])
            os.close(queued)
            for i in [*range(1, cores), *range(cores + 1, 2 * cores)]:
                await _write(fifos[i], values[i])
    assert replies == {
        i: {"problem": None, "digest": digest_hex(TEST_KEY, value)}
        for i, value in enumerate(values)
    }


async def _healthy_pool(tmp_path: Path, cores: int) -> None:
    """Every worker of the pool answers its own job: none still owes an old reply."""
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= cores, 60)
    values = [canonical(big_exact(i + 1)) for i in range(cores)]
    replies: dict[int, object] = {}

    async def ask(i: int) -> None:
        path = tmp_path / f"after-{i}.tmp"
        path.write_bytes(values[i])
        replies[i] = await _verifiers.verify_unknown(str(path), len(values[i]), Exact, TEST_KEY)

    with anyio.fail_after(GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            for i in range(cores):
                tg.start_soon(ask, i)
    assert replies == {
        i: {"problem": None, "digest": digest_hex(TEST_KEY, value)}
        for i, value in enumerate(values)
    }


async def test_a_queued_verification_cancelled_leaves_the_one_ahead_its_reply(
    tmp_path: Path, make_fifos: Callable[[int], list[Path]]
) -> None:
    """The job queued behind the first is cancelled: the first still gets its own reply, and
    its worker (which would read the cancelled request next) is not handed out again."""
    cores = await _ready_pool()
    data = canonical(big_exact(3))
    fifos = make_fifos(cores + 1)
    replies: dict[int, object] = {}
    ask = _asking(fifos, len(data), replies)
    behind = anyio.CancelScope()
    with anyio.fail_after(GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            for i in range(cores):  # one by one: the job behind is queued behind job 0
                tg.start_soon(ask, i)
                await wait_all_tasks_blocked()
            tg.start_soon(_ask_in, behind, ask, cores)
            await wait_all_tasks_blocked()
            behind.cancel()
            await wait_all_tasks_blocked()
            for i in range(cores):
                await _write(fifos[i], data)
    assert behind.cancelled_caught
    expected = {"problem": None, "digest": digest_hex(TEST_KEY, data)}
    assert replies == dict.fromkeys(range(cores), expected)
    await _healthy_pool(tmp_path, cores)


async def test_a_verification_queued_behind_a_cancelled_one_reads_no_reply(
    tmp_path: Path, make_fifos: Callable[[int], list[Path]]
) -> None:
    """The first job on a worker is cancelled while one is queued behind it: the queued call
    says NOT_DONE (its caller verifies) without reading the socket, and the worker goes."""
    cores = await _ready_pool()
    first = canonical(big_exact(3))
    fifos = make_fifos(cores)
    second = tmp_path / "second.tmp"
    second.write_bytes(canonical(big_exact(4)))
    replies: dict[int, object] = {}
    ask = _asking(fifos, len(first), replies)
    ahead = anyio.CancelScope()

    async def ask_second() -> None:
        size = second.stat().st_size
        replies[cores] = await _verifiers.verify_unknown(str(second), size, Exact, TEST_KEY)

    with anyio.fail_after(GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_ask_in, ahead, ask, 0)
            await wait_all_tasks_blocked()
            for i in range(1, cores):  # after: the second job is queued behind the first
                tg.start_soon(ask, i)
                await wait_all_tasks_blocked()
            tg.start_soon(ask_second)  # queued behind the first job
            await wait_all_tasks_blocked()
            ahead.cancel()
            await wait_all_tasks_blocked()
            assert replies.get(cores, "pending") is _pool.NOT_DONE
            for i in range(1, cores):
                await _write(fifos[i], first)
    assert ahead.cancelled_caught
    expected = {"problem": None, "digest": digest_hex(TEST_KEY, first)}
    assert replies == {**dict.fromkeys(range(1, cores), expected), cores: _pool.NOT_DONE}
    await _healthy_pool(tmp_path, cores)


async def test_a_verification_is_not_queued_behind_a_large_job(
    tmp_path: Path, make_fifos: Callable[[int], list[Path]]
) -> None:
    """Behind a job of more than QUEUE_BEHIND_BYTES a call waits for whichever worker is back
    first: one large job ends, and the small call is answered while the other still runs."""
    cores = await _ready_pool()
    if cores < 2:
        pytest.skip("needs two workers: one held by a large job, one coming back")
    large = _verifiers.QUEUE_BEHIND_BYTES + 1
    fifos = make_fifos(cores)
    small = canonical(big_exact(3))
    path = tmp_path / "small.tmp"
    path.write_bytes(small)
    replies: dict[int, object] = {}
    answered = anyio.Event()

    ask_large = _asking(fifos, large, replies)  # the FIFO holds less: "not as long" comes back

    async def ask_small() -> None:
        replies[cores] = await _verifiers.verify_unknown(str(path), len(small), Exact, TEST_KEY)
        answered.set()

    with anyio.fail_after(GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            for i in range(cores):
                tg.start_soon(ask_large, i)
                await wait_all_tasks_blocked()
            tg.start_soon(ask_small)
            await wait_all_tasks_blocked()
            await _write(fifos[cores - 1], small)
            await answered.wait()  # behind job 0 it would wait for job 0, still running
            assert 0 not in replies
            for i in range(cores - 1):
                await _write(fifos[i], small)
    assert replies[cores] == {"problem": None, "digest": digest_hex(TEST_KEY, small)}


# Forked from a process with few threads: the suite's own process holds helper threads whose
# locks a child forked from it may find taken for ever. Exit code 0: the child left the
# verification to its caller (NOT_DONE) instead of using a parent's worker.
_FORK_SCRIPT = """
import os, sys
import anyio
from response_compaction import _pool, _verifiers
from tests._store_support import TEST_KEY
from tests.schemas import Exact

_pool.POOL.start()
assert _pool.POOL.wait_ready(lambda n: n >= 1, 60)
path, size = sys.argv[1], int(sys.argv[2])
pid = os.fork()
if pid == 0:
    code = 2
    try:
        reply = anyio.run(_verifiers.verify_unknown, path, size, Exact, TEST_KEY)
        code = 0 if reply is _pool.NOT_DONE else 1
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
mine = anyio.run(_verifiers.verify_unknown, path, size, Exact, TEST_KEY)
sys.exit(os.waitstatus_to_exitcode(status) or (3 if mine is _pool.NOT_DONE else 0))
"""


def test_a_forked_child_does_not_use_the_parents_workers(tmp_path: Path) -> None:
    """After a fork the child has a pool of its own, not started: a verification there is
    left to the caller (NOT_DONE), never sent down a socket of the parent's workers, which
    still answer the parent."""
    data = canonical(big_exact(3))
    path = tmp_path / "value.tmp"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(path), str(len(data))],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
