"""A ``read_exact`` tool for Model Context Protocol servers.

Needs the optional SDK: ``pip install 'response-compaction[mcp]'``.

Hosts that hand a model a summary and an ``exact_ref`` let it fetch the exact value back with
this tool; the tool is :func:`response_compaction.response_compaction_read_exact` and nothing
else, so the model never sees the cache layout::

    from mcp.server.mcpserver import MCPServer
    from response_compaction.mcp import add_read_exact_tool

    server = MCPServer("my-host")
    add_read_exact_tool(server, harness)

The tool takes ``{"exact_ref": "rc1:..."}`` and answers ``{"state": "found", "value": ...}``,
``{"state": "missing"}`` or ``{"state": "broken", "detail": "..."}``. ``response-compaction
mcp`` serves a server with only this tool on stdio (:func:`serve_stdio`).

The ``mcp`` SDK is imported only when a server is built, so the core install works without it.
"""

from __future__ import annotations

import importlib
from typing import Any

import msgspec

from ._compact import response_compaction_read_exact
from ._models import Broken, Found, Missing

__all__ = ("READ_EXACT_DESCRIPTION", "add_read_exact_tool", "create_server", "serve_stdio")

READ_EXACT_DESCRIPTION = (
    "Read back the exact JSON value behind an exact_ref (a string like 'rc1:' + 64 hex "
    "characters) that came with a summarized or fallback response. Answers "
    '{"state": "found", "value": ...} with the exact value; {"state": "missing"} when it was '
    'never stored, has expired or was evicted; {"state": "broken", "detail": ...} when the '
    "reference is malformed or the stored bytes fail their integrity check."
)


def read_result_as_dict(result: Found[Any] | Missing | Broken) -> dict[str, Any]:
    """``{"state", "value" | "detail"}`` as JSON-ready builtins."""
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


def add_read_exact_tool(
    server: Any,
    harness: Any,
    *,
    exact_schema: Any = Any,
    name: str = "read_exact",
    description: str = READ_EXACT_DESCRIPTION,
) -> None:
    """Register a ``read_exact`` tool on ``server``, reading through ``harness``.

    ``server`` is an ``mcp`` SDK high-level server (``mcp.server.mcpserver.MCPServer``, or
    ``FastMCP`` from mcp 1.x): anything with ``add_tool(fn, name=..., description=...)``.
    ``exact_schema`` validates what is read (any JSON by default; give your exact schema to
    have content that no longer fits it reported as broken).
    """
    types = _import_mcp("mcp.types")

    async def read_exact(exact_ref: str) -> dict[str, Any]:
        result = await response_compaction_read_exact(harness, exact_ref, exact_schema)
        return read_result_as_dict(result)

    server.add_tool(
        read_exact,
        name=name,
        description=description,
        annotations=types.ToolAnnotations(
            title="Read an exact value", readOnlyHint=True, openWorldHint=False
        ),
    )


def create_server(
    harness: Any, *, name: str = "response-compaction", exact_schema: Any = Any
) -> Any:
    """A new ``mcp`` SDK server whose only tool is ``read_exact``."""
    _import_mcp("mcp.types")
    try:
        server_class = importlib.import_module("mcp.server.mcpserver").MCPServer
    except ModuleNotFoundError:
        server_class = importlib.import_module("mcp.server.fastmcp").FastMCP  # mcp 1.x
    server = server_class(name)
    add_read_exact_tool(server, harness, exact_schema=exact_schema)
    return server


async def serve_stdio(
    harness: Any, *, name: str = "response-compaction", exact_schema: Any = Any
) -> None:
    """Serve :func:`create_server` on stdin/stdout until the client hangs up."""
    server = create_server(harness, name=name, exact_schema=exact_schema)
    await server.run_stdio_async()


def _import_mcp(module: str) -> Any:
    try:
        importlib.import_module("mcp")
    except ModuleNotFoundError as exc:
        if exc.name != "mcp":
            raise
        raise ModuleNotFoundError(
            "the MCP tool needs the optional mcp SDK: pip install 'response-compaction[mcp]'",
            name="mcp",
        ) from exc
    return importlib.import_module(module)
