"""The exceptions this library raises.

Each one subclasses the builtin whose meaning it carries, so ``except OSError`` and
``except ValueError`` keep working for callers who never import these names::

    OSError
     └── StoreError                  the exact value could not be retained or read
          └── UnsafeStoreError       the store's root is not safe to use (symlink, owner, mode)
    ValueError
     └── SchemaError                 a summary schema strict structured output cannot express

Bad options and exact values that do not validate raise plain ``ValueError``; an unknown
ladder raises plain ``LookupError``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Literal

__all__ = [
    "HIDDEN_CONTEXT_DROPPED",
    "SchemaError",
    "StoreError",
    "UnsafeStoreError",
    "drop_hidden_context",
    "map_errors",
]


class StoreError(OSError):
    """The exact value could not be retained; nothing half-written is visible."""


class UnsafeStoreError(StoreError):
    """The store directory is a symlink, owned by someone else, or writable by others."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return f"{self.args[0]}: {self.path}"


class SchemaError(ValueError):
    """The summary schema cannot be expressed as a strict JSON schema."""


@contextlib.contextmanager
def map_errors(action: str) -> Iterator[None]:
    """At an I/O edge: ``OSError`` and sqlite's errors leave as :class:`StoreError`.

    ``action`` says what failed and where (a kind, a path); the message adds the error's type
    or the OS's reason, never a value. A :class:`StoreError` passes through unchanged.
    """
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(exc.errno, f"{action}: {exc.strerror or type(exc).__name__}") from exc
    except sqlite3.Error as exc:
        raise StoreError(f"{action}: {type(exc).__name__}: {exc}") from exc


def drop_hidden_context(exc: BaseException) -> None:
    """Unlink, down ``exc``'s chain, every context a ``raise ... from None`` only hid.

    ``from None`` keeps the exception it replaces as ``__context__`` (only marked suppressed):
    a msgspec or pydantic error quoting the response, a ``UnicodeEncodeError`` holding its
    text, stayed reachable from the content-free error that replaced it.
    """
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.__suppress_context__:
            node.__context__ = None
        stack.extend(e for e in (node.__cause__, node.__context__) if e is not None)
        if isinstance(node, BaseExceptionGroup):
            stack.extend(node.exceptions)


class _HiddenContextDropped:
    """``with HIDDEN_CONTEXT_DROPPED:`` around a public call: :func:`drop_hidden_context`."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> Literal[False]:
        if exc is not None:
            drop_hidden_context(exc)
        return False


HIDDEN_CONTEXT_DROPPED = _HiddenContextDropped()
