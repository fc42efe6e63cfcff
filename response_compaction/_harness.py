"""The harness: where the store lives (``fs``) and which models summarize (``llm``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._store._fileio import FileBackend

__all__ = ["Harness", "LocalWorkspace", "Workspace"]


class Workspace(Protocol):
    """Anything with a ``workspace_temp_dir()``: the store lives in a directory below it."""

    def workspace_temp_dir(self) -> str | os.PathLike[str]:
        """The directory below which the library keeps its own store directory."""


class LocalWorkspace:
    """A workspace on the local filesystem.

    ``clock`` (seconds since the epoch) is what TTL and LRU are measured with; tests inject a
    fake one. It defaults to ``time.time``. ``file_backend`` is how the store's bytes reach the
    disk; it defaults to the running event loop's, and tests inject faults through it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] | None = None,
        file_backend: FileBackend | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        self.file_backend = file_backend

    def workspace_temp_dir(self) -> str:
        """The workspace directory itself (created 0700 on first use)."""
        return self.path

    def __repr__(self) -> str:
        return f"LocalWorkspace({self.path!r})"


@dataclass(frozen=True, slots=True)
class Harness:
    """``fs`` is a workspace; ``llm`` a summary model catalog such as ``OpenAICatalog``, or None.

    Any object with ``.fs`` and ``.llm`` attributes is accepted wherever a Harness is.
    """

    fs: Any
    llm: Any = None
