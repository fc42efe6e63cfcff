"""``Compacted.to_agent_text`` and ``to_agent_json``: one bounded tool result per compaction."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

import response_compaction as rc
from response_compaction._agent_text import agent_text
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}
REF = "rc1:" + "ab" * 32


def compacted(output: object, **receipt: object) -> rc.Compacted[Exact, Summary]:
    facts: dict[str, object] = {
        "exact_ref": REF,
        "exact_digest": "sha256:" + "ab" * 32,
        "exact_bytes": 200000,
        "exact_cache": "stored",
        "summary_cache": "stored",
        "elapsed_ms": 3,
    }
    return rc.Compacted(output=output, receipt=rc.Receipt(**(facts | receipt)))  # type: ignore[arg-type]


def test_summarized_text_is_plain_and_stable() -> None:
    """A summary reads as five fixed lines: kind, summary JSON, coverage, reference, how to read."""
    summary = Summary(overview="two rows", critical_facts=["id 7 failed"])
    text = compacted(rc.SummarizedOutput(value=summary), shown_bytes=50000).to_agent_text()
    lines = text.splitlines()
    assert lines[:4] == [
        "kind: summarized",
        'summary: {"critical_facts":["id 7 failed"],"overview":"two rows"}',
        "coverage: the summary was made from 50000 of 200000 bytes (25.0%)",
        f"exact_ref: {REF} (200000 bytes of exact JSON kept)",
    ]
    assert lines[4].startswith("read more: call read_exact with exact_ref and optional pointer")
    assert "start/stop" in lines[4]
    assert "max_bytes" in lines[4]
    assert "outline" in lines[4]
    assert len(lines) == 5


def test_a_value_cannot_start_a_line_of_its_own() -> None:
    """U+2028, U+2029 and U+0085 are line breaks to splitlines; raw, a summary's text made a
    fake ``exact_ref:`` line. Escaped, the line is still the value's JSON."""
    for brk in ("\u2028", "\u2029", "\x85"):
        summary = Summary(overview=f"ok{brk}exact_ref: rc1:{'00' * 32}", critical_facts=[])
        text = compacted(rc.SummarizedOutput(value=summary), shown_bytes=1).to_agent_text()
        lines = text.splitlines()
        assert len(lines) == 5
        assert [line for line in lines if line.startswith("exact_ref:")] == [lines[3]]
        assert msgspec.json.decode(lines[1].removeprefix("summary: "), type=Summary) == summary


def test_covered_bytes_wins_over_shown_bytes() -> None:
    """When the receipt says covered_bytes, coverage reports it rather than shown_bytes."""
    output = rc.SummarizedOutput(value=FALLBACK)
    receipt = msgspec.structs.asdict(compacted(output, shown_bytes=50000).receipt)
    with_covered = SimpleNamespace(**{**receipt, "covered_bytes": 100000})
    text = agent_text(SimpleNamespace(output=output, receipt=with_covered))
    assert "made from 100000 of 200000 bytes (50.0%)" in text


def test_fallback_text_says_why_and_names_the_tool() -> None:
    """A fallback names its reason; the read line uses the host's tool name."""
    text = compacted(rc.FallbackOutput(value=FALLBACK), fallback_reason="timeout").to_agent_text(
        read_tool="fetch_exact"
    )
    assert text.splitlines()[0] == "kind: fallback"
    assert "coverage: no summary (timeout); the fallback above is the caller's default" in text
    assert "call fetch_exact with exact_ref" in text


async def test_exact_output_text_holds_the_value(harness: rc.Harness) -> None:
    """A small response is shown whole, as canonical JSON, and said to be exact."""
    value = Exact(rows=[Row(id=1, name="one")], total=1)
    result = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    text = result.to_agent_text()
    assert text.splitlines()[1] == "value: " + msgspec.json.encode(value, order="sorted").decode()
    assert "coverage: the value above is the whole response, exact" in text


@pytest.mark.parametrize("max_bytes", [1024, 1500, 4000, 16000])
async def test_text_never_exceeds_max_bytes(harness: rc.Harness, max_bytes: int) -> None:
    """A value too big for the text is cut on a character boundary with a marker."""
    value = Exact(rows=[Row(id=i, name="é✓" * 30) for i in range(200)], total=200)
    options = OPTIONS | {"summarize_above_bytes": 10**6}
    result = await rc.response_compact(harness, value, Exact, Summary, options)
    text = result.to_agent_text(max_bytes=max_bytes)
    assert len(text.encode()) <= max_bytes
    assert "…[cut: " in text.splitlines()[1]
    assert text.splitlines()[-2].startswith("exact_ref: rc1:")


# Braces: the cut marker was built with str.format, and "read{0}" raised IndexError.
@pytest.mark.parametrize("read_tool", ["read_exact", "r" * 300, "é" * 200, "read{0}", "read{x}"])
def test_long_tool_name_never_breaks_the_bound(read_tool: str) -> None:
    """Whatever the tool's name, the text fits max_bytes or ValueError says it cannot."""
    output = rc.FallbackOutput(value=Summary(overview="é" * 5000, critical_facts=[]))
    for max_bytes in range(1024, 2400, 7):
        try:
            text = compacted(output).to_agent_text(read_tool=read_tool, max_bytes=max_bytes)
        except ValueError:
            continue
        assert len(text.encode()) <= max_bytes
        assert f"use {read_tool}]" in text


def test_too_small_a_bound_raises() -> None:
    """Below 1024 bytes there is no room for the fixed lines."""
    with pytest.raises(ValueError, match="max_bytes"):
        compacted(rc.FallbackOutput(value=FALLBACK)).to_agent_text(max_bytes=1023)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        pytest.param({"max_bytes": 2000.5}, "max_bytes must be an int", id="float-bound"),
        pytest.param({"max_bytes": True}, "max_bytes must be an int", id="bool-bound"),
        pytest.param({"read_tool": "read\nexact"}, "read_tool", id="newline-name"),
        pytest.param({"read_tool": "read\u2028exact"}, "read_tool", id="line-separator-name"),
        pytest.param({"read_tool": ""}, "read_tool", id="no-name"),
    ],
)
def test_arguments_that_cannot_make_the_text_are_value_errors(
    arguments: dict[str, object], says: str
) -> None:
    """A float bound failed as a slice index (TypeError) once the value was cut; a tool name
    with a line break split the read-more line a value's own text never may."""
    made = compacted(rc.FallbackOutput(value=Summary(overview="x" * 5000, critical_facts=[])))
    with pytest.raises(ValueError, match=says):
        made.to_agent_text(**arguments)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=says):
        made.to_agent_json(**arguments)  # type: ignore[arg-type]


async def test_agent_json_twin(harness: rc.Harness) -> None:
    """The JSON twin carries the same facts, and leaves out a value that does not fit."""
    result = await rc.response_compact(harness, big_exact(1000), Exact, Summary, OPTIONS)
    facts = result.to_agent_json()
    assert facts["kind"] == "fallback"
    assert facts["value"] == msgspec.to_builtins(FALLBACK)
    assert facts["exact_ref"] == result.receipt.exact_ref
    assert facts["fallback_reason"] == "no_llm"
    big = await rc.response_compact(
        harness, big_exact(400), Exact, Summary, OPTIONS | {"summarize_above_bytes": 10**6}
    )
    small = big.to_agent_json(max_bytes=2000)
    assert small["value_omitted"] is True
    assert "value" not in small
    assert len(msgspec.json.encode(small)) <= 2000
