"""Work on an entry's bytes while they are verified: for readers of a part of a large entry.

:func:`get_checked` is the entry point, a reader's twin of :meth:`Store.get`. Two ways, one
rule (a result leaves only when the bytes are what the key names: for an exact entry, what
the reference names):

- :func:`overlap_check`: the bytes are in this process; the digest is checked in a worker
  thread (hashlib lets go of the GIL) while the work runs on the event loop.
- :func:`in_worker_process`: for a large entry whose work would hold the GIL for long (one
  msgspec scan of a 90 MB value is ~100 ms): a worker process opens the entry the same
  link-refusing way, hashes it in a thread and runs the work meanwhile, and sends back only
  the small result. The caller's loop does not wait on any of it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import gc
import os
import pickle
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_process

from .._canonical import Span
from .._errors import map_errors
from .._models import Broken, Missing
from .._slices import decode_layout
from ._fileio import FileBackend
from ._index import CorruptRowError
from ._paths import Kind, NotRegularFileError, open_fanout, regular_opener
from ._verify import PROCESS_VERIFY_BYTES, check_trusted

if TYPE_CHECKING:
    from . import Store

__all__ = ["get_checked", "in_worker_process", "overlap_check"]

T = TypeVar("T")
Check = Callable[[bytes], None]


async def get_checked(
    store: Store,
    kind: Kind,
    key: str,
    work: Callable[[bytes, tuple[Span, ...]], Awaitable[T]],
    whole_work: Callable[[bytes], T] | None,
) -> T | Missing | Broken:
    """``work(bytes, layout hint)`` on one entry, its result only for bytes that verify.

    The check (against the reference, as :meth:`Store.get`) overlaps the work. An entry of
    8 MiB or more without a layout goes to ``whole_work(bytes)`` (picklable) in a worker
    process instead. A read is a use. Part of the store package: it uses the store's privates.
    """
    now = store.clock()
    async with store._using_index() as index:
        try:
            row = await store._patiently(index.lookup, kind, key, now)
        except CorruptRowError:
            return Broken(detail=f"{kind} entry's index row is corrupt")
        # As Store.get: expired by this clock or by the time other clocks witnessed (_clocks).
        if row is None or row.expires_at <= max(now, row.attested):
            return Missing()
        spans = decode_layout(row.layout)
        # The reference (or, for a summary, the sealed row) is the only digest trusted.
        check = partial(check_trusted, kind=kind, key=key, recorded=row.digest, secret=store._key)
        backend = store._backend
        result: T | Missing | Broken | ValueError | None = None
        with map_errors(f"could not read the {kind} entry"):
            if whole_work is not None and not spans and row.size >= PROCESS_VERIFY_BYTES:
                result = await in_worker_process(store.root, kind, key, check, whole_work)
            if result is None:
                data = await store._read_entry(kind, key)
                if isinstance(data, (Missing, Broken)):
                    return data
                result = await overlap_check(backend, data, check, spans, work)
        if isinstance(result, ValueError):
            return Broken(detail=f"{kind} entry does not verify: {result}")
        if not isinstance(result, (Missing, Broken)):
            # Best-effort, like any read: a held lock must not turn a found part into an error.
            await backend.run(index.record_use, kind, key, now)
    return result


async def overlap_check(
    backend: FileBackend,
    data: bytes,
    check: Check,
    spans: tuple[Span, ...],
    work: Callable[[bytes, tuple[Span, ...]], Awaitable[T]],
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


async def in_worker_process(
    root: str, kind: Kind, key: str, check: Check, work: Callable[[bytes], T]
) -> T | Missing | Broken | None:
    """``work(bytes)`` in a worker process, returned only for bytes that verify.

    ``check`` and ``work`` must pickle (module-level functions or ``partial`` of them). None
    when no worker could do it (the caller then does the work here).
    """
    try:
        outcome = await anyio.to_process.run_sync(
            _on_entry, root, kind, key, check, work, cancellable=True
        )
    except (anyio.BrokenWorkerProcess, ImportError, AttributeError, pickle.PickleError):
        return None
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


def _on_entry(
    root: str, kind: Kind, key: str, check: Check, work: Callable[[bytes], Any]
) -> tuple[str, Any]:
    """In the worker: what happened, as plain data the parent can unpickle.

    ``("ok", result)``, ``("raised", exc)``, ``("missing", None)``, ``("broken", detail)`` or
    ``("oserror", (errno, reason))``.
    """
    try:
        fan_fd = open_fanout(root, kind, key)
        try:
            fd = regular_opener(fan_fd)(key, os.O_RDONLY)
        finally:
            os.close(fan_fd)
    except FileNotFoundError:
        return "missing", None  # evicted by another process between lookup and open
    except NotRegularFileError:
        return "broken", "is not a regular file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "broken", "is a symlink; refusing to follow it"
        # Sent as plain data: not every OSError subclass survives pickling.
        return "oserror", (exc.errno, exc.strerror or type(exc).__name__)
    with os.fdopen(fd, "rb", buffering=0) as file:
        data = file.readall()
    gc.disable()  # this process is ours; nothing it builds here holds a cycle
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            checked = pool.submit(check, data)
            try:
                result: tuple[str, Any] = ("ok", work(data))
            except Exception as exc:  # sent back, raised there once the bytes verify
                result = ("raised", exc)
            try:
                checked.result()
            except ValueError as exc:
                return "broken", f"does not verify: {exc}"
        return result
    finally:
        gc.enable()
