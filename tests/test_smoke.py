"""The shortest path through the library: small value in, exact value out, read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import response_compaction as rc
from tests.schemas import FALLBACK, Exact, Row, Summary

pytestmark = pytest.mark.anyio


async def test_small_response_comes_back_exact_and_reads_back(harness: rc.Harness) -> None:
    """A response under the threshold is handed back as is, and its reference reads Found."""
    value = Exact(rows=[Row(id=1, name="a")], total=1)
    compacted = await rc.response_compact(
        harness, value, Exact, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
    )
    assert compacted.output.kind == "exact"
    assert compacted.output.value == value
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=value)


async def test_any_as_the_exact_schema_round_trips(harness: rc.Harness) -> None:
    """typing.Any is a valid exact schema: builtins go in and come back out."""
    document = {"b": [1, 2.5, None], "a": "small"}
    # Annotated: for the expression ``typing.Any`` mypy infers typeshed's ``class Any``.
    compacted: rc.Compacted[Any, Summary] = await rc.response_compact(
        harness, document, Any, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
    )
    assert compacted.output == rc.ExactOutput(value=document)
    read: rc.Found[Any] | rc.Missing | rc.Broken
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    assert read == rc.Found(value=document)


async def test_an_unwritable_workspace_is_a_store_error(tmp_path: Path) -> None:
    """A workspace that cannot hold the store raises StoreError (an OSError), not a receipt."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    harness = rc.Harness(fs=rc.LocalWorkspace(blocker / "ws"), llm=None)
    value = Exact(rows=[Row(id=1, name="a")], total=1)
    with pytest.raises(rc.StoreError) as caught:
        await rc.response_compact(
            harness, value, Exact, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
        )
    assert isinstance(caught.value, OSError)
    assert caught.value.errno is not None
