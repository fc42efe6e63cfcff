"""LangChain v1 tools and agent middleware that compact large results.

Needs ``pip install 'response-compaction[langchain]'`` (``langchain-core`` for the tools,
``langchain`` for the middleware). Either wrap chosen tools::

    from response_compaction.integrations import Compactor
    from response_compaction.integrations.langchain import compacted_tool, read_exact_tool

    compactor = Compactor(harness=harness)          # harness and options, once

    @compacted_tool(compactor)
    async def search(query: str) -> dict:
        \"\"\"Search the records.\"\"\"

    agent = create_agent(model, tools=[search, read_exact_tool(compactor)])

or compact every tool's large result with one middleware, which also adds ``read_exact``::

    agent = create_agent(model, tools=[search], middleware=[CompactionMiddleware(compactor)])

A compacted result is :meth:`Compacted.to_agent_text` (bounded, with the ``exact_ref``).
Async agents (``ainvoke``) compact on their loop (a plain function runs in a worker thread,
its result compacted back on the loop); sync agents (``invoke``) compact through the
blocking facade.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any, overload

import msgspec

from .._options import resolve_options
from ._core import READ_EXACT_DESCRIPTION, Compactor, is_async

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool, Tool, tool
except ModuleNotFoundError as exc:  # pragma: no cover - exercised by the missing-extra test
    raise ModuleNotFoundError(
        "this adapter needs LangChain: pip install 'response-compaction[langchain]'",
        name="langchain_core",
    ) from exc

__all__ = ["CompactionMiddleware", "compacted_tool", "read_exact_tool"]


@overload
def compacted_tool(
    compactor: Compactor, func: None = None, **tool_options: Any
) -> Callable[[Callable[..., Any]], BaseTool]: ...
@overload
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any], **tool_options: Any
) -> BaseTool: ...
def compacted_tool(
    compactor: Compactor, func: Callable[..., Any] | None = None, **tool_options: Any
) -> BaseTool | Callable[[Callable[..., Any]], BaseTool]:
    """``langchain_core.tools.tool`` over ``func``, its result compacted by ``compactor``.

    Use as ``@compacted_tool(compactor)`` or ``compacted_tool(compactor, func)``; other keyword
    arguments go to ``tool`` (``description``, ``parse_docstring``, ...). With
    ``response_format="content_and_artifact"`` the content of the ``(content, artifact)`` a
    tool returns is compacted and the artifact, which LangChain keeps from the model, passed
    on as it came.
    """
    artifact = tool_options.get("response_format") == "content_and_artifact"

    def build(fn: Callable[..., Any]) -> BaseTool:
        if is_async(fn):
            built: BaseTool = tool(compactor.wrap(fn, artifact=artifact), **tool_options)
            return built
        # Both: a sync agent (invoke) calls func, an async one (ainvoke) the coroutine, which
        # runs the function in a thread and compacts on the agent's own loop. Built by tool()
        # like a coroutine function's, so both take the same options.
        built = tool(compactor.wrap_sync(fn, artifact=artifact), **tool_options)
        if isinstance(built, StructuredTool | Tool):  # Tool: with infer_schema=False
            built.coroutine = compactor.wrap(fn, artifact=artifact)
        return built

    return build if func is None else build(func)


def read_exact_tool(compactor: Compactor) -> BaseTool:
    """The read-back tool (named ``compactor.read_tool``), for sync and async agents."""
    return StructuredTool.from_function(
        func=compactor.read_sync,
        coroutine=compactor.read_function(),
        name=compactor.read_tool,
        description=READ_EXACT_DESCRIPTION,
    )


def _middleware_base() -> type:
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "CompactionMiddleware needs langchain (v1): "
            "pip install 'response-compaction[langchain]'",
            name="langchain",
        ) from exc
    base: type = AgentMiddleware
    return base


class CompactionMiddleware(_middleware_base()):  # type: ignore[misc]
    """Agent middleware: compacts every tool result above the threshold; adds ``read_exact``.

    ``only`` limits it to the named tools. Error results and results at or under the
    options' ``summarize_above_bytes`` pass through unchanged.
    """

    def __init__(self, compactor: Compactor, *, only: Collection[str] | None = None) -> None:
        super().__init__()
        self.compactor = compactor
        self.only = None if only is None else frozenset(only)
        self.tools = [read_exact_tool(compactor)]
        opts = resolve_options(compactor.options, compactor.summary_schema)
        self._above = opts.summarize_above_bytes

    def _wants(self, request: Any, result: Any) -> bool:
        name = request.tool_call["name"]
        return (
            isinstance(result, ToolMessage)
            and result.status != "error"
            and name != self.compactor.read_tool
            and (self.only is None or name in self.only)
            and _content_bytes(result.content) > self._above
        )

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the tool; compact a large result through the blocking facade."""
        result = handler(request)
        if not self._wants(request, result):
            return result
        return result.model_copy(update={"content": self.compactor.compact_sync(result.content)})

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run the tool; compact a large result on the agent's event loop."""
        result = await handler(request)
        if not self._wants(request, result):
            return result
        return result.model_copy(update={"content": await self.compactor.compact(result.content)})


def _content_bytes(content: Any) -> int:
    """How big a message's content is: text, or a list (of strings or content blocks) as JSON.

    A tool returning a list keeps it as list content; measured as text only, 780 KB of it
    reached the model uncompacted (adversarial review).
    """
    if isinstance(content, str):
        return len(content.encode())
    try:
        return len(msgspec.json.encode(content))
    except (TypeError, ValueError):
        return 0  # not JSON: left as it is
