"""Blocking twins of the coroutines, for callers without an event loop.

>>> from response_compaction import sync
>>> compacted = sync.response_compact(harness, response, Exact, Summary, options)
>>> sync.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)

Each call is one line: it runs the coroutine of the same name on one long-lived background
event loop (an anyio blocking portal on asyncio, started on first use). So there is one
implementation, an ``openai.AsyncOpenAI`` client in the harness keeps its connection pool
from call to call, and any number of threads may call at once.

That client is bound to the background loop once it has been used here, and a client cannot
move between event loops: use it either through this module or from your own event loop,
not both. :func:`close` closes every client this module has run and stops the loop; it also
runs at interpreter exit, so a script that never calls it leaves no thread or socket behind.
A later call starts a fresh loop.

Called from a thread that is running an event loop (asyncio or trio), these raise
``RuntimeError``: blocking there would freeze that loop, so await the coroutine instead.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from . import _compact
from ._models import Broken, Compacted, Found, Missing

__all__ = ("close", "response_compact", "response_compaction_read_exact")

T = TypeVar("T")
_lock = threading.Lock()
_portal: BlockingPortal | None = None
_portal_cm: AbstractContextManager[BlockingPortal] | None = None
# Clients bound to the background loop, closed on that loop before it stops.
_clients: weakref.WeakSet[Any] = weakref.WeakSet()
_atexit_registered = False
# Set once the interpreter is exiting: see _run.
_exiting = threading.Event()


def response_compact(
    harness: Any, exact_response: Any, exact_schema: Any, summary_schema: Any, options: Any
) -> Compacted[Any, Any]:
    """Blocking :func:`response_compaction.response_compact`: same arguments, same result."""
    return _run(
        "response_compact",
        harness,
        _compact.response_compact,
        harness,
        exact_response,
        exact_schema,
        summary_schema,
        options,
    )


def response_compaction_read_exact(
    harness: Any, exact_ref: str, exact_schema: Any
) -> Found[Any] | Missing | Broken:
    """Blocking :func:`response_compaction.response_compaction_read_exact`."""
    return _run(
        "response_compaction_read_exact",
        harness,
        _compact.response_compaction_read_exact,
        harness,
        exact_ref,
        exact_schema,
    )


def close() -> None:
    """Close the model clients these functions have used and stop the background loop.

    Calls still in flight in other threads are cancelled (they raise
    ``concurrent.futures.CancelledError``). Runs by itself at interpreter exit, so a daemon
    thread blocked in a call cannot hang the exit; there the call's coroutine is cancelled
    (its cleanup runs) and the waiting thread is left asleep for the interpreter to end.
    Safe to call more than once; the next blocking call starts a new loop.
    """
    global _portal, _portal_cm
    with _lock:
        portal, portal_cm = _portal, _portal_cm
        _portal = _portal_cm = None
        clients = list(_clients)
        _clients.clear()
        if portal is None or portal_cm is None:
            return
        try:
            portal.call(_close_clients, clients)
            portal.call(portal.stop, True)  # cancel calls still in flight in other threads
        finally:
            portal_cm.__exit__(None, None, None)  # joins the loop thread


def _close_at_exit() -> None:
    _exiting.set()
    close()


async def _close_clients(clients: list[Any]) -> None:
    for client in clients:
        try:
            await client.close()
        except Exception:  # noqa: S112 - closing is best effort; one bad client must not stop it
            continue


def _run(name: str, harness: Any, func: Callable[..., Awaitable[T]], *args: Any) -> T:
    future = _portal_for(name, harness).start_task_soon(func, *args)
    try:
        return future.result()
    except BaseException:
        # Ctrl-C (or any exception raised in this thread while waiting) cancels the coroutine
        # too, instead of leaving it running unseen; its own cleanup is shielded.
        future.cancel()
        if _exiting.is_set():
            # The exit hook cancelled this call. Waking a daemon thread to raise and print
            # into an interpreter that is finalizing can abort the process (stderr's lock);
            # stay asleep: the interpreter ends daemon threads where they stand.
            threading.Event().wait()
        raise


def _portal_for(name: str, harness: Any) -> BlockingPortal:
    global _portal, _portal_cm, _atexit_registered
    _refuse_inside_event_loop(name)
    client = getattr(getattr(harness, "llm", None), "client", None)
    with _lock:
        if _portal is None:
            _portal_cm = start_blocking_portal("asyncio", name="response-compaction-sync")
            _portal = _portal_cm.__enter__()
            if not _atexit_registered:
                atexit.register(_close_at_exit)
                _atexit_registered = True
        if client is not None and inspect.iscoroutinefunction(getattr(client, "close", None)):
            _clients.add(client)
        return _portal


def _refuse_inside_event_loop(name: str) -> None:
    try:
        library: str | None = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library is None:
        # sniffio only sees tasks; a plain asyncio callback runs on a loop too.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        library = "asyncio"
    raise RuntimeError(
        f"response_compaction.sync.{name}() was called from a running {library} event loop, "
        f"where blocking would freeze it; use `await response_compaction.{name}(...)` instead"
    )


def _forget_after_fork() -> None:
    # The loop thread does not exist in a forked child: start afresh there.
    global _lock, _portal, _portal_cm, _clients, _exiting
    _lock = threading.Lock()
    _exiting = threading.Event()
    _portal = _portal_cm = None
    _clients = weakref.WeakSet()


os.register_at_fork(after_in_child=_forget_after_fork)
