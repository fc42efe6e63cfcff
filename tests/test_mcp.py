"""The MCP ``read_exact`` tool, through the mcp SDK's own client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer

import response_compaction as rc
from response_compaction.mcp import add_read_exact_tool, create_server
from tests.schemas import FALLBACK, Exact, Row, Summary

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


async def stored_refs(root: Path) -> tuple[str, str, Exact]:
    """Two stored entries under ``root``: one intact, one with a flipped byte on disk."""
    harness = rc.Harness(fs=rc.LocalWorkspace(root))
    value = Exact(rows=[Row(id=7, name="seven", tags=["x"])], total=1)
    intact = (await rc.response_compact(harness, value, Exact, Summary, OPTIONS)).receipt
    other = Exact(rows=[Row(id=8, name="eight")], total=1)
    broken = (await rc.response_compact(harness, other, Exact, Summary, OPTIONS)).receipt
    hex_digest = broken.exact_ref.removeprefix("rc1:")
    path = root / "response-compaction-v1" / "exact" / hex_digest[:2] / hex_digest
    data = bytearray(path.read_bytes())
    data[2] ^= 0x01
    path.write_bytes(bytes(data))
    return intact.exact_ref, broken.exact_ref, value


async def call(client: Client, ref: str) -> dict[str, Any]:
    result = await client.call_tool("read_exact", {"exact_ref": ref})
    assert not result.is_error
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_stdio_server_found_missing_broken(tmp_path: Path) -> None:
    """``response-compaction mcp`` over stdio answers found, missing and broken states."""
    intact, broken, value = await stored_refs(tmp_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "response_compaction", "mcp", "--root", str(tmp_path)],
        env={"PYTHONPATH": str(REPO)},
    )
    async with Client(params) as client:
        tools = await client.list_tools()
        assert [tool.name for tool in tools.tools] == ["read_exact"]
        assert tools.tools[0].annotations is not None
        assert tools.tools[0].annotations.read_only_hint is True

        assert await call(client, intact) == {"state": "found", "value": msgspec.to_builtins(value)}
        assert await call(client, "rc1:" + "0" * 64) == {"state": "missing"}
        tampered = await call(client, broken)
        assert tampered["state"] == "broken"
        assert "does not verify" in tampered["detail"]
        malformed = await call(client, "../etc/passwd")
        assert malformed["state"] == "broken"
        assert "malformed exact_ref" in malformed["detail"]


async def test_host_adds_the_tool_to_its_own_server(tmp_path: Path) -> None:
    """A host's own MCPServer gains read_exact, validating with the host's exact schema."""
    intact, broken, value = await stored_refs(tmp_path)
    server = MCPServer("my-host")

    @server.tool()
    def ping() -> str:
        return "pong"

    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    add_read_exact_tool(server, harness, exact_schema=Exact, name="read_exact")
    async with Client(server) as client:
        names = sorted(tool.name for tool in (await client.list_tools()).tools)
        assert names == ["ping", "read_exact"]
        assert await call(client, intact) == {"state": "found", "value": msgspec.to_builtins(value)}
        assert (await call(client, broken))["state"] == "broken"


async def test_schema_mismatch_reads_broken(tmp_path: Path) -> None:
    """Content that no longer fits the tool's exact schema reads as broken, not found."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    raw = msgspec.Raw(b'{"rows": [], "total": -1}')
    ref = (await rc.response_compact(harness, raw, Any, Summary, OPTIONS)).receipt.exact_ref
    async with Client(create_server(harness, exact_schema=Exact)) as client:
        answer = await call(client, ref)
    assert answer["state"] == "broken"


def test_missing_extra_gives_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, harness: rc.Harness
) -> None:
    """Without the mcp SDK, building the tool says which extra to install."""
    for name in list(sys.modules):
        if name == "mcp" or name.startswith("mcp."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ModuleNotFoundError, match=r"response-compaction\[mcp\]"):
        create_server(harness)
