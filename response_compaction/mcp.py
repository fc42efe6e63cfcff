"""A ``read_exact`` tool for Model Context Protocol servers: bounded, verified, pageable.

Needs the optional SDK: ``pip install 'response-compaction[mcp]'``.

Hosts that hand a model a summary and an ``exact_ref`` let it read the exact value back,
piece by piece, with this tool; the tool is
:func:`response_compaction.response_compaction_read_part` and nothing else, so the model never
sees the cache layout and never gets more than the server's ``max_bytes`` in one reply::

    from mcp.server.mcpserver import MCPServer
    from response_compaction.mcp import add_read_exact_tool

    server = MCPServer("my-host")
    add_read_exact_tool(server, harness)

The tool takes ``{"exact_ref": "rc1:...", "pointer"?, "start"?, "stop"?, "max_bytes"?}``.
A found part answers with a header line and the part's JSON as text, and
``{"state": "found", "part": {...}}`` as structured content (the :class:`Part` fields, with
``value`` and not ``json``; ``value_omitted: true`` in place of a ``value`` that nests more
than :data:`STRUCTURED_DEPTH` levels); ``{"state": "missing"}`` and ``{"state": "broken",
"detail"}`` as before. A malformed pointer or a pointer that names nothing is a tool error.
Text (as the JSON string it travels as) and structured content together never exceed
``max_bytes``. ``response-compaction mcp`` serves a server with only this tool on stdio
(:func:`serve_stdio`).

The ``mcp`` SDK is imported only when a server is built, so the core install works without it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from ._compact import response_compaction_read_exact
from ._encoding import line_safe
from ._models import Broken, Found, Missing
from ._part import MIN_MAX_BYTES, Part
from ._read import response_compaction_read_part

__all__ = (
    "DEFAULT_MAX_BYTES",
    "READ_EXACT_DESCRIPTION",
    "add_read_exact_tool",
    "create_server",
    "read_result_as_dict",
    "serve_stdio",
)

R = TypeVar("R")
#: The read-back's body: exact_ref, pointer, start, stop, max_bytes.
ReadBody = Callable[[str, str, int | None, int | None, int | None], Awaitable[R]]

#: A found part's ``value`` is in the structured content only when it nests at most this
#: deep: hosts' JSON parsers stop near 128 levels (serde_json) or 200 (the SDK's own client,
#: which then never answered the call: a 200-deep value hung it). Deeper, only the text has it.
STRUCTURED_DEPTH = 100
#: What one reply may hold, text and structured content together, unless the host says.
DEFAULT_MAX_BYTES = 100_000
#: Room kept in a reply for everything but the part's JSON (twice: text and structured).
_REPLY_OVERHEAD = 1024
#: Smaller reads at most, for a reply whose escaped text overshot the cap.
_SHRINKS = 4
#: Room kept for the pointer echoed in a reply: its JSON of up to this many bytes (62
#: characters, ``/rows/1234/items/0``-like paths several levels deep).
_POINTER_ROOM = 64
#: The smallest server cap: a part of ``MIN_MAX_BYTES`` twice, a pointer of
#: ``_POINTER_ROOM`` twice, and the rest of a reply.
_SMALLEST_CAP = 2 * (MIN_MAX_BYTES + _POINTER_ROOM) + _REPLY_OVERHEAD

READ_EXACT_DESCRIPTION = (
    "Read the exact JSON value behind an exact_ref (a string like 'rc1:' + 64 hex characters) "
    "that came with a summarized or fallback response, one bounded part at a time. "
    "Arguments: exact_ref; pointer, an RFC 6901 JSON pointer to the node to read ('' = the "
    "whole value, '/rows/0/name' = key 'rows', item 0, key 'name'); start and stop, a window "
    "[start, stop) of array items, object members (in key order) or string characters; "
    "max_bytes, the most JSON to return (the server caps it). Each answer says the node's "
    "total_items and total_bytes, the window shown (start, stop) and next_start when more "
    "follows: call again with start=next_start to page on. When not even one item fits, the "
    "answer is an outline instead (outline=true): one entry per item with its key or index, "
    "type, bytes and length; read a big item by extending the pointer (e.g. '/rows/3'). A "
    "string too long is cut, ending with '…[cut]'. States: found; missing (never stored, "
    "expired or evicted); broken (malformed reference, or stored bytes that fail their "
    "integrity check)."
)


def read_result_as_dict(result: Found[Any] | Missing | Broken) -> dict[str, Any]:
    """``{"state", "value" | "part" | "detail"}`` as JSON-ready builtins.

    A found :class:`Part` is given as ``part`` (its fields, ``value`` but not ``json``).
    """
    if isinstance(result, Found) and isinstance(result.value, Part):
        part: dict[str, Any] = msgspec.to_builtins(result.value)
        del part["json"]
        return {"state": "found", "part": part}
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep."""
    level, depth = [value], 0
    while level := [v for v in level if isinstance(v, list | dict)]:
        depth += 1
        if depth > limit:
            return True
        level = [item for v in level for item in (v.values() if isinstance(v, dict) else v)]
    return False


def part_header(part: Part) -> str:
    """One line that tells a model what the part is and how to read on."""
    pointer = line_safe(msgspec.json.encode(part.pointer)).decode()  # the header is one line
    words = [f"found pointer={pointer} total_bytes={part.total_bytes}"]
    if part.total_items is not msgspec.UNSET:
        words.append(f"total_items={part.total_items}")
    if part.start is not msgspec.UNSET:
        words.append(f"shown=[{part.start},{part.stop})")
    words.append("complete" if part.complete else "partial")
    if part.outline:
        words.append("outline (items too big to show: read one by extending the pointer)")
    if part.next_start is not msgspec.UNSET:
        words.append(f"next_start={part.next_start}")
    return " ".join(words)


def add_read_exact_tool(
    server: Any,
    harness: Any,
    *,
    exact_schema: Any = Any,
    name: str = "read_exact",
    description: str = READ_EXACT_DESCRIPTION,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Register a ``read_exact`` tool on ``server``, reading through ``harness``.

    ``server`` is an ``mcp`` SDK high-level server (``mcp.server.mcpserver.MCPServer``, or
    ``FastMCP`` from mcp 1.x): anything with ``add_tool(fn, name=..., description=...)``.
    ``max_bytes`` caps every reply (text and structured content together). ``exact_schema``
    other than ``Any`` also validates the whole stored value against it before any part is
    served, so content that no longer fits reads as broken (this decodes the whole value).
    """
    types = _import_mcp("mcp.types")
    part_cap = (max_bytes - _REPLY_OVERHEAD) // 2
    # Room for a part of MIN_MAX_BYTES beside a pointer of a few levels: at 1536 every read
    # answered that the pointer was too long, at 1540 every read but of the whole value
    # (the outline's "extend the pointer" could never be followed).
    if part_cap - _POINTER_ROOM < MIN_MAX_BYTES:
        raise ValueError(f"max_bytes must be >= {_SMALLEST_CAP}")

    read_exact = read_tool_function(
        functools.partial(_answer, types, harness, exact_schema, part_cap, max_bytes)
    )
    # The SDK passes a CallToolResult through as it is (no schema, no pretty-printed copy).
    read_exact.__annotations__["return"] = types.CallToolResult
    server.add_tool(
        read_exact,
        name=name,
        description=description,
        annotations=types.ToolAnnotations(
            title="Read an exact value", readOnlyHint=True, openWorldHint=False
        ),
    )


def read_tool_function(body: ReadBody[R]) -> Callable[..., Awaitable[R]]:
    """``body`` as the coroutine function ``read_exact``, typed for every host and framework.

    Its parameters become the read-back tool's input schema: one definition for all of them.
    """

    async def read_exact(
        exact_ref: str,
        pointer: str = "",
        start: int | None = None,
        stop: int | None = None,
        max_bytes: int | None = None,
    ) -> Any:
        return await body(exact_ref, pointer, start, stop, max_bytes)

    return read_exact


def echoed_bytes(pointer: object) -> int:
    """The JSON size of ``pointer`` echoed in a reply (0 if not a string: refused later).

    ``ValueError`` for a string JSON cannot carry (a lone surrogate), without quoting it.
    """
    if not isinstance(pointer, str):
        return 0
    try:
        return len(line_safe(msgspec.json.encode(pointer)))
    except UnicodeEncodeError:
        raise ValueError("pointer is not valid Unicode (it holds a lone surrogate)") from None


async def _answer(
    types: Any,
    harness: Any,
    exact_schema: Any,
    part_cap: int,
    reply_cap: int,
    exact_ref: str,
    pointer: str,
    start: int | None,
    stop: int | None,
    max_bytes: int | None,
) -> Any:
    try:
        # The pointer is echoed twice (header and structured content), the part's JSON too;
        # the text's copy travels escaped once more (a quote as \"): a fifth kept for that,
        # which JSON of ordinary records (15-25% quotes) fits in one read.
        room = part_cap - echoed_bytes(pointer)
        if room < MIN_MAX_BYTES:
            return _error(types, "pointer is too long for this server's reply cap")
        room = max(MIN_MAX_BYTES, room * 4 // 5)
        limit: Any = room if max_bytes is None else max_bytes  # not an int: read_part says so
        if type(max_bytes) is int:
            limit = min(max_bytes, room)
        if exact_schema is not Any:
            checked = await response_compaction_read_exact(harness, exact_ref, exact_schema)
            if not isinstance(checked, Found):
                return _reply(types, checked)
        read = functools.partial(
            response_compaction_read_part,
            harness,
            exact_ref,
            pointer=pointer,
            start=start,
            stop=stop,
        )
        return await _fitted(types, read, limit, reply_cap)
    except (ValueError, LookupError) as exc:
        return _error(types, str(exc))


async def _fitted(
    types: Any, read: Callable[..., Awaitable[Found[Part] | Missing | Broken]], limit: Any, cap: int
) -> Any:
    """The reply to ``read(max_bytes=limit)``, read again smaller until it is carried in ``cap``.

    The text travels as a JSON string: each quote, backslash or control character of the
    part's JSON (and of the pointer in its header) is escaped once more; a part of quotes took
    1.5x the cap. A reply that does not fit even with the smallest part is an error.
    """
    result = await read(max_bytes=limit)
    reply = _reply(types, result)
    carried = _carried_bytes(reply)
    for _ in range(_SHRINKS):
        if carried <= cap or not isinstance(result, Found) or limit <= MIN_MAX_BYTES:
            break
        # In proportion (a byte of the part can cost three carried: a quote escaped twice in
        # the text, once in the structured content; cutting by the overshoot alone paged 100
        # KB of quotes in 1 KB replies), and a tenth under, for the reply's fixed part.
        limit = max(MIN_MAX_BYTES, limit * cap // carried * 9 // 10)
        result = await read(max_bytes=limit)
        reply = _reply(types, result)
        carried = _carried_bytes(reply)
    if carried > cap:
        return _error(types, "pointer is too long for this server's reply cap")
    return reply


def _carried_bytes(reply: Any) -> int:
    """The reply as the SDK sends it (its own JSON: ``1e+300`` where msgspec writes ``1e300``)."""
    return len(reply.model_dump_json(by_alias=True, exclude_none=True).encode())  # bytes


def _error(types: Any, message: str) -> Any:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"error: {message}")], is_error=True
    )


def _reply(types: Any, result: Found[Any] | Missing | Broken) -> Any:
    structured = read_result_as_dict(result)
    if isinstance(result, Found) and isinstance(result.value, Part):
        part = structured["part"]
        if _deeper_than(part["value"], STRUCTURED_DEPTH):  # the text has it
            structured["part"] = {k: v for k, v in part.items() if k != "value"}
            structured["part"]["value_omitted"] = True
        text = part_header(result.value) + "\n" + result.value.json
    else:
        text = msgspec.json.encode(structured).decode()
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured
    )


def create_server(
    harness: Any,
    *,
    name: str = "response-compaction",
    exact_schema: Any = Any,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Any:
    """A new ``mcp`` SDK server whose only tool is ``read_exact``, capped at ``max_bytes``."""
    _import_mcp("mcp.types")
    try:
        server_class = importlib.import_module("mcp.server.mcpserver").MCPServer
    except ModuleNotFoundError:
        server_class = importlib.import_module("mcp.server.fastmcp").FastMCP  # mcp 1.x
    server = server_class(name)
    add_read_exact_tool(server, harness, exact_schema=exact_schema, max_bytes=max_bytes)
    return server


async def serve_stdio(
    harness: Any,
    *,
    name: str = "response-compaction",
    exact_schema: Any = Any,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Serve :func:`create_server` on stdin/stdout until the client hangs up."""
    server = create_server(harness, name=name, exact_schema=exact_schema, max_bytes=max_bytes)
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
