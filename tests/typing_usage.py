"""What a user's type checker learns from the public API; checked by mypy in test_typing.py.

Never run: only type-checked. Each ``assert_type`` fails mypy if inference drifts.
"""

from __future__ import annotations

from typing import Any, assert_type

import msgspec

import response_compaction as rc
from response_compaction import sync


class Page(msgspec.Struct, frozen=True):
    rows: list[int]


class Summary(msgspec.Struct, frozen=True):
    gist: str


async def coroutines(harness: rc.Harness, page: Page) -> None:
    options = rc.CompactionOptions(fallback=Summary(gist=""), ladder="cheap")
    assert_type(options, rc.CompactionOptions[Summary])
    compacted = await rc.response_compact(harness, page, Page, Summary, options)
    assert_type(compacted, rc.Compacted[Page, Summary])
    output = compacted.output
    if isinstance(output, rc.ExactOutput):
        assert_type(output.value, Page)
    else:
        assert_type(output.value, Summary)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Page)
    assert_type(read, rc.Found[Page] | rc.Missing | rc.Broken)
    mapped = await rc.response_compact(harness, page, Page, Summary, {"ladder": "cheap"})
    assert_type(mapped, rc.Compacted[Page, Summary])
    # typing.Any as a schema is accepted (mypy binds typeshed's ``class Any``).
    loose: rc.Compacted[Any, Summary]
    loose = await rc.response_compact(harness, {"rows": []}, Any, Summary, {"ladder": "x"})
    untyped: rc.Found[Any] | rc.Missing | rc.Broken
    untyped = await rc.response_compaction_read_exact(harness, loose.receipt.exact_ref, Any)
    assert_type(untyped, rc.Found[Any] | rc.Missing | rc.Broken)
    loose_too = await rc.response_compact(harness, [1], list[int], dict[str, int], {})
    assert_type(loose_too, rc.Compacted[list[int], dict[str, int]])
    # A fallback function in the struct: mypy cannot infer S from ``S | Callable[..., S]``
    # given a function, so the summary type is spelled (a mapping needs nothing).
    made = rc.CompactionOptions[Summary](fallback=lambda p: Summary(gist=""), ladder="cheap")
    assert_type(made, rc.CompactionOptions[Summary])


def blocking(harness: rc.HarnessLike, page: Page) -> None:
    options = rc.CompactionOptions(fallback=Summary(gist=""), ladder="cheap")
    compacted = sync.response_compact(harness, page, Page, Summary, options)
    assert_type(compacted, rc.Compacted[Page, Summary])
    read = sync.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Page)
    assert_type(read, rc.Found[Page] | rc.Missing | rc.Broken)


class MyHarness:
    """Any object with ``.fs`` and ``.llm`` is a harness."""

    def __init__(self) -> None:
        self.fs = rc.LocalWorkspace("ws")
        self.llm: rc.SummaryModel | None = None


def structural(page: Page) -> rc.HarnessLike:
    harness = MyHarness()
    sync.response_compact(harness, page, Page, Summary, {"ladder": "x"})
    return harness
