"""Work on an entry's bytes while they are verified: for readers of a part of a large entry.

:func:`get_checked` is the entry point, a reader's twin of :meth:`Store.get`. Three ways,
one rule (a result leaves only when the bytes are what the key names: for an exact entry,
what the reference names):

- :func:`overlap_check`: the bytes are in this process; the digest is checked in a worker
  thread (hashlib lets go of the GIL) while the work runs on the event loop.
- an entry of ``HASHED_BYTES`` (32 MiB) or more with an array in its layout, through the
  library's own file backends: hashed piece by piece as it is read (``_reading``), and the
  work (a slice or two) done only on bytes whose digest has passed. Read, then hashed, 90 MB
  took 50 + 53 ms; hashed as read, 58-68. (With no array to slice, the work is a scan of the
  whole: it overlaps the check instead, as above.)
- :func:`in_pool_or_thread`: for a large entry whose work would hold the GIL for long (one
  msgspec scan of a 90 MB value is ~100 ms): one of the library's pool workers
  (``python -m response_compaction._worker``, never the caller's ``__main__``) opens the
  entry the same link-refusing way, checks the keyed digest (the key travels with the
  request) while it does the work, and sends back only the small result or what failed.
  With no idle worker, a thread of this process does exactly the same.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import msgspec

from .. import _pool
from .._canonical import Span
from .._errors import map_errors
from .._models import Broken, Missing
from .._perf import paused_gc
from . import _indexes, _reading
from ._fileio import FileBackend
from ._paths import Kind, NotRegularFileError, open_entry
from ._reading import Data, read_limited
from ._verify import check_trusted, check_trusted_digest, opened_layout

if TYPE_CHECKING:
    from . import Store

__all__ = [
    "WHOLE_WORK_BYTES",
    "WholeWork",
    "get_checked",
    "in_pool_or_thread",
    "on_entry",
    "overlap_check",
]

T = TypeVar("T")
Check = Callable[[bytes], None]

#: An entry this large without a layout is worked on whole, away from the event loop.
WHOLE_WORK_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class WholeWork(Generic[T]):
    """Work on a whole entry's bytes that a pool worker can do too.

    A worker does ``op`` (a request kind of ``_worker``) with the plain-data ``args`` and
    replies with its result encoded as msgpack, turned back by ``from_reply``; ``local`` is
    the same work for a thread of this process. Both must give the same result.
    """

    op: str
    args: dict[str, Any]
    local: Callable[[bytes], T]
    from_reply: Callable[[bytes], T]


async def get_checked(
    store: Store,
    kind: Kind,
    key: str,
    work: Callable[[Data, tuple[Span, ...]], Awaitable[T]],
    whole: WholeWork[T] | None,
) -> T | Missing | Broken:
    """``work(bytes, layout)`` on one entry, its result only for bytes that verify.

    The check (against the reference, as :meth:`Store.get`) overlaps the work. An entry of
    8 MiB or more without a layout goes to ``whole`` in a pool worker or a thread instead.
    A read is a use. Part of the store package: it uses the store's privates.
    """
    now = store.clock()
    async with store._using_index() as index:
        row = await store._live_row(index, kind, key, now)
        if isinstance(row, (Missing, Broken)):
            return row
        # Item counts come only from a layout this store's key sealed to this entry.
        spans = opened_layout(store._key, kind, key, row.digest, row.layout)
        # The reference (or, for a summary, the sealed row) is the only digest trusted.
        check = partial(check_trusted, kind=kind, key=key, recorded=row.digest, secret=store._key)
        backend = store._backend
        result: T | Missing | Broken | ValueError
        with map_errors(f"could not read the {kind} entry"):
            if whole is not None and not spans and row.size >= WHOLE_WORK_BYTES:
                where = (store.root, kind, key, row.size)
                result = await in_pool_or_thread(backend, where, check, whole)
            elif store._fast and row.size >= _reading.HASHED_BYTES and _has_array(spans):
                # Hashed as it is read: the work (a slice or two) begins on bytes that verify.
                got = await store._read_hashed(kind, key, row.size)
                if isinstance(got, (Missing, Broken)):
                    return got
                result = await _checked_first(got, check, spans, work)
            else:
                data = await store._read_entry(kind, key, row.size)
                if isinstance(data, (Missing, Broken)):
                    return data
                result = await overlap_check(backend, data, check, spans, work)
        if isinstance(result, ValueError):
            return Broken(detail=f"{kind} entry does not verify: {result}")
        if not isinstance(result, (Missing, Broken)):
            # Best-effort, like any read: a held lock must not turn a found part into an error.
            _indexes.note_use(index, kind, key, now)  # a due batch: by a helper, not a hop
    return result


def _has_array(spans: tuple[Span, ...]) -> bool:
    return any(not span.mapping for span in spans)


async def _checked_first(
    got: tuple[Data, str],
    check: partial[None],
    spans: tuple[Span, ...],
    work: Callable[[Data, tuple[Span, ...]], Awaitable[T]],
) -> T | ValueError:
    """``work(data, spans)`` once ``data``'s digest passes ``check``; else what is wrong."""
    data, found = got
    try:
        check_trusted_digest(found, **check.keywords)
    except ValueError as exc:
        return exc
    return await work(data, spans)


async def overlap_check(
    backend: FileBackend,
    data: bytes,
    check: Check,
    spans: tuple[Span, ...],
    work: Callable[[Data, tuple[Span, ...]], Awaitable[T]],
) -> T | ValueError:
    """``work(data, spans)`` while ``data`` is checked: its result, or what is wrong with data.

    ``work``'s exception, if any, is raised only when the bytes verify.
    """
    problem: list[ValueError] = []

    async def checking() -> None:
        try:
            await backend.run(check, data)
        except ValueError as exc:
            problem.append(exc)

    failure: Exception | None = None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(checking)
        try:
            result = await work(data, spans)
        except Exception as exc:  # re-raised below once the bytes verify
            failure = exc
    if problem:
        return problem[0]
    if failure is not None:
        raise failure
    return result


async def in_pool_or_thread(
    backend: FileBackend,
    where: tuple[str, Kind, str, int],
    check: partial[None],
    whole: WholeWork[T],
) -> T | Missing | Broken:
    """``whole`` on the entry's bytes, returned only for bytes that verify.

    In one of the library's pool workers when one is idle (never a process that imports the
    caller's ``__main__``), else in a worker thread of this process: the same reads, the same
    check, the same work, so the same result either way. Never skips the check.
    """
    # ``check`` is ``partial(check_trusted, ...)``: its keywords (the trusted digest and the
    # store's key) go with the request, so the worker checks exactly what this process would.
    root, kind, _, size = where
    request = {"op": whole.op, "args": whole.args, "root": root, "size": size}
    reply = await _pool.call(request | {"check": check.keywords})
    if reply is _pool.NOT_DONE:
        outcome = await backend.run(on_entry, where, check, whole.local)
    else:
        outcome = _from_reply(reply, whole)
    state, payload = outcome
    if state == "raised":
        raise payload
    if state == "oserror":
        raise OSError(*payload)
    if state == "missing":
        return Missing()
    if state == "broken":
        return Broken(detail=f"{kind} entry {payload}")
    result: T = payload
    return result


#: Exceptions a worker's work may raise that are sent back as (tag, message) and raised here
#: exactly as the work in this process would raise them; any other goes to a thread instead.
RAISED: dict[type[Exception], str] = {
    msgspec.DecodeError: "decode",
    LookupError: "lookup",
    ValueError: "value",
}
_RAISE = {tag: cls for cls, tag in RAISED.items()}


def _from_reply(reply: dict[str, Any], whole: WholeWork[T]) -> tuple[str, Any]:
    if "ok" in reply:
        return "ok", whole.from_reply(reply["ok"])
    if "raised" in reply:
        tag, message = reply["raised"]
        return "raised", _RAISE[tag](message)
    (state, payload), *_ = reply.items()
    return state, payload


def on_entry(
    where: tuple[str, Kind, str, int], check: Check, work: Callable[[bytes], Any]
) -> tuple[str, Any]:
    """Blocking (a pool worker, or a thread here): what happened, as plain data.

    ``where`` is the root, kind, key and the row's size: at most one byte more is read (a
    file grown since, to a sparse terabyte, fails its check instead of a ``MemoryError``).

    ``("ok", result)``, ``("raised", exc)``, ``("missing", None)``, ``("broken", detail)`` or
    ``("oserror", (errno, reason))``. The bytes are hashed in a second thread (hashlib lets
    go of the GIL) while ``work`` runs; ``work``'s result or exception counts only when they
    verify.
    """
    root, kind, key, size = where
    try:
        fd = open_entry(root, kind, key)
    except FileNotFoundError:
        return "missing", None  # evicted by another process between lookup and open
    except NotRegularFileError:
        return "broken", "is not a regular file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "broken", "is a symlink; refusing to follow it"
        # Sent as plain data: a worker's reply carries no exception objects.
        return "oserror", (exc.errno, exc.strerror or type(exc).__name__)
    try:
        data = read_limited(fd, size)
    except OSError as exc:
        return "oserror", (exc.errno, exc.strerror or type(exc).__name__)
    finally:
        os.close(fd)
    # The work builds no cycles; a collection over a freshly decoded document only costs.
    with paused_gc(), concurrent.futures.ThreadPoolExecutor(1) as pool:
        checked = pool.submit(check, data)
        try:
            result: tuple[str, Any] = ("ok", work(data))
        except Exception as exc:  # raised by the caller once the bytes verify
            result = ("raised", exc)
        try:
            checked.result()
        except ValueError as exc:
            return "broken", f"does not verify: {exc}"
    return result
