"""Blocking twins of the coroutines, for callers without an event loop.

>>> from response_compaction import sync
>>> compacted = sync.response_compact(harness, response, Exact, Summary, options)
>>> sync.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
>>> sync.response_compaction_read_part(harness, compacted.receipt.exact_ref, pointer="/rows")

Each call is one line: it runs the coroutine of the same name on one long-lived background
event loop (an anyio blocking portal on asyncio, started on first use). So there is one
implementation, an ``openai.AsyncOpenAI`` client in the harness keeps its connection pool
from call to call, and any number of threads may call at once.

That client is bound to the background loop once it has been used here, and a client cannot
move between event loops: use it either through this module or from your own event loop,
not both. :func:`close` closes every model this module has run that has an ``aclose()``
(``OpenAICatalog`` closes its client) and stops the loop; it also runs at interpreter exit, so
a script that never calls it leaves no thread or socket behind. A later call starts a fresh
loop; one whose harness holds a model so closed raises ``RuntimeError`` (its summaries would
all fail): give it a new model.

Called from a thread that is running an event loop (asyncio or trio), these raise
``RuntimeError``: blocking there would freeze that loop, so await the coroutine instead.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from contextlib import ExitStack
from typing import Any, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal

from . import _compact, _read
from ._harness import Closable, HarnessLike
from ._models import Broken, Compacted, CompactionOptions, Found, Missing
from ._part import Part

__all__ = (
    "close",
    "response_compact",
    "response_compaction_read_exact",
    "response_compaction_read_part",
)

E = TypeVar("E")
S = TypeVar("S")
T = TypeVar("T")


@overload
def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: type[E],
    summary_schema: type[S],
    options: CompactionOptions[S] | Mapping[str, Any],
) -> Compacted[E, S]: ...
@overload
def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: object,
    summary_schema: object,
    options: CompactionOptions[Any] | Mapping[str, Any],
) -> Compacted[Any, Any]: ...
def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: object,
    summary_schema: object,
    options: CompactionOptions[Any] | Mapping[str, Any],
) -> Compacted[Any, Any]:
    """Blocking :func:`response_compaction.response_compact`: same arguments, same result."""
    return _loop.call(
        "response_compact",
        harness,
        _compact.response_compact,
        harness,
        exact_response,
        exact_schema,
        summary_schema,
        options,
    )


@overload
def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: type[E]
) -> Found[E] | Missing | Broken: ...
@overload
def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: object
) -> Found[Any] | Missing | Broken: ...
def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: object
) -> Found[Any] | Missing | Broken:
    """Blocking :func:`response_compaction.response_compaction_read_exact`."""
    return _loop.call(
        "response_compaction_read_exact",
        harness,
        _compact.response_compaction_read_exact,
        harness,
        exact_ref,
        exact_schema,
    )


def response_compaction_read_part(
    harness: HarnessLike,
    exact_ref: str,
    *,
    pointer: str = "",
    start: int | None = None,
    stop: int | None = None,
    max_bytes: int = 65536,
) -> Found[Part] | Missing | Broken:
    """Blocking :func:`response_compaction.response_compaction_read_part`."""
    read = functools.partial(
        _read.response_compaction_read_part,
        pointer=pointer,
        start=start,
        stop=stop,
        max_bytes=max_bytes,
    )
    return _loop.call("response_compaction_read_part", harness, read, harness, exact_ref)


def close() -> None:
    """Close the models these functions have run (their ``aclose()``) and stop the loop.

    Calls still in flight in other threads are cancelled (they raise
    ``concurrent.futures.CancelledError``). Runs by itself at interpreter exit, so a daemon
    thread blocked in a call cannot hang the exit; there the call's coroutine is cancelled
    (its cleanup runs) and the waiting thread is not woken (see ``_BackgroundLoop.call``).
    Safe to call more than once; the next blocking call starts a new loop, and raises
    ``RuntimeError`` if its harness holds a model closed here.
    """
    _loop.close()


class _Escaped:
    """A ``BaseException`` from a coroutine (not the loop's cancellation), carried to its caller.

    ``KeyboardInterrupt``, ``SystemExit`` or a model's own. Left to propagate on the background
    loop, it would stop the loop for every caller and every later call ("This portal is not
    running"); it belongs to the calling thread.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _contained(func: Callable[..., Awaitable[T]], *args: Any) -> T | _Escaped:
    try:
        return await func(*args)
    except anyio.get_cancelled_exc_class():
        raise  # the portal's own cancellation (close(), a caller's Ctrl-C)
    except Exception:
        raise  # the future carries it to the caller
    except BaseException as error:  # a model's own BaseException stopped the loop for good
        return _Escaped(error)  # a group holding a cancellation too: raised, it stopped it


class _BackgroundLoop:
    """One event loop on its own thread, started on first use; ``close()`` stops it.

    Its lifecycle is one ``ExitStack``: entering starts the portal's thread; unwinding closes
    the models run on it, cancels calls still in flight, and joins the thread.
    """

    def __init__(self, backend: str = "asyncio") -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._stack: ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        # Models bound to this loop, closed on it before it stops; and those closed so.
        self._models = _Models()
        self._closed = _Models()
        self._exiting = threading.Event()
        self._atexit_registered = False

    def call(
        self, name: str, harness: HarnessLike, func: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """Run ``func(*args)`` on the loop and wait for it in this thread."""
        _refuse_inside_event_loop(name)
        future: Future[T | _Escaped]
        portal = self._portal_for(harness)
        try:
            future = portal.start_task_soon(_contained, func, *args)
        except RuntimeError:  # "This portal is not running": its loop ended without close()
            self._forget(portal)
            future = self._portal_for(harness).start_task_soon(_contained, func, *args)
        try:
            result = future.result()
        except BaseException:
            # Ctrl-C (or any exception raised in this thread while waiting) cancels the
            # coroutine too, instead of leaving it running unseen; its own cleanup is shielded.
            future.cancel()
            if self._exiting.is_set():
                # The exit hook cancelled this call. Waking a daemon thread to raise and print
                # into an interpreter that is finalizing can abort the process (stderr's
                # lock); this thread stays asleep and the interpreter ends it where it stands.
                threading.Event().wait()
            raise
        if isinstance(result, _Escaped):
            raise result.error
        return result

    def close(self) -> None:
        """Close the models, cancel calls in flight, stop the loop and join its thread."""
        with self._lock:
            if self._thread is not None and not self._thread.is_alive():
                self._dropped()
            stack, self._stack, self._portal = self._stack, None, None
            thread, self._thread = self._thread, None
        if stack is not None and thread is not None and thread.is_alive():
            try:
                stack.close()
            except RuntimeError as error:  # its loop ended by itself, its thread still ending
                if "portal is not running" not in str(error):
                    raise

    def close_at_exit(self) -> None:
        """:meth:`close`, for ``atexit``: calls still waiting are cancelled but not woken."""
        self._exiting.set()
        self.close()

    def forget_after_fork(self) -> None:
        """In a forked child the loop thread does not exist: start afresh there."""
        self._lock = threading.Lock()
        self._exiting = threading.Event()
        self._stack = self._portal = self._thread = None
        self._models = _Models()
        self._closed = _Models()

    def _portal_for(self, harness: HarnessLike) -> BlockingPortal:
        model = getattr(harness, "llm", None)
        with self._lock:
            if isinstance(model, Closable) and model in self._closed:
                # Run, it would fail every summary into the fallback, with no word of why.
                raise RuntimeError(
                    "this harness's model was closed by response_compaction.sync.close() (or"
                    " its background loop ended); give the harness a new one"
                )
            if self._thread is not None and not self._thread.is_alive():
                self._dropped()
            if self._portal is None:
                self._portal = self._start()
                if not self._atexit_registered:
                    # On first use, not at import: atexit runs last-registered first, so a
                    # caller's own exit hooks registered before this see the loop stopped.
                    atexit.register(self.close_at_exit)
                    self._atexit_registered = True
            if isinstance(model, Closable):
                self._models.add(model)
            return self._portal

    def _forget(self, portal: BlockingPortal) -> None:
        """Drop ``portal`` if it is still the current one (it stopped answering)."""
        with self._lock:
            if self._portal is portal:
                self._dropped()

    def _dropped(self) -> None:
        """Forget a loop that ended without close() (under the lock), and its models.

        Unwinding it would call its portal, which answers nothing again; its models (an HTTP
        client bound to it) would fail every summary silently: they count as closed.
        """
        for model in self._models.take():
            self._closed.add(model)
        self._stack = self._portal = self._thread = None

    def _start(self) -> BlockingPortal:
        portal, thread = _portal_thread(self._backend)
        stack = ExitStack()
        # Unwound in reverse: close the models on the loop, then cancel what is still in
        # flight and stop the loop, then join its thread.
        stack.callback(thread.join)
        stack.callback(portal.call, portal.stop, True)
        # This loop's own models: a call racing close() may start the next loop (and bind
        # its model to it) before this one closes its models.
        self._models = _Models()
        stack.callback(self._close_models, portal, self._models)
        self._stack, self._thread = stack, thread
        return portal

    def _close_models(self, portal: BlockingPortal, bound: _Models) -> None:
        models = bound.take()
        with self._lock:
            for model in models:
                self._closed.add(model)
        portal.call(_aclose_all, models)


class _Models:
    """Models by identity (not equality: two equal clients are two clients), held weakly."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Closable]] = {}

    def add(self, model: Closable) -> None:
        key = id(model)
        # One that cannot be weakly referenced is left for its owner to close.
        with contextlib.suppress(TypeError):
            self._refs[key] = weakref.ref(model, lambda _: self._refs.pop(key, None))

    def __contains__(self, model: object) -> bool:
        ref = self._refs.get(id(model))
        return ref is not None and ref() is model

    def take(self) -> list[Closable]:
        """Every model still alive, removed from here."""
        refs, self._refs = self._refs, {}
        return [model for ref in refs.values() if (model := ref()) is not None]


def _portal_thread(backend: str) -> tuple[BlockingPortal, threading.Thread]:
    """A blocking portal on a new daemon thread's event loop, and that thread.

    What anyio's ``start_blocking_portal`` does, without its context manager: that one's
    generator, dropped in a forked child (``forget_after_fork``), was finalized there and
    waited for the parent's loop thread, which the child does not have: the child hung.
    """
    ready: Future[BlockingPortal] = Future()

    async def serve() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve, backend=backend)
        except BaseException as exc:  # handed to the thread that waits for the portal
            if not ready.done():
                ready.set_exception(exc)

    thread = threading.Thread(target=run, name="response-compaction-sync", daemon=True)
    thread.start()
    return ready.result(), thread


#: How long one model's ``aclose()`` may take: ``close()`` also runs at interpreter exit,
#: which a hung close (an HTTP client waiting on a dead peer) would otherwise hold forever.
ACLOSE_SECONDS = 5.0


async def _aclose_all(models: list[Closable]) -> None:
    for model in models:
        try:
            with anyio.move_on_after(ACLOSE_SECONDS):
                await model.aclose()
        except Exception:  # noqa: S112 - closing is best effort; one bad model must not stop it
            continue


def _refuse_inside_event_loop(name: str) -> None:
    library = _loop_in_this_thread()
    if library is None:
        return
    raise RuntimeError(
        f"response_compaction.sync.{name}() was called from a running {library} event loop, "
        f"where blocking would freeze it; use `await response_compaction.{name}(...)` instead"
    )


_loop = _BackgroundLoop()
os.register_at_fork(after_in_child=_loop.forget_after_fork)


def _loop_in_this_thread() -> str | None:
    """The event loop running in the calling thread, if any.

    Not ``sniffio``: threads started with ``asyncio.to_thread`` or ``run_in_executor`` copy the
    caller's context, and with it sniffio's "asyncio" marker, into a thread that may block.
    """
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()  # also true in a plain loop callback, which sniffio misses
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        with contextlib.suppress(RuntimeError):
            trio.lowlevel.current_task()
            return "trio"
    return None
