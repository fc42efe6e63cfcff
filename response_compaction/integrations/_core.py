"""What every framework adapter shares: the compacting wrapper and the read-back function.

Pure glue over the two public coroutines (:func:`response_compact` and
:func:`response_compaction_read_part`); the framework modules only turn these plain functions
into their own tool types.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import msgspec

from .. import sync
from .._compact import response_compact, response_compaction_read_exact
from .._encoding import line_safe
from .._models import Found
from .._part import MIN_MAX_BYTES
from .._pydantic import plain_hook, pydantic_plain
from .._read import response_compaction_read_part
from .._refusals import decoded_or_text
from ..mcp import echoed_bytes, read_result_as_dict, read_tool_function

__all__ = ["READ_EXACT_DESCRIPTION", "AgentSummary", "Compactor", "is_async"]

READ_EXACT_DESCRIPTION = (
    "Read back part of the exact JSON value behind an exact_ref (from a compacted tool "
    "result). pointer: RFC 6901 path into the value ('' = the whole value, '/rows/0' = the "
    "first row); start/stop: a window of array items, object members or string characters; "
    "max_bytes: the most JSON to return. The answer is JSON: state 'found' with a part (value, "
    "complete, total_items, next_start: call again with start=next_start for more); "
    "'missing' when it expired; 'broken' or 'error' with a detail."
)
#: Room kept in a read-back reply for everything but the part's value and the echoed pointer.
_REPLY_OVERHEAD = 320
log = logging.getLogger("response_compaction")


class AgentSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The summary schema used unless the :class:`Compactor` is given another."""

    overview: str
    critical_facts: list[str]


_FALLBACK = AgentSummary(
    overview="The tool result was too large to show; it is kept exactly. Read it by exact_ref.",
    critical_facts=[],
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Compactor:
    """The harness and compaction options, given once for every tool of an agent.

    ``options`` is a :class:`~response_compaction.CompactionOptions` or a mapping; left out,
    results above 32000 bytes get the :class:`AgentSummary` fallback with the ``default``
    ladder. ``text_bytes`` bounds the text a tool returns to the model; ``max_bytes`` caps
    every read-back. ``read_tool`` is the read-back tool's name, which the text tells the
    model to call.
    """

    harness: Any
    options: Any = field(default_factory=lambda: {"fallback": _FALLBACK, "ladder": "default"})
    exact_schema: Any = Any
    summary_schema: Any = AgentSummary
    read_tool: str = "read_exact"
    text_bytes: int = 16000
    max_bytes: int = 65536

    async def compact(self, result: Any) -> str:
        """Retain ``result`` exactly and return the bounded text for the model."""
        compacted = await response_compact(
            self.harness, _exact(result), self.exact_schema, self.summary_schema, self.options
        )
        return compacted.to_agent_text(read_tool=self.read_tool, max_bytes=self.text_bytes)

    def compact_sync(self, result: Any) -> str:
        """:meth:`compact` for tools a framework runs in worker threads (no event loop)."""
        compacted = sync.response_compact(
            self.harness,
            _exact(result),
            self.exact_schema,
            self.summary_schema,
            self.options,
        )
        return compacted.to_agent_text(read_tool=self.read_tool, max_bytes=self.text_bytes)

    def wrap(self, tool: Callable[..., Any], *, artifact: bool = False) -> Callable[..., Any]:
        """``tool`` as a coroutine function (its signature and docstring) returning the text.

        A plain function runs in a worker thread (abandoned on cancellation, as
        ``asyncio.to_thread`` does, so a framework's tool timeout still ends the call) and the
        compaction, as for a coroutine function, on the caller's event loop: a model client is
        bound to the loop it ran on, and the blocking facade's would be a second one (an
        agent with tools of both kinds got the fallback, ``error``, for every sync tool's
        result). What the function returns is awaited first if it is awaitable (a plain
        decorator around a coroutine function). With ``artifact``, ``tool`` returns
        ``(content, artifact)``: the content is compacted, the artifact passed on as it came.
        """
        call = tool if is_async(tool) else _in_thread(tool)

        @functools.wraps(tool)
        async def run(*args: Any, **kwargs: Any) -> Any:
            return await self._compacted(await call(*args, **kwargs), artifact)

        return _returning_text(run, tool, artifact)

    def wrap_deferred(self, tool: Callable[..., Any]) -> Callable[..., Any]:
        """``tool``, a plain function, returning the coroutine of its result's compaction.

        For frameworks that run a plain function under their own thread rules (timeouts, no
        threads at all) and then await what it returned on their loop (Pydantic AI).
        """

        @functools.wraps(tool)
        def run(*args: Any, **kwargs: Any) -> Any:
            return self._compacted(tool(*args, **kwargs), artifact=False)

        return _returning_text(run, tool, artifact=False)

    async def _compacted(self, result: Any, artifact: bool) -> Any:
        if inspect.isawaitable(result):
            result = await result
        if artifact:
            content, extra = result
            return await self.compact(content), extra
        return await self.compact(result)

    def wrap_sync(self, tool: Callable[..., Any], *, artifact: bool = False) -> Callable[..., Any]:
        """``tool``, a plain function, compacting through the blocking facade.

        For frameworks that call a tool where no event loop runs (a LangChain ``invoke``).
        """

        @functools.wraps(tool)
        def run(*args: Any, **kwargs: Any) -> Any:
            result = tool(*args, **kwargs)
            if artifact:
                content, extra = result
                return self.compact_sync(content), extra
            return self.compact_sync(result)

        return _returning_text(run, tool, artifact)

    async def read(
        self,
        exact_ref: str,
        pointer: str = "",
        start: int | None = None,
        stop: int | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """The read-back tool's body: a bounded part as JSON text, never more than the cap.

        An ``exact_schema`` other than ``Any`` is checked against the whole value first (as the
        MCP tool and the CLI do): content that no longer fits it reads as broken.
        """
        try:
            window = self._window(pointer, start, stop, max_bytes)
            if self.exact_schema is not Any:
                checked = await response_compaction_read_exact(
                    self.harness, exact_ref, self.exact_schema
                )
                if not isinstance(checked, Found):
                    return _json(read_result_as_dict(checked))
            result = await response_compaction_read_part(self.harness, exact_ref, **window)
        except (LookupError, ValueError) as exc:  # content-free by contract
            return _json({"state": "error", "detail": str(exc)})
        return _json(read_result_as_dict(result))

    def read_sync(
        self,
        exact_ref: str,
        pointer: str = "",
        start: int | None = None,
        stop: int | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """:meth:`read` for a worker thread, run on the blocking facade's loop."""
        return sync._loop.call(
            "response_compaction_read_part",
            self.harness,
            self.read,
            exact_ref,
            pointer,
            start,
            stop,
            max_bytes,
        )

    def _window(
        self, pointer: str, start: int | None, stop: int | None, max_bytes: int | None
    ) -> dict[str, Any]:
        # The reply echoes the pointer beside the part and its fields: all of it fits the cap.
        room = self.max_bytes - _REPLY_OVERHEAD - echoed_bytes(pointer)
        if room < MIN_MAX_BYTES:
            raise ValueError("this tool's reply cap (max_bytes) is too small for this pointer")
        cap: Any = room if max_bytes is None else max_bytes  # not an int: read_part says so
        if type(max_bytes) is int:
            cap = max(MIN_MAX_BYTES, min(max_bytes, room))
        return {"pointer": pointer, "start": start, "stop": stop, "max_bytes": cap}

    def read_function(self) -> Callable[..., Any]:
        """:meth:`read` as a coroutine function named ``read_tool``, documented for a model."""
        read_exact = read_tool_function(self.read)
        read_exact.__annotations__["return"] = str
        read_exact.__name__ = read_exact.__qualname__ = self.read_tool
        read_exact.__doc__ = READ_EXACT_DESCRIPTION
        return read_exact


def is_async(tool: Callable[..., Any]) -> bool:
    """Whether ``tool`` is a coroutine function, or an object whose ``__call__`` is one.

    Not a plain function that only wraps one (``functools.wraps``): it may run the coroutine
    itself (``asyncio.run``), which must not happen on the loop. It runs in a thread, and
    what it returns, if awaitable, is awaited back on the loop.
    """
    call = type(tool).__call__ if not inspect.isroutine(tool) else None
    return inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(call)


def _in_thread(tool: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        # Boxed: trio refuses a thread's function whose result is a coroutine.
        boxed = await anyio.to_thread.run_sync(
            lambda: (tool(*args, **kwargs),), abandon_on_cancel=True
        )
        return boxed[0]

    return call


def _returning_text(
    wrapper: Callable[..., Any], tool: Callable[..., Any], artifact: bool
) -> Callable[..., Any]:
    # wraps() shares the annotations dict: give the wrapper its own, returning text.
    returns = tuple[str, Any] if artifact else str
    wrapper.__annotations__ = {**getattr(tool, "__annotations__", {}), "return": returns}
    return wrapper


def _exact(result: Any) -> Any:
    # Tools often return JSON as a string: retain the value it holds, else the string itself.
    if isinstance(result, bytearray | memoryview):
        result = bytes(result)  # as bytes: not a base64 string of them
    if isinstance(result, bytes):
        try:
            result = result.decode()
        except UnicodeDecodeError:
            # JSON holds text only: what is retained is not these bytes, and the log says so.
            log.warning("a tool returned %d bytes that are not UTF-8: retained as text with"
                        " U+FFFD in place of each invalid sequence", len(result))  # fmt: skip
            result = result.decode("utf-8", "replace")
    if isinstance(result, str):
        return decoded_or_text(result)
    if _holds_models(result):  # list[Model] or dict[str, Model]: a common tool's return
        return msgspec.to_builtins(result, enc_hook=plain_hook)
    return pydantic_plain(result)


def _holds_models(result: Any) -> bool:
    """Whether ``result`` is a list, tuple or dict with a pydantic model among its items.

    Only one level down (the item types are gathered in C): deeper models are refused by the
    encoder, as any object it cannot write.
    """
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(result, list | tuple | dict):
        return False
    items = result.values() if isinstance(result, dict) else result
    return any(issubclass(kind, pydantic.BaseModel) for kind in set(map(type, items)))


def _json(value: Any) -> str:
    # One line: a value's U+2028 could pass for a line break in the agent's tool result.
    return line_safe(msgspec.json.encode(value)).decode()
