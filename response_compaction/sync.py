"""Blocking twins of the coroutines, for callers without an event loop.

Every call runs the coroutine on one long-lived background event loop (an anyio blocking
portal on asyncio), so an ``openai.AsyncOpenAI`` client in the harness keeps its connection
pool across calls, and calls from several threads at once are fine. The loop thread stops at
interpreter exit. Called from a thread that is running an event loop, these raise
``RuntimeError``: await the coroutine instead.
"""

from __future__ import annotations

import atexit
import threading
from contextlib import AbstractContextManager
from typing import Any

import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from . import _compact
from ._models import Broken, Compacted, Found, Missing

__all__ = ["response_compact", "response_compaction_read_exact"]

_lock = threading.Lock()
_portal: BlockingPortal | None = None
_portal_cm: AbstractContextManager[BlockingPortal] | None = None


def _get_portal(name: str) -> BlockingPortal:
    global _portal, _portal_cm
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        pass
    else:
        raise RuntimeError(
            f"response_compaction.sync.{name} was called from a running {library} event loop; "
            f"await response_compaction.{name}(...) instead"
        )
    with _lock:
        if _portal is None:
            _portal_cm = start_blocking_portal("asyncio")
            _portal = _portal_cm.__enter__()
            atexit.register(_stop)
        return _portal


def _stop() -> None:
    global _portal, _portal_cm
    with _lock:
        if _portal_cm is not None:
            _portal_cm.__exit__(None, None, None)
        _portal = _portal_cm = None


def response_compact(
    harness: Any, exact_response: Any, exact_schema: Any, summary_schema: Any, options: Any
) -> Compacted[Any, Any]:
    """Blocking :func:`response_compaction.response_compact`."""
    return _get_portal("response_compact").call(
        _compact.response_compact, harness, exact_response, exact_schema, summary_schema, options
    )


def response_compaction_read_exact(
    harness: Any, exact_ref: str, exact_schema: Any
) -> Found[Any] | Missing | Broken:
    """Blocking :func:`response_compaction.response_compaction_read_exact`."""
    result: Found[Any] | Missing | Broken = _get_portal("response_compaction_read_exact").call(
        _compact.response_compaction_read_exact, harness, exact_ref, exact_schema
    )
    return result
