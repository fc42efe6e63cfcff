"""A schema's own code, run in the library's worker threads, sees the caller's context.

anyio's worker threads run a call in a copy of the caller's ``contextvars`` context; the
asyncio backend's calls go through aiofiles (``loop.run_in_executor``), which copies none. A
``__post_init__`` or validator reading a context variable (a tenant, a request id) must see
the same thing on either loop, whether the value was decoded on the loop or in a worker.
"""

from __future__ import annotations

import contextvars

import msgspec
import pytest

import response_compaction as rc
from tests.schemas import FALLBACK, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

_TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
_SEEN: list[str] = []


class _Scoped(msgspec.Struct, frozen=True):
    """A schema with code of its own that reads a context variable at each decode."""

    rows: list[Row]
    total: int

    def __post_init__(self) -> None:
        _SEEN.append(_TENANT.get())


@pytest.mark.parametrize("rows", [1, 16_000], ids=["small", "medium"])
async def test_a_schemas_code_sees_the_callers_context_variables(
    harness: rc.Harness, rows: int
) -> None:
    value = _Scoped(rows=big_exact(rows).rows, total=rows)
    opts = {"fallback": FALLBACK, "ladder": "none", "summarize_above_bytes": 32_000}
    token = _TENANT.set("caller")
    try:
        _SEEN.clear()
        out = await rc.response_compact(harness, value, _Scoped, Summary, opts)
        found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, _Scoped)
    finally:
        _TENANT.reset(token)
    assert found == rc.Found(value=value)
    assert _SEEN
    assert set(_SEEN) == {"caller"}
