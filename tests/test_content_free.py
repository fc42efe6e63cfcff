"""Validation errors name paths and kinds of failure, never a value or key of the response."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

import response_compaction as rc
from response_compaction._messages import content_free
from tests.schemas import FALLBACK, Summary, Ticket

pytestmark = pytest.mark.anyio

SECRET = "sk-live-SECRET-TOKEN-123"  # noqa: S105 - a fake secret the messages must not echo
EMAIL = "alice@example.com"
PIN = 4821
OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


class Left(msgspec.Struct, tag=True):
    a: int


class Right(msgspec.Struct, tag=True):
    b: int


class Checked(msgspec.Struct):
    n: int

    def __post_init__(self) -> None:
        raise ValueError(f"n must be small, got {self.n}")


class Nested(msgspec.Struct, forbid_unknown_fields=True):
    inner: Ticket


def _error(data: bytes, schema: Any) -> msgspec.ValidationError | msgspec.DecodeError:
    try:
        msgspec.json.decode(data, type=schema)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return exc
    raise AssertionError("decoded")


# (document, schema, what the message must say, what it must never say)
_CASES: list[tuple[str, bytes, Any, str, str]] = [
    (
        "enum str",
        b'{"state":"%s"}' % SECRET.encode(),
        Ticket,
        "Invalid enum value - at `$.state`",
        SECRET,
    ),
    ("enum int", b"%d" % PIN, Literal[1, 2], "Invalid enum value - at `$`", str(PIN)),
    (
        "tag",
        b'{"type":"%s"}' % SECRET.encode(),
        Left | Right,
        "Invalid value - at `$.type`",
        SECRET,
    ),
    (
        "unknown top",
        b'{"state":"open","%s":1}' % EMAIL.encode(),
        Ticket,
        "unknown field - at `$`",
        EMAIL,
    ),
    (
        "unknown nested",
        b'{"inner":{"state":"open","%s":1}}' % EMAIL.encode(),
        Nested,
        "unknown field - at `$.inner`",
        EMAIL,
    ),
    ("post_init", b'{"n":%d}' % PIN, Checked, "schema - at `$`", str(PIN)),
    ("post_init nested", b'[{"n":%d}]' % PIN, list[Checked], "- at `$[0]`", str(PIN)),
    ("dict key", b'{"%s":1}' % SECRET.encode(), dict[int, int], "at `key` in `$`", SECRET),
    (
        "type",
        b'{"state":"open","pin":"%s"}' % SECRET.encode(),
        Ticket,
        "Expected `int`, got `str` - at `$.pin`",
        SECRET,
    ),
    (
        "bound",
        b'{"state":"open","pin":-%d}' % PIN,
        Ticket,
        "Expected `int` >= 0 - at `$.pin`",
        str(PIN),
    ),
    ("missing", b"{}", Ticket, "Object missing required field `state` - at `$`", "\x00"),
    ("malformed", b'{"state":"open" %s}' % SECRET.encode(), Ticket, "JSON is malformed", SECRET),
    ("truncated", b'{"state":"%s' % SECRET.encode(), Ticket, "Input data was truncated", SECRET),
]


@pytest.mark.parametrize(
    ("data", "schema", "says", "never"), [c[1:] for c in _CASES], ids=[c[0] for c in _CASES]
)
def test_content_free_keeps_the_path_and_drops_the_value(
    data: bytes, schema: Any, says: str, never: str
) -> None:
    """Each msgspec error becomes a message with its path and kind but no document content."""
    message = content_free(_error(data, schema))
    assert says in message
    assert never not in message
    assert "alice" not in message


async def test_compaction_refusal_quotes_no_content(tmp_path: Path, anyio_backend: str) -> None:
    """A response refused by its schema raises ValueError naming the path, not the value."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    for response in ({"state": SECRET}, msgspec.Raw(b'{"state":"open","%s":1}' % EMAIL.encode())):
        with pytest.raises(ValueError, match=r"at `\$") as caught:
            await rc.response_compact(harness, response, Ticket, Summary, OPTIONS)
        assert SECRET not in str(caught.value)
        assert EMAIL not in str(caught.value)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception reachable from it: causes and contexts, hidden or not."""
    found: list[BaseException] = []
    stack: list[BaseException | None] = [exc]
    while stack:
        node = stack.pop()
        if node is not None and all(node is not seen for seen in found):
            found.append(node)
            stack += [node.__cause__, node.__context__]
    return found


async def test_nothing_a_refusal_was_raised_from_quotes_content(
    tmp_path: Path, anyio_backend: str
) -> None:
    """``raise ... from None`` only hides the error it replaces: it stays the ``__context__``
    (msgspec's error quoting the value, a UnicodeEncodeError holding the text), reachable by
    any handler that walks the chain. None of the chain holds content."""
    import pydantic

    class Model(pydantic.BaseModel):
        state: Literal["open", "closed"]

    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    cases: list[tuple[Any, Any]] = [
        ({"state": SECRET}, Ticket),
        ({"state": SECRET}, Model),
        ({"k": SECRET + "\ud800"}, dict),
    ]
    for response, schema in cases:
        with pytest.raises(ValueError, match="exact_response") as caught:
            await rc.response_compact(harness, response, schema, Summary, OPTIONS)
        for node in _chain(caught.value):
            assert SECRET not in repr(node)
            assert all(SECRET not in repr(arg) for arg in node.args)


class Loose(msgspec.Struct, frozen=True):
    state: str
    pin: int = 0


async def test_broken_detail_quotes_no_content(tmp_path: Path, anyio_backend: str) -> None:
    """Read-back validation under a stricter schema is Broken with the path, not the value."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    stored = await rc.response_compact(harness, Loose(state=SECRET), Loose, Summary, OPTIONS)
    read = await rc.response_compaction_read_exact(harness, stored.receipt.exact_ref, Ticket)
    assert isinstance(read, rc.Broken)
    assert "at `$.state`" in read.detail
    assert SECRET not in read.detail


def test_cli_stderr_quotes_no_content(tmp_path: Path) -> None:
    """The CLI's one-line errors for a refused input and a broken read carry no content."""
    from tests.test_cli import REPO, cli

    document = json.dumps({"state": "open", EMAIL: SECRET}).encode()
    refused = cli(
        "compact",
        "-",
        "--root",
        tmp_path,
        "--schema",
        "tests.schemas:Ticket",
        stdin=document,
        cwd=REPO,
    )
    assert refused.returncode == 1
    assert b"unknown field - at `$`" in refused.stderr
    assert EMAIL.encode() not in refused.stderr
    assert SECRET.encode() not in refused.stderr
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    ref = rc.sync.response_compact(
        harness, {"state": SECRET}, Loose, Summary, OPTIONS
    ).receipt.exact_ref
    broken = cli("read", ref, "--root", tmp_path, "--schema", "tests.schemas:Ticket", cwd=REPO)
    assert broken.returncode == 4, broken.stderr
    assert b"at `$.state`" in broken.stderr
    assert SECRET.encode() not in broken.stderr
    assert sys.executable


async def test_mcp_tool_detail_quotes_no_content(tmp_path: Path, anyio_backend: str) -> None:
    """The MCP read_exact tool's broken detail names the path, not the value."""
    from mcp import Client

    from response_compaction.mcp import create_server

    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    stored = await rc.response_compact(harness, Loose(state=SECRET), Loose, Summary, OPTIONS)
    async with Client(create_server(harness, exact_schema=Ticket)) as client:
        result = await client.call_tool("read_exact", {"exact_ref": stored.receipt.exact_ref})
    assert isinstance(result.structured_content, dict)
    assert result.structured_content["state"] == "broken"
    assert "at `$.state`" in result.structured_content["detail"]
    assert SECRET not in str(result.structured_content)


def test_decode_of_deep_nesting_is_a_value_error() -> None:
    """Decoding bytes nested beyond the recursion limit raises ValueError, not RecursionError."""
    from response_compaction._canonical import decode_exact

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default: mypy's API (test_typing) raises it to 16k
    try:
        with pytest.raises(ValueError, match="nests too deeply"):
            decode_exact(b"[" * 5000 + b"]" * 5000, Any)
    finally:
        sys.setrecursionlimit(limit)
