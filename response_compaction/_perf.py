"""Process-wide performance switches: pausing the host process's cyclic GC during big decodes."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused_gc"]

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


def _forget_pauses_in_child() -> None:
    """A forked child has none of the threads that paused: their pause ends with the fork."""
    global _lock, _pauses
    _lock = threading.Lock()  # it may have been held by a thread that does not exist here
    if _pauses:
        _pauses = 0
        if _was_enabled:
            gc.enable()


os.register_at_fork(after_in_child=_forget_pauses_in_child)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the process-wide cyclic GC; nested and concurrent uses share one pause.

    A full collection over a freshly decoded tree can cost more than the decode itself (4.4 s
    against 1.3 s for 89 MB). Decoded values hold no cycles, so nothing is lost by waiting.
    When the pause ends, everything allocated meanwhile is moved to the oldest generation
    (``gc.freeze`` then ``gc.unfreeze``, constant time) instead of being walked by the next
    young collection, which took 213 ms for 90 MB of rows right after the read returned. It is
    scanned at the process's next ordinary full collection.
    """
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.freeze()
                gc.unfreeze()
                gc.enable()
