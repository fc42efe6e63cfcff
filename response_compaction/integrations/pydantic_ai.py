"""Pydantic AI tools that compact large results.

Needs ``pip install 'response-compaction[pydantic-ai]'``.

::

    from pydantic_ai import Agent
    from response_compaction.integrations import Compactor
    from response_compaction.integrations.pydantic_ai import compacted_tool, read_exact_tool

    compactor = Compactor(harness=harness)          # harness and options, once

    @compacted_tool(compactor)
    async def search(query: str) -> dict: ...       # may take RunContext first, as usual

    agent = Agent(model, tools=[search, read_exact_tool(compactor)])

A compacted tool returns :meth:`Compacted.to_agent_text` (bounded, with the ``exact_ref``);
``read_exact`` reads bounded parts back. Every result is compacted on the agent's event loop:
a plain function runs where Pydantic AI runs it (a worker thread, with its timeout), a
coroutine function on the loop.
Pydantic models returned by a tool are retained as their JSON data (by alias).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from ._core import Compactor, is_async

if TYPE_CHECKING:
    from pydantic_ai import Tool

__all__ = ["compacted_tool", "read_exact_tool"]


def _tool_class() -> Any:
    try:
        from pydantic_ai import Tool
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "this adapter needs Pydantic AI: pip install 'response-compaction[pydantic-ai]'",
            name="pydantic_ai",
        ) from exc
    return Tool


@overload
def compacted_tool(
    compactor: Compactor, func: None = None, **tool_options: Any
) -> Callable[[Callable[..., Any]], Tool[Any]]: ...
@overload
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any], **tool_options: Any
) -> Tool[Any]: ...
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any] | None = None, **tool_options: Any
) -> Tool[Any] | Callable[[Callable[..., Any]], Tool[Any]]:
    """A ``pydantic_ai.Tool`` over ``func``, its result compacted by ``compactor``.

    Use as ``@compacted_tool(compactor)`` or ``compacted_tool(compactor, func)``; other keyword
    arguments go to ``Tool`` (``name``, ``description``, ``max_retries``, ...).
    """
    tool_class = _tool_class()

    def build(tool: Callable[..., Any]) -> Tool[Any]:
        # A plain function stays one, so Pydantic AI runs it under its own thread rules (a
        # tool timeout, disable_threads): it returns the compaction's coroutine, which Pydantic
        # AI awaits on the agent's loop.
        wrapped = compactor.wrap(tool) if is_async(tool) else compactor.wrap_deferred(tool)
        built: Tool[Any] = tool_class(wrapped, **tool_options)
        return built

    return build if func is None else build(func)


def read_exact_tool(compactor: Compactor, **tool_options: Any) -> Tool[Any]:
    """The read-back ``Tool`` (named ``compactor.read_tool``): bounded parts by pointer."""
    built: Tool[Any] = _tool_class()(compactor.read_function(), takes_ctx=False, **tool_options)
    return built
