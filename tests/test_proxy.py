"""The compacting MCP proxy: the mcp SDK's stdio client -> proxy -> stdio test server."""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp import types as mt
from mcp.shared.exceptions import MCPError

import response_compaction as rc
from response_compaction._proxy import ProxyConfig, compact_tool_result, open_proxy
from tests._store_support import entry_files, store_root
from tests.fake_openai import FakeOpenAI
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "tests" / "mcp_big_server.py"
REF = re.compile(r"rc1:[0-9a-f]{64}")
RECORD_97 = {"id": 97, "name": "record 97", "body": "00000097" + "x" * 90}
MARKER = "SECRET-MARKER-9137"


def nested(depth: int, inner: Any) -> Any:
    for _ in range(depth):
        inner = [inner]
    return inner


def upstream_params() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER)])


def proxy_params(root: Path, *options: str, **env: str) -> StdioServerParameters:
    proxy = ["-m", "response_compaction", "proxy", "--root", str(root), *options]
    return StdioServerParameters(
        command=sys.executable,
        args=[*proxy, "--", sys.executable, str(SERVER)],
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", ""), **env},
    )


@asynccontextmanager
async def proxied(root: Path, *options: str, **env: str) -> AsyncIterator[Client]:
    async with Client(proxy_params(root, *options, **env)) as client:
        yield client


def only_text(result: mt.CallToolResult) -> str:
    assert not result.is_error
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, mt.TextContent)
    return block.text


async def read_part(client: Client, ref: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool("read_exact", {"exact_ref": ref, **args})
    assert not result.is_error
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_two_stdio_hops_compact_a_5mb_result(tmp_path: Path) -> None:
    """5 MB results arrive as a bounded summary with a ref; read_exact reads /records/97 back.

    Also: the tools are listed as upstream lists them, plus read_exact; the model configured
    as for ``compact`` summarizes (with the given instructions); replies stay within
    --max-bytes; 5 MB of text that is not JSON is retained as one JSON string.
    """
    async with Client(upstream_params()) as direct:
        upstream_tools = (await direct.list_tools()).tools
    options = ("--max-bytes", "4000", "--model", "fake-small", "--instructions", "INSTRUCTED")
    with FakeOpenAI(fill_unscripted=True) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test"}
        async with proxied(tmp_path, *options, **env) as client:
            await check_big_results(client, upstream_tools)
        bodies = server.bodies("fake-small")
    assert len(bodies) == 2
    assert all("INSTRUCTED" in body["messages"][0]["content"] for body in bodies)


async def check_big_results(client: Client, upstream_tools: list[mt.Tool]) -> None:
    tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == [t.name for t in upstream_tools] + ["read_exact"]
    for mine, theirs in zip(tools, upstream_tools, strict=False):
        assert mine.input_schema == theirs.input_schema
        assert mine.description == theirs.description
    text = only_text(await client.call_tool("big_json", {}))
    assert len(text.encode()) <= 16000
    assert text.startswith("kind: summarized")
    match = REF.search(text)
    assert match is not None
    part = await read_part(client, match.group(0), pointer="/records/97")
    assert part["part"]["value"] == RECORD_97
    whole = await client.call_tool("read_exact", {"exact_ref": match.group(0)})
    assert len(whole.model_dump_json(by_alias=True, exclude_none=True)) <= 4000 + 200

    match = REF.search(only_text(await client.call_tool("big_text", {})))
    assert match is not None
    part = await read_part(client, match.group(0), max_bytes=2000)
    assert isinstance(part["part"]["value"], str)
    assert part["part"]["value"].startswith("line of log text\n")


async def test_small_results_and_errors_pass_through_unchanged(tmp_path: Path) -> None:
    """Small results, error results, unknown tools and JSON-RPC errors read as they do upstream."""
    names = ("small", "fails", "nosuch")
    async with Client(upstream_params()) as direct:
        expected = [await direct.call_tool(name, {}) for name in names]
    async with proxied(tmp_path) as client:
        got = [await client.call_tool(name, {}) for name in names]
        with pytest.raises(MCPError) as raised:
            await client.call_tool("rpc_error", {})
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.is_error == theirs.is_error
        assert mine.content == theirs.content
    assert (raised.value.code, raised.value.message) == (-32042, "upstream protocol error")
    assert entry_files(store_root(tmp_path)) == set()


async def test_the_proxy_s_own_model_variables_are_withheld_from_the_upstream(
    tmp_path: Path,
) -> None:
    """The summarizer's API key reached every upstream server (a third party's code); the
    variables configuring the proxy's own model and store are withheld unless --pass-env
    names one, and everything else (the upstream's own token) passes on."""
    env = {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "RESPONSE_COMPACTION_MODEL": "m",
        "GIVEN_TOKEN": "t",
    }
    async with proxied(tmp_path, "--pass-env", "openai_base_url", **env) as client:
        result = await client.call_tool("env_names", {})
    assert result.structured_content == {"result": ["GIVEN_TOKEN", "OPENAI_BASE_URL"]}


async def test_an_upstream_tool_named_like_the_read_tool(tmp_path: Path) -> None:
    """An upstream tool called read_exact stops the proxy before it serves (its tool would
    be shadowed); with --read-tool the proxy's own is named otherwise and both work."""
    env = {"UPSTREAM_READ_EXACT": "1", "PATH": os.environ.get("PATH", "")}
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    with pytest.raises(ValueError, match=r"named 'read_exact' too.*--read-tool"):
        async with open_proxy(sys.executable, [str(SERVER)], config(harness, env=env)):
            pass
    async with proxied(tmp_path, "--read-tool", "read_stored", **env) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        theirs = only_text(await client.call_tool("read_exact", {"exact_ref": "abc"}))
        ref = REF.search(only_text(await client.call_tool("big_json", {"count": 2000})))
        assert ref is not None
        part = await client.call_tool("read_stored", {"exact_ref": ref.group(0)})
    assert names.count("read_exact") == names.count("read_stored") == 1
    assert theirs == "upstream read_exact of 3 characters"
    assert isinstance(part.structured_content, dict)
    assert part.structured_content["state"] == "found"


# --------------------------------------------------------------------------- in-process


def config(harness: rc.Harness, above: int = 1000, **more: Any) -> ProxyConfig:
    options = {"fallback": FALLBACK, "ladder": "main", "summarize_above_bytes": above}
    return ProxyConfig(harness=harness, options=options, summary_schema=Summary, **more)


def text_result(*texts: str, structured: Any = None, error: bool = False) -> mt.CallToolResult:
    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=t) for t in texts],
        structured_content=structured,
        is_error=error,
    )


async def stored_value(harness: rc.Harness, text: str) -> Any:
    match = REF.search(text)
    assert match is not None
    found = await rc.response_compaction_read_exact(harness, match.group(0), Any)
    assert isinstance(found, rc.Found)
    return found.value


async def test_structured_content_without_text_is_retained(harness: rc.Harness) -> None:
    """Structured content with no text block is what is stored; non-text blocks stay."""
    data = {"rows": list(range(2000))}
    image = mt.ImageContent(type="image", data="aGk=", mime_type="image/png")
    result = mt.CallToolResult(content=[image], structured_content=data)
    out = await compact_tool_result(result, config(harness))
    assert out.content[1] == image
    assert out.structured_content is None
    assert await stored_value(harness, out.content[0].text) == data


async def test_an_embedded_text_resource_is_compacted_as_text(harness: rc.Harness) -> None:
    """A large embedded text resource went through whole; its text is now retained and cut.

    The reply keeps a link to its URI and any other block as it came.
    """
    value = {"rows": [f"line {i} " + "y" * 40 for i in range(4000)]}
    rows = msgspec.json.encode(value).decode()
    uri, mime = "file:///logs/a.json", "application/json"
    text = mt.TextResourceContents(uri=uri, mime_type=mime, text=rows)
    image = mt.ImageContent(type="image", data="aGk=", mime_type="image/png")
    resource = mt.EmbeddedResource(type="resource", resource=text)
    result = mt.CallToolResult(content=[mt.TextContent(type="text", text="see"), resource, image])
    out = await compact_tool_result(result, config(harness))
    assert len(out.model_dump_json()) < 20_000
    link = out.content[1]
    assert (link.type, str(link.uri), link.mime_type) == ("resource_link", uri, mime)
    assert out.content[2] == image
    assert await stored_value(harness, out.content[0].text) == ["see", value]


async def test_text_that_is_not_the_structured_content_is_kept_beside_it(
    harness: rc.Harness,
) -> None:
    """Text that does not serialize the structured content is stored beside it."""
    data = {"rows": list(range(2000))}
    out = await compact_tool_result(text_result("see rows", structured=data), config(harness))
    stored = await stored_value(harness, out.content[0].text)
    assert stored == {"content": "see rows", "structured_content": data}


async def test_text_that_serializes_structured_content_is_stored_once(
    harness: rc.Harness,
) -> None:
    """The usual pair (JSON text + the same structured content) is stored as the one value."""
    data = {"rows": list(range(2000))}
    result = text_result(msgspec.json.encode(data).decode(), structured=data)
    out = await compact_tool_result(result, config(harness))
    assert await stored_value(harness, out.content[0].text) == data


async def test_structured_content_python_calls_equal_to_the_text_is_kept_beside_it(
    harness: rc.Harness,
) -> None:
    """``True == 1 == 1.0`` in Python, not in JSON: structured content that differs from the
    text only so is stored beside it, not dropped for the text's version."""
    text = '{"approved": true, "amount": 1, "rows": ' + json_rows(2000) + "}"
    data = {"approved": 1, "amount": 1.0, "rows": msgspec.json.decode(json_rows(2000))}
    out = await compact_tool_result(text_result(text, structured=data), config(harness))
    stored = await stored_value(harness, out.content[0].text)
    assert stored == {"content": msgspec.json.decode(text), "structured_content": data}
    assert type(stored["content"]["approved"]) is bool
    assert type(stored["structured_content"]["approved"]) is int
    assert type(stored["structured_content"]["amount"]) is float


async def test_a_result_the_store_fails_to_retain_passes_through_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream tool has run: a store that cannot be opened (its root is a file) leaves the
    host its result as it came, not an internal error; the warning names no content."""
    (tmp_path / "file").write_bytes(b"")
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "file"), llm=None)
    result = text_result(MARKER * 200)
    with caplog.at_level(logging.WARNING, logger="response_compaction"):
        assert await compact_tool_result(result, config(harness)) is result
    (message,) = [r.getMessage() for r in caplog.records if "uncompacted" in r.getMessage()]
    assert "could not be stored" in message
    assert MARKER not in caplog.text


async def test_a_store_that_cannot_be_opened_stops_the_proxy_before_it_starts(
    tmp_path: Path,
) -> None:
    """Not a proxy that passes every large result on uncompacted, with a warning each time."""
    (tmp_path / "file").write_bytes(b"")
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "file"), llm=None)
    started = tmp_path / "started"
    with pytest.raises(rc.UnsafeStoreError, match="not a directory"):
        async with open_proxy("sh", ["-c", f"touch {started}"], config(harness)):
            pass
    assert not started.exists()


@pytest.mark.parametrize("script", ["exit 0", "echo hello", "exit 3"])
async def test_an_upstream_that_ends_before_initialize_is_one_error(
    harness: rc.Harness, script: str
) -> None:
    """Not the SDK's group of task errors (a 90-line traceback from the CLI)."""
    with pytest.raises(ConnectionError, match="'sh' ended or failed before it answered"):
        async with open_proxy("sh", ["-c", script], config(harness)):
            pass


async def test_text_bytes_below_the_agent_text_floor_is_refused_before_starting(
    harness: rc.Harness, tmp_path: Path
) -> None:
    """Not once a large result has been stored: every such call would then fail."""
    started = tmp_path / "started"
    cfg = config(harness, text_bytes=500)
    with pytest.raises(ValueError, match="text_bytes must be >= 1024"):
        async with open_proxy("sh", ["-c", f"touch {started}"], cfg):
            pass
    assert not started.exists()


async def test_text_decoding_to_infinity_is_kept_as_text(harness: rc.Harness) -> None:
    """JSON that canonical form refuses (1e999) is retained as the text it was."""
    text = "[" + ",".join(["1e999"] * 400) + "]"
    out = await compact_tool_result(text_result(text), config(harness))
    assert await stored_value(harness, out.content[0].text) == text


async def test_json_text_naming_a_key_twice_is_kept_as_text(harness: rc.Harness) -> None:
    """Text with a duplicate key is stored as the text, not as the value missing one member."""
    text = '{"a": 1, "a": 2, "rows": [' + ",".join(["1"] * 2000) + "]}"
    out = await compact_tool_result(text_result(text), config(harness))
    assert await stored_value(harness, out.content[0].text) == text


async def test_error_results_are_never_compacted(harness: rc.Harness) -> None:
    """An isError result goes back as it came, however large."""
    result = text_result("x" * 5000, error=True)
    assert await compact_tool_result(result, config(harness)) is result


async def test_text_nested_too_deeply_to_decode_is_kept_as_text(harness: rc.Harness) -> None:
    """JSON text deeper than the decoder's recursion bound is retained as the text it is."""
    text = "[" * 5000 + "]" * 5000
    out = await compact_tool_result(text_result(text), config(harness))
    assert await stored_value(harness, out.content[0].text) == text


@pytest.mark.parametrize(
    "result",
    [
        mt.CallToolResult(content=[], structured_content={"x": [math.nan] * 400, "k": MARKER}),
        text_result("\ud800" + MARKER * 100),
        mt.CallToolResult(content=[], structured_content=nested(5000, {"k": MARKER * 100})),
        mt.CallToolResult(content=[], structured_content={"n": 10**5000, "k": MARKER}),
    ],
    ids=["NaN", "lone surrogate", "too deep", "5,000 digits"],
)
async def test_a_result_that_cannot_be_retained_passes_through_with_a_warning(
    harness: rc.Harness, result: mt.CallToolResult, caplog: pytest.LogCaptureFixture
) -> None:
    """The call still answers: the result as it came (nothing stored), and a warning that
    names the reason's type, never the content."""
    with caplog.at_level(logging.WARNING, logger="response_compaction"):
        assert await compact_tool_result(result, config(harness)) is result
    assert [r.getMessage() for r in caplog.records if "uncompacted" in r.getMessage()]
    assert MARKER not in caplog.text
    assert entry_files(store_root(harness.fs)) == set()


async def test_the_proxys_own_configuration_failing_is_an_error_not_a_pass_through(
    harness: rc.Harness,
) -> None:
    """A summary schema strict output cannot express, or a fallback function whose result
    is no summary, is raised once: not taken for a result that cannot be retained (which
    would pass every large result on uncompacted), nor compacted again as text."""
    cfg = ProxyConfig(
        harness=harness,
        options={"fallback": {}, "ladder": "main", "summarize_above_bytes": 1000},
        summary_schema=dict[str, Any],
    )
    with pytest.raises(rc.SchemaError):
        await compact_tool_result(text_result("x" * 5000), cfg)
    calls: list[int] = []

    def fallback(profile: rc.Profile) -> Any:
        calls.append(profile.record_count)
        return {"overview": 1}

    options = {"fallback": fallback, "ladder": "main", "summarize_above_bytes": 1000}
    cfg = ProxyConfig(harness=harness, options=options, summary_schema=Summary)
    with pytest.raises(ValueError, match="fallback function"):
        await compact_tool_result(text_result(json_rows(2000)), cfg)
    assert len(calls) == 1
    assert len(entry_files(store_root(harness.fs))) == 1


def json_rows(count: int) -> str:
    return msgspec.json.encode({"rows": list(range(count))}).decode()
