"""The harness: where the store lives (``fs``) and which models summarize (``llm``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    # Types only: _summarize reaches the store, and the store reads LocalWorkspace from here.
    from ._store._fileio import FileBackend
    from ._summarize import SummaryModel

__all__ = ["Closable", "Harness", "HarnessLike", "LocalWorkspace", "Workspace"]


class Workspace(Protocol):
    """Anything with a ``workspace_temp_dir()``: the store lives in a directory below it."""

    def workspace_temp_dir(self) -> str | os.PathLike[str]:
        """The directory below which the library keeps its own store directory."""


class HarnessLike(Protocol):
    """What the coroutines need from a harness: a workspace and a summary model (or None)."""

    @property
    def fs(self) -> Workspace:
        """Where the store lives."""

    @property
    def llm(self) -> SummaryModel | None:
        """Which models summarize; None: nothing is summarized (fallback ``no_llm``)."""


@runtime_checkable
class Closable(Protocol):
    """A summary model that holds resources bound to the loop it ran on (e.g. an HTTP client).

    Optional: :mod:`response_compaction.sync` awaits ``aclose()`` on its background loop
    before stopping it, for every model it has run that has one.
    """

    async def aclose(self) -> None:
        """Release what the model holds; called once, on the loop that used it."""


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

    fs: Workspace
    llm: SummaryModel | None = None
