"""A compacting MCP proxy: ``response-compaction proxy [options] -- CMD [ARGS...]``.

The proxy is an MCP server on stdio. It starts ``CMD`` as a stdio MCP server (the SDK's own
client), lists its tools, forwards every call, and hands back results as they came unless
their text or structured content is larger than ``summarize_above_bytes``: those are
compacted with :func:`response_compact` and replaced by :meth:`Compacted.to_agent_text`. The
proxy adds one tool, ``read_exact`` (from :mod:`response_compaction.mcp`), to read the exact
value back in bounded parts.

An embedded text resource counts as text: its text is compacted with the text blocks and a
``resource_link`` to its URI stays in the reply (a 3 MB resource reached the host whole).
What passes through unchanged: results at or under the threshold, error results
(``isError``), JSON-RPC errors from the upstream server, images, audio and binary resources
(a host shows those to its model as media, not as text), and results that cannot be
retained exactly, or not retained at all (the store failed, say a full disk: the upstream
tool has run, and its result is worth more than an error), each logged as a warning.
What changes: a tool's ``outputSchema`` is not listed, because a compacted result carries
text in place of structured content and a host would reject it against the schema.

Memory: a call holds its one upstream result while it is compacted, and drops it before it
answers; nothing is buffered across calls.

::

    proxy  <--stdio-->  host          (this process is the host's MCP server)
    proxy  <--stdio-->  CMD [ARGS]    (the upstream server, started by the proxy)
    proxy  <--memory--> read_exact    (mcp.create_server on the same harness)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ._agent_text import MIN_TEXT_BYTES
from ._compact import response_compact
from ._options import resolve_options
from ._refusals import decoded_or_text, is_refusal
from ._store import open_store
from .mcp import _import_mcp, create_server

__all__ = ["ProxyConfig", "compact_tool_result", "open_proxy", "serve_proxy"]

log = logging.getLogger("response_compaction")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """How the proxy compacts: given once, used for every call.

    ``options`` is a :class:`CompactionOptions` or a mapping (``summarize_above_bytes`` is the
    threshold); ``summary_schema`` is what a model summary must fill in. ``text_bytes`` bounds
    the text the host's model sees for a compacted result; ``max_bytes`` caps every
    ``read_exact`` reply. ``env`` is the upstream's whole environment; left out, it is this
    process's without the variables that configure the proxy's own model (``OPENAI_*``,
    ``RESPONSE_COMPACTION_*``: the summarizer's API key is no business of a third-party
    server) except those named in ``pass_env``.
    """

    harness: Any
    options: Any
    summary_schema: Any
    read_tool: str = "read_exact"
    text_bytes: int = 16000
    max_bytes: int = 100_000
    env: Mapping[str, str] | None = field(default=None)
    pass_env: Sequence[str] = ()


#: Prefixes of the variables that configure the proxy's own model and store.
_OWN_PREFIXES = ("OPENAI_", "RESPONSE_COMPACTION_")


def _upstream_env(environ: Mapping[str, str], passed: Sequence[str] = ()) -> dict[str, str]:
    """``environ`` without the proxy's own variables, but for those named in ``passed``.

    Names compare without case, as the prefixes do (Windows keeps them upper-cased).
    """
    kept = {name.upper() for name in passed}
    return {
        name: value
        for name, value in environ.items()
        if name.upper() in kept or not name.upper().startswith(_OWN_PREFIXES)
    }


async def compact_tool_result(result: Any, config: ProxyConfig) -> Any:
    """``result`` (an MCP ``CallToolResult``) as it is, or compacted when it is too large.

    Size is the text blocks' UTF-8 bytes plus the structured content's JSON bytes. What is
    retained is the text: a block that is JSON as its value, any other text as a JSON string
    (several blocks: a list). Structured content is retained instead when there is no text,
    and beside it (``{"content": ..., "structured_content": ...}``) when the text is not its
    serialization. An embedded text resource is text (its block becomes a link to its URI);
    other blocks stay in the reply. A result that cannot be retained
    exactly (a lone surrogate, a NaN or nesting too deep in its structured content), or that
    the store fails to retain (an ``OSError``), is passed on as it came, with a warning
    logged: the call still answers.
    """
    types = _import_mcp("mcp.types")
    opts = resolve_options(config.options, config.summary_schema)
    if result.is_error:
        return result
    texts = [text for block in result.content if (text := _text_of(types, block)) is not None]
    try:
        size = _size(texts, result.structured_content)
    except (ValueError, RecursionError) as exc:  # no JSON holds it (an int of 5,000 digits)
        return _passed_on(result, exc)
    if size <= opts.summarize_above_bytes:
        return result
    try:
        compacted = await _compacted(texts, result.structured_content, config, opts)
    except OSError as exc:
        return _passed_on(result, exc, "could not be stored")
    except (ValueError, RecursionError) as exc:
        if not _refusal(exc):
            raise  # the proxy's own configuration (a summary schema, a fallback function)
        return _passed_on(result, exc)
    text = compacted.to_agent_text(read_tool=config.read_tool, max_bytes=config.text_bytes)
    others = [_left_in_reply(types, block) for block in result.content]
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text), *filter(None, others)],
        is_error=False,
        _meta=result.meta,
    )


def _text_of(types: Any, block: Any) -> str | None:
    """A text block's text, or an embedded text resource's; None for any other block."""
    if isinstance(block, types.TextContent):
        return str(block.text)
    if isinstance(block, types.EmbeddedResource) and isinstance(
        block.resource, types.TextResourceContents
    ):
        return str(block.resource.text)
    return None


def _left_in_reply(types: Any, block: Any) -> Any:
    """What stays of ``block`` beside the compacted text: itself, a link to it, or nothing."""
    if _text_of(types, block) is None:
        return block
    if isinstance(block, types.EmbeddedResource):
        uri = block.resource.uri
        mime = block.resource.mime_type
        return types.ResourceLink(type="resource_link", uri=uri, name=str(uri), mime_type=mime)
    return None


def _passed_on(result: Any, exc: BaseException, why: str = "cannot be retained exactly") -> Any:
    # The type and errno only: an exception's message may quote the result.
    errno = getattr(exc, "errno", None)
    log.warning(
        "proxy: a tool result is passed on uncompacted: it %s (%s%s)",
        why,
        type(exc).__name__,
        f", errno {errno}" if isinstance(errno, int) else "",
    )
    return result


def _size(texts: list[str], structured: Any) -> int:
    # surrogatepass: a lone surrogate is counted here and refused by the store, not here.
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    if structured is not None:
        size += len(msgspec.json.encode(structured))
    return size


async def _compacted(
    texts: list[str], structured: Any, config: ProxyConfig, opts: Any
) -> Any:  # fmt: skip
    """The compaction of what the result holds (its text as values, else as strings)."""
    schema = config.summary_schema
    try:
        value = _retained(texts, structured, parse=True)
        return await response_compact(config.harness, value, Any, schema, opts)
    except ValueError as exc:
        if not _refusal(exc):
            raise
        # Canonical JSON refuses what the text decodes to (1e999 is infinity): keep it as text.
        value = _retained(texts, structured, parse=False)
        return await response_compact(config.harness, value, Any, schema, opts)


def _refusal(exc: Exception) -> bool:
    """Whether ``exc`` says the value itself cannot be retained (not how it is compacted)."""
    return isinstance(exc, RecursionError) or is_refusal(exc)


def _retained(texts: list[str], structured: Any, *, parse: bool) -> Any:
    if not texts:
        return structured
    values = [decoded_or_text(text) if parse else text for text in texts]
    text_value = values[0] if len(values) == 1 else values
    # MCP servers send structured content with its serialization as text (mcp's MCPServer
    # wraps a non-object return as {"result": text}): the text alone is then the whole value.
    if structured is None or _same_json(structured, text_value):
        return text_value
    if structured == {"result": texts[0]}:
        return text_value
    return {"content": text_value, "structured_content": structured}


def _same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON, not only equal for Python (``True == 1.0``).

    ``==`` first (cheap when unequal), then their sorted encodings.
    """
    if a != b:
        return False
    return msgspec.json.encode(a, order="sorted") == msgspec.json.encode(b, order="sorted")


@contextlib.asynccontextmanager
async def open_proxy(command: str, args: Sequence[str], config: ProxyConfig) -> AsyncIterator[Any]:
    """Start ``command`` and yield the proxy's low-level MCP ``Server`` (not yet serving)."""
    mcp = _import_mcp("mcp")
    if not hasattr(mcp, "Client"):  # the 1.x SDK has no in-memory/stdio Client to proxy with
        raise ModuleNotFoundError("the proxy needs the mcp SDK 2.x: pip install 'mcp>=2'")
    types = _import_mcp("mcp.types")
    lowlevel = _import_mcp("mcp.server.lowlevel")
    resolve_options(config.options, config.summary_schema)  # bad options: fail before starting
    if config.text_bytes < MIN_TEXT_BYTES:  # not only once a large result has been stored
        raise ValueError(f"text_bytes must be >= {MIN_TEXT_BYTES}")
    # A store that cannot be opened (a mistyped --root) fails here, not as a warning on every
    # large result passed on uncompacted.
    await open_store(config.harness.fs)
    env = _upstream_env(os.environ, config.pass_env) if config.env is None else dict(config.env)
    params = mcp.StdioServerParameters(command=command, args=list(args), env=env)
    reader_server = create_server(config.harness, max_bytes=config.max_bytes)
    async with (
        _started(mcp.Client(params), command) as upstream,
        mcp.Client(reader_server) as reader,
    ):
        clash = config.read_tool in await _tool_names(upstream)
        if not clash:
            yield await _server(types, lowlevel, upstream, reader, config)
    if clash:  # raised once the clients are closed: as itself, not in their task group's group
        raise ValueError(
            f"the upstream server has a tool named {config.read_tool!r} too: give the"
            " proxy's read tool another name (--read-tool)"
        )


@contextlib.asynccontextmanager
async def _started(client: Any, command: str) -> AsyncIterator[Any]:
    """``client`` entered; an upstream that ends before it has answered ``initialize`` fails.

    As one ``ConnectionError`` naming the command, not the 90-line group of the SDK's tasks.
    """
    entered = False
    try:
        async with client as upstream:
            entered = True
            yield upstream
    except ExceptionGroup:
        if entered:
            raise
        raise ConnectionError(
            f"the upstream server {command!r} ended or failed before it answered initialize"
        ) from None


async def _server(
    types: Any, lowlevel: Any, upstream: Any, reader: Any, config: ProxyConfig
) -> Any:
    """The proxy's low-level server: ``upstream``'s tools, compacted, and ``reader``'s one."""
    read_tools = [
        tool.model_copy(update={"name": config.read_tool})
        for tool in (await reader.list_tools()).tools
        if tool.name == "read_exact"
    ]

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        page = await upstream.list_tools(cursor=params.cursor if params else None)
        # One named like the read tool since the start would never be called: not listed.
        tools = [
            tool.model_copy(update={"output_schema": None})
            for tool in page.tools
            if tool.name != config.read_tool
        ]
        if page.next_cursor is None:
            tools += read_tools
        return types.ListToolsResult(tools=tools, next_cursor=page.next_cursor)

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        if params.name == config.read_tool:
            return await reader.call_tool("read_exact", params.arguments)
        result = await upstream.call_tool(params.name, params.arguments)
        return await compact_tool_result(result, config)

    info = upstream.server_info
    return lowlevel.Server(
        f"{info.name if info else 'upstream'} (compacted)",
        instructions=upstream.instructions,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


async def _tool_names(client: Any) -> set[str]:
    """The names on the upstream's first ``_MAX_PAGES`` pages of tools (a cycle ends there)."""
    names: set[str] = set()
    cursor = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        names.update(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return names


_MAX_PAGES = 100


async def serve_proxy(command: str, args: Sequence[str], config: ProxyConfig) -> None:
    """Serve the proxy on stdin/stdout until the host hangs up; the upstream stops with it."""
    stdio = _import_mcp("mcp.server.stdio")
    async with open_proxy(command, args, config) as server, stdio.stdio_server() as streams:
        await server.run(*streams, server.create_initialization_options())
