"""Module locks made again in a forked child.

A child has only the thread that forked: a lock another thread held at the fork stays held
there forever, and the child's next call that takes it waits for good.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["new_lock_in_child"]


def new_lock_in_child(namespace: dict[str, Any], name: str) -> None:
    """In every forked child, bind ``namespace[name]`` (a module's ``globals()``) anew."""
    os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, threading.Lock()))
