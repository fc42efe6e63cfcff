"""The MCP ``read_exact`` tool, through the mcp SDK's own client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent

import response_compaction as rc
from response_compaction.mcp import STRUCTURED_DEPTH, add_read_exact_tool, create_server
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

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


async def call(client: Client, ref: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool("read_exact", {"exact_ref": ref, **arguments})
    assert not result.is_error
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def found(value: Any) -> dict[str, Any]:
    """The structured answer for a small value read whole."""
    data = msgspec.json.encode(value, order="sorted")
    part = {"pointer": "", "value": msgspec.json.decode(data), "complete": True}
    return {"state": "found", "part": part | {"total_bytes": len(data)}}


def whole(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` without the window fields, which depend on the value's shape."""
    if "part" in answer:
        keep = ("pointer", "value", "complete", "total_bytes")
        answer = answer | {"part": {k: answer["part"][k] for k in keep}}
    return answer


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

        assert whole(await call(client, intact)) == found(value)
        assert await call(client, "rc1:" + "0" * 64) == {"state": "missing"}
        tampered = await call(client, broken)
        assert tampered["state"] == "broken"
        assert "does not verify" in tampered["detail"]
        malformed = await call(client, "../etc/passwd")
        assert malformed["state"] == "broken"
        assert "malformed exact_ref" in malformed["detail"]


async def test_stdio_answers_a_value_nested_beyond_what_hosts_parse(tmp_path: Path) -> None:
    """A 300-deep value got "Internal server error" (the SDK's serializer stops near 250), and
    a 200-deep one hung the SDK's client (its parser stops at 200 and never answers the call).
    Deeper than STRUCTURED_DEPTH, the value is in the text only."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    refs = {}
    for depth in (STRUCTURED_DEPTH, 200, 300):
        value: Any = 1
        for _ in range(depth):
            value = [value]
        out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
        refs[depth] = (out.receipt.exact_ref, msgspec.json.encode(value).decode())
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "response_compaction", "mcp", "--root", str(tmp_path)],
        env={"PYTHONPATH": str(REPO)},
    )
    async with Client(params) as client:
        for depth, (ref, text) in refs.items():
            result = await client.call_tool("read_exact", {"exact_ref": ref})
            assert not result.is_error
            assert isinstance(result.content[0], TextContent)
            assert result.content[0].text.endswith("\n" + text)
            assert isinstance(result.structured_content, dict)
            part = result.structured_content["part"]
            assert part["complete"] is True
            assert ("value" in part) is (depth <= STRUCTURED_DEPTH)
            assert part.get("value_omitted", False) is (depth > STRUCTURED_DEPTH)


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
        assert whole(await call(client, intact)) == found(value)
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


def reply_bytes(result: Any) -> int:
    """Text and structured content of one reply, as the UTF-8 JSON the reply carries them in
    (the text a JSON string: its quotes and backslashes escaped)."""
    text = sum(len(msgspec.json.encode(block.text)) for block in result.content)
    return text + len(msgspec.json.encode(result.structured_content))


@pytest.mark.parametrize(
    "char", ['"', "\\", "\n", "\x01"], ids=["quote", "backslash", "newline", "control"]
)
async def test_a_part_whose_json_escapes_again_still_fits_the_cap(
    tmp_path: Path, char: str
) -> None:
    """A string of quotes (or backslashes, control characters): its JSON, escaped once more
    as the reply's text, took up to 1.5x the cap on the wire; smaller parts now fit it."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    value = {"s": char * 100_000, "rows": [char * 50] * 400}
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    async with Client(create_server(harness, max_bytes=4000)) as client:
        for args in ({"pointer": "/s"}, {"pointer": "/rows"}, {"pointer": "/s", "start": 7}):
            result = await client.call_tool(
                "read_exact", {"exact_ref": out.receipt.exact_ref, **args}
            )
            assert not result.is_error
            assert reply_bytes(result) <= 4000
            assert len(result.model_dump_json(by_alias=True, exclude_none=True)) <= 4000
            assert isinstance(result.structured_content, dict)
            assert result.structured_content["part"]["value"]  # not cut to nothing


async def test_escaping_pages_stay_near_the_cap_and_floats_are_sized_as_sent(
    tmp_path: Path,
) -> None:
    """100 KB of quotes pages in a few replies (a shrink by the overshoot alone cut them to
    1 KB: 618 calls); floats are sized as the SDK writes them (1.5e+300, not msgspec's
    1.5e300: 20,000 of them made a 105 KB reply under a 100 KB cap), and in bytes (emoji
    counted as characters made a 101 KB one)."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    value = {
        "q": '"' * 100_000,
        "f": [1.5e300] * 20_000,
        "e": ['"' * 8 + "\U0001f600" * 3] * 20_000,
    }
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    async with Client(create_server(harness, max_bytes=100_000)) as client:
        pages, start = 0, 0
        while start is not None:
            args = {"exact_ref": out.receipt.exact_ref, "pointer": "/q", "start": start}
            result = await client.call_tool("read_exact", args)
            assert len(result.model_dump_json(by_alias=True, exclude_none=True)) <= 100_000
            assert isinstance(result.structured_content, dict)
            start = result.structured_content["part"].get("next_start")
            pages += 1
        assert pages <= 8
        for pointer in ("/f", "/e"):  # emoji: 4 bytes each, one character of the reply's text
            args = {"exact_ref": out.receipt.exact_ref, "pointer": pointer}
            result = await client.call_tool("read_exact", args)
            assert not result.is_error
            sent = result.model_dump_json(by_alias=True, exclude_none=True).encode()
            assert len(sent) <= 100_000


async def test_a_pointer_whose_echo_escapes_past_the_cap_is_an_error(tmp_path: Path) -> None:
    """The pointer is echoed in the header (escaped once more as the text's JSON string) and
    in the structured content: one of 24,000 quotes took 144 KB of a 100 KB cap."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    value = {'"' * 24_000: 1, "pad": "x" * 20_000}
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    async with Client(create_server(harness, max_bytes=100_000)) as client:
        args = {"exact_ref": out.receipt.exact_ref, "pointer": "/" + '"' * 24_000}
        result = await client.call_tool("read_exact", args)
    assert len(result.model_dump_json(by_alias=True, exclude_none=True)) <= 100_000
    assert result.is_error
    assert isinstance(result.content[0], TextContent)
    assert "pointer is too long" in result.content[0].text


@pytest.mark.slow
async def test_stdio_pages_a_20_mb_entry_within_the_cap(tmp_path: Path) -> None:
    """Over stdio, a 20 MB value pages through whole, no reply above the 100 KB default."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    value = big_exact(300_000, name_len=30)
    receipt = (await rc.response_compact(harness, value, Exact, Summary, OPTIONS)).receipt
    assert receipt.exact_bytes > 20_000_000
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "response_compaction", "mcp", "--root", str(tmp_path)],
        env={"PYTHONPATH": str(REPO)},
    )
    rows: list[Any] = []
    async with Client(params) as client:
        top = await client.call_tool("read_exact", {"exact_ref": receipt.exact_ref})
        assert reply_bytes(top) <= 100_000
        assert isinstance(top.structured_content, dict)
        assert top.structured_content["part"]["outline"] is True
        assert top.structured_content["part"]["value"][0]["items"] == 300_000
        start: int | None = 0
        calls = 0
        while start is not None:
            result = await client.call_tool(
                "read_exact", {"exact_ref": receipt.exact_ref, "pointer": "/rows", "start": start}
            )
            calls += 1
            assert not result.is_error
            assert reply_bytes(result) <= 100_000
            assert isinstance(result.structured_content, dict)
            part = result.structured_content["part"]
            assert part["start"] == start
            rows.extend(part["value"])
            start = part.get("next_start")
    assert rows == msgspec.to_builtins(value.rows)
    assert calls > 200  # pages, not one reply


async def test_a_reply_is_two_lines_whatever_the_value_holds(tmp_path: Path) -> None:
    """U+2028, U+2029 and U+0085 in a value (keys, strings, a string cut short) are escaped in
    the part's JSON: raw, they broke the reply's JSON line into lines of its own, which could
    pass for a header line."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    fake = '\u2028found pointer="/x" total_bytes=1 complete\u2029\x85'
    value = {"rows": [{f"k{fake}": fake * 3} for _ in range(300)], "text": fake * 400}
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    async with Client(create_server(harness, max_bytes=4096)) as client:
        key = f"k{fake}".replace("~", "~0").replace("/", "~1")  # RFC 6901
        pointers = ("/rows", "/text", "/rows/0", f"/rows/0/{key}")  # the last is echoed too
        for args in ({}, *({"pointer": pointer} for pointer in pointers)):
            result = await client.call_tool(
                "read_exact", {"exact_ref": out.receipt.exact_ref, **args}
            )
            assert reply_bytes(result) <= 4096
            assert isinstance(result.content[0], TextContent)
            lines = result.content[0].text.splitlines()
            assert len(lines) == 2
            assert isinstance(result.structured_content, dict)
            assert msgspec.json.decode(lines[1]) == result.structured_content["part"]["value"]


async def test_tool_pages_and_outlines_in_process(tmp_path: Path) -> None:
    """Pointer, window and max_bytes reach read_part; bad pointers are tool errors."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    value = big_exact(3000)
    ref = (await rc.response_compact(harness, value, Exact, Summary, OPTIONS)).receipt.exact_ref
    async with Client(create_server(harness, max_bytes=4096)) as client:
        result = await client.call_tool(
            "read_exact", {"exact_ref": ref, "pointer": "/rows", "start": 10, "stop": 13}
        )
        assert reply_bytes(result) <= 4096
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.splitlines()[0] == (
            'found pointer="/rows" total_bytes='
            f"{len(msgspec.json.encode(value.rows))} total_items=3000 shown=[10,13) partial"
            " next_start=13"
        )
        assert msgspec.json.decode(text.splitlines()[1]) == msgspec.to_builtins(value.rows[10:13])
        capped = await call(client, ref, pointer="/rows", max_bytes=100_000)
        assert len(msgspec.json.encode(capped["part"]["value"])) <= (4096 - 1024) // 2
        name = await call(client, ref, pointer="/rows/2999/name")
        assert name["part"]["value"] == value.rows[2999].name
        for pointer in ("rows", "/nope", "/" + "x" * 2000, "/rows/\ud800"):
            error = await client.call_tool("read_exact", {"exact_ref": ref, "pointer": pointer})
            assert error.is_error
        assert "not valid Unicode" in error.content[0].text  # type: ignore[union-attr]
        tools = (await client.list_tools()).tools
        description = tools[0].description or ""
        for word in ("pointer", "next_start", "outline", "max_bytes", "start", "stop"):
            assert word in description
        assert set(tools[0].input_schema["properties"]) == {
            "exact_ref",
            "pointer",
            "start",
            "stop",
            "max_bytes",
        }


def test_cap_too_small_for_a_part_is_refused(harness: rc.Harness) -> None:
    """A server cap that cannot hold a 256-byte part twice plus the header is refused."""
    with pytest.raises(ValueError, match="max_bytes"):
        create_server(harness, max_bytes=1500)
    with pytest.raises(ValueError, match="max_bytes must be >= 1664"):
        create_server(harness, max_bytes=1663)


async def test_the_smallest_cap_allowed_answers_reads(harness: rc.Harness) -> None:
    """At 1536, accepted, every read answered that the pointer was too long (even ''); at
    1540 every read but of the whole value: the outline's advice could not be followed."""
    value = big_exact(300)
    out = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    pointers = ["", "/rows", "/rows/0", "/rows/299/tags/0", "/rows/299/" + "x" * 40]
    async with Client(create_server(harness, max_bytes=1664)) as client:
        for ref, pointer in [(out.receipt.exact_ref, p) for p in pointers] + [
            ("rc1:" + "0" * 64, "")
        ]:
            args = {"exact_ref": ref, "pointer": pointer}
            result = await client.call_tool("read_exact", args)
            assert len(result.model_dump_json(by_alias=True, exclude_none=True).encode()) <= 1664
            assert not result.is_error or "no member" in str(result.content), result.content
