"""OpenAI Agents SDK tools that compact large results.

Needs ``pip install 'response-compaction[openai-agents]'``.

::

    from agents import Agent
    from response_compaction.integrations import Compactor
    from response_compaction.integrations.openai_agents import compacted_tool, read_exact_tool

    compactor = Compactor(harness=harness)          # harness and options, once

    @compacted_tool(compactor)
    async def search(query: str) -> dict: ...       # may return 20 MB

    agent = Agent(name="a", tools=[search, read_exact_tool(compactor)])

A compacted tool returns :meth:`Compacted.to_agent_text` (bounded, with the ``exact_ref``);
``read_exact`` reads bounded parts back. Every result is compacted on the SDK's event loop:
a plain function runs in a worker thread, a coroutine function on the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from ._core import Compactor

if TYPE_CHECKING:
    from agents import FunctionTool

__all__ = ["compacted_tool", "read_exact_tool"]


def _agents() -> Any:
    try:
        import agents
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "this adapter needs the OpenAI Agents SDK: "
            "pip install 'response-compaction[openai-agents]'",
            name="agents",
        ) from exc
    return agents


@overload
def compacted_tool(
    compactor: Compactor, func: None = None, **function_tool_options: Any
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
@overload
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any], **function_tool_options: Any
) -> FunctionTool: ...
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any] | None = None, **function_tool_options: Any
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """``agents.function_tool`` over ``func``, its result compacted by ``compactor``.

    Use as ``@compacted_tool(compactor)`` or ``compacted_tool(compactor, func)``; other keyword
    arguments go to ``function_tool`` (``name_override``, ``description_override``, ...).
    """
    function_tool = _agents().function_tool

    def build(tool: Callable[..., Any]) -> FunctionTool:
        built: FunctionTool = function_tool(compactor.wrap(tool), **function_tool_options)
        return built

    return build if func is None else build(func)


def read_exact_tool(compactor: Compactor, **function_tool_options: Any) -> FunctionTool:
    """The read-back ``FunctionTool`` (named ``compactor.read_tool``): bounded parts by pointer."""
    built: FunctionTool = _agents().function_tool(
        compactor.read_function(), **function_tool_options
    )
    return built
