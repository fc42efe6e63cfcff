"""Group commit: this event loop's concurrent publishes into one store share one transaction.

Every publish holds the index's write lock for a rename, a directory fsync and a commit (a
WAL fsync): about 7 ms of disk waits, one publish at a time, so 32 concurrent compactions
queued behind each other there. Here a publish joins the store's queue, then waits for the
store's writer turn (``_turns.writer_turn``); whoever gets the turn publishes everything
queued by then in one transaction (``_commit.publish_all``), and a task whose publish a
previous turn already did just takes its result. Each item is still renamed, its directory
fsynced and its row committed before its own caller gets a result; only the fsyncs are shared.

A queue of one goes through :func:`_commit.publish` exactly as before (the tests' fault seam
sees the same call). When a whole group fails, its owner gets the error and every other
member publishes again on its own, so each caller sees its own outcome. A member cancelled
while queued leaves the queue; one cancelled while its group is being written just stops
waiting (its caller removes the temp file: a rename that still happens publishes an entry
nobody was promised).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from anyio.lowlevel import RunVar

from ._commit import Publication, publish, publish_all
from ._index import Index
from ._turns import writer_turn

__all__ = ["publish_grouped"]

Patiently = Callable[..., Awaitable[Any]]

_QUEUES: RunVar[dict[str, list[_Member]]] = RunVar("response_compaction_publish_queues")


class _AgainError(Exception):
    """The group this member was in failed as a whole: publish again, alone or in a new one."""


class _Member:
    __slots__ = ("item", "outcome", "taken")

    def __init__(self, item: Publication) -> None:
        self.item = item
        self.taken = False
        self.outcome: bool | BaseException | None = None


def _queue(root: str) -> list[_Member]:
    try:
        queues = _QUEUES.get()
    except LookupError:
        queues = {}
        _QUEUES.set(queues)
    return queues.setdefault(root, [])


async def publish_grouped(patiently: Patiently, index: Index, item: Publication) -> bool:
    """Publish ``item`` (see :func:`_commit.publish`), in a group with others queued meanwhile.

    ``patiently`` runs a blocking call in a worker thread, retrying while the index is busy.
    Returns whether the key was live before.
    """
    while True:
        member = _Member(item)
        queue = _queue(index.root)
        queue.append(member)
        try:
            async with writer_turn(index.root):
                if not member.taken:
                    await _write_group(patiently, index, queue, member)
        except BaseException:
            if not member.taken:
                queue.remove(member)
            raise
        outcome = member.outcome
        if isinstance(outcome, _AgainError):
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:  # pragma: no cover - a group always settles every member
            raise RuntimeError("a grouped publish ended without an outcome")
        return outcome


async def _write_group(
    patiently: Patiently, index: Index, queue: list[_Member], owner: _Member
) -> None:
    """Publish every queued member in one transaction and settle each one's outcome."""
    group = queue[:]
    queue.clear()
    for member in group:
        member.taken = True
    try:
        if len(group) == 1:
            results: list[bool | OSError] = [await patiently(publish, index, *owner.item)]
        else:
            results = await patiently(publish_all, index, [m.item for m in group])
    except BaseException:
        for member in group:
            if member is not owner:
                member.outcome = _AgainError()  # the owner raises; the others go again
        raise
    for member, result in zip(group, results, strict=True):
        member.outcome = result
