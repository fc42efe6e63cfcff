"""Large builtins and ``msgspec.Raw`` inputs: converted in slices, same value, loop kept turning."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import canonical_bytes, to_exact_value
from response_compaction._convert import SLICE_ITEMS_FROM, convert_exact, release
from response_compaction._raw import RAW_FROM
from tests._store_support import compact
from tests.schemas import Exact, Row, big_exact

pytestmark = pytest.mark.anyio

ROWS = 32_000  # over RAW_FROM as JSON text, over SLICE_ITEMS_FROM as builtins


class Keyed(msgspec.Struct, frozen=True):
    """A row whose keys the schema parses: two spellings of one UUID become one key."""

    id: int
    weights: dict[uuid.UUID, int]


class KeyedRows(msgspec.Struct, frozen=True):
    rows: list[Keyed]


def test_inputs_are_large_enough_to_be_cut() -> None:
    """The inputs here are over both thresholds, so the sliced paths are the ones tested."""
    assert ROWS >= SLICE_ITEMS_FROM
    assert len(msgspec.json.encode(big_exact(ROWS))) >= 2 * RAW_FROM


def _inputs(value: Any) -> dict[str, Any]:
    return {"builtins": msgspec.to_builtins(value), "raw": msgspec.Raw(msgspec.json.encode(value))}


class _Heartbeat:
    """A task that counts its own turns of the loop, and what a checkpoint saw of them."""

    def __init__(self) -> None:
        self.ticks = 0
        self.seen: list[int] = []
        self.stop = anyio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            self.ticks += 1
            await anyio.lowlevel.checkpoint()

    async def checkpoint(self) -> None:
        # Wait for the heartbeat's next turn (schedulers may run tasks in any order per batch).
        self.seen.append(self.ticks)
        while self.ticks == self.seen[-1]:
            await anyio.lowlevel.checkpoint()


async def _converted_with_heartbeat(given: Any, schema: Any) -> tuple[Any, _Heartbeat]:
    beat = _Heartbeat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        await anyio.lowlevel.checkpoint()  # the heartbeat has started
        try:
            value, _ = await convert_exact(given, schema, beat.checkpoint)
        finally:
            beat.stop.set()
    return value, beat


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_large_input_converts_to_the_typed_value(kind: str) -> None:
    """A long list given as builtins or Raw JSON becomes the typed value, canonical bytes alike."""
    typed = big_exact(ROWS)
    value, _ = await _converted_with_heartbeat(_inputs(typed)[kind], Exact)
    assert value == typed
    assert canonical_bytes(value) == canonical_bytes(typed)


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_top_level_list_converts_in_slices(kind: str) -> None:
    """A top-level ``list[T]`` input is cut too, and gives the same list as a whole conversion."""
    typed = big_exact(ROWS).rows
    value, beat = await _converted_with_heartbeat(_inputs(typed)[kind], list[Row])
    assert value == typed
    assert len(beat.seen) > 2


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_loop_keeps_turning_during_conversion(kind: str) -> None:
    """The conversion yields between slices, and the heartbeat task runs at each of those yields."""
    _, beat = await _converted_with_heartbeat(_inputs(big_exact(ROWS))[kind], Exact)
    assert len(beat.seen) > 2
    assert beat.seen == sorted(set(beat.seen))  # it ticked between every two slices


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_receipt_matches_the_typed_value(harness: rc.Harness, kind: str) -> None:
    """Compacting the builtins or Raw form stores the very entry the typed value does."""
    typed = big_exact(ROWS)
    handed = _inputs(typed)[kind]
    given = await compact(harness, handed, summarize_above_bytes=1024)
    expected = await compact(harness, typed, summarize_above_bytes=1024)
    assert given.receipt.exact_digest == expected.receipt.exact_digest
    # The converted rows are freed gradually; what the caller handed over is left alone.
    assert handed == _inputs(typed)[kind]
    assert typed == big_exact(ROWS)
    assert given.receipt.exact_bytes == expected.receipt.exact_bytes
    assert expected.receipt.exact_cache == "reused"


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_invalid_item_deep_inside_names_its_path(kind: str) -> None:
    """A wrong type far inside the long list is refused with its path in the whole input."""
    plain = msgspec.to_builtins(big_exact(ROWS))
    plain["rows"][ROWS - 7]["id"] = "secret-value"
    given = plain if kind == "builtins" else msgspec.Raw(msgspec.json.encode(plain))
    with pytest.raises(ValueError, match="does not validate") as whole:
        to_exact_value(given, Exact)
    with pytest.raises(ValueError, match="does not validate") as sliced:
        await convert_exact(given, Exact, anyio.lowlevel.checkpoint)
    assert str(sliced.value) == str(whole.value)
    assert f"`$.rows[{ROWS - 7}].id`" in str(sliced.value)
    assert "secret" not in str(sliced.value)


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_merged_keys_deep_inside_are_refused(kind: str) -> None:
    """Two keys the schema reads as one, far inside the long list, are still refused."""
    key = "12345678-1234-5678-1234-567812345678"
    plain: dict[str, Any] = {"rows": [{"id": i, "weights": {key: i}} for i in range(ROWS)]}
    plain["rows"][ROWS - 3]["weights"] = {key: 1, key.replace("-", ""): 2}
    given = plain if kind == "builtins" else msgspec.Raw(msgspec.json.encode(plain))
    with pytest.raises(ValueError, match="reads as one key") as whole:
        to_exact_value(given, KeyedRows)
    with pytest.raises(ValueError, match="reads as one key") as sliced:
        await convert_exact(given, KeyedRows, anyio.lowlevel.checkpoint)
    assert str(sliced.value) == str(whole.value)
    assert f"`$.rows[{ROWS - 3}].weights`" in str(sliced.value)


async def test_nan_deep_inside_builtins_is_refused(harness: rc.Harness) -> None:
    """A NaN far inside a builtins list is refused before anything is stored, as for typed."""
    plain = msgspec.to_builtins(big_exact(ROWS))
    plain["rows"][ROWS - 5]["score"] = float("nan")
    with pytest.raises(ValueError, match=rf"NaN or infinity at `\$\.rows\[{ROWS - 5}\]\.score`"):
        await compact(harness, plain)


def _rows_text(rows: int = ROWS) -> bytes:
    return msgspec.json.encode(big_exact(rows))


async def test_duplicate_key_deep_inside_raw_is_refused() -> None:
    """JSON text naming one key twice far inside the long array is refused with its path."""
    text = _rows_text()
    at = text.rindex(b'{"id":')
    given = msgspec.Raw(text[:at] + b'{"id":1,' + text[at + 1 :])
    with pytest.raises(ValueError, match="names one key twice") as whole:
        to_exact_value(given, Exact)
    with pytest.raises(ValueError, match="names one key twice") as sliced:
        await convert_exact(given, Exact, anyio.lowlevel.checkpoint)
    assert str(sliced.value) == str(whole.value)
    assert f"`$[...][{ROWS - 1}]`" in str(sliced.value)


@pytest.mark.parametrize("broken", [b",,", b", ,", b",]", b"]"])
async def test_malformed_raw_deep_inside_gives_the_whole_error(broken: bytes) -> None:
    """Text broken far inside the array (a stray comma, an early end) gets msgspec's own error."""
    text = _rows_text()
    at = text.rindex(b',{"id":')
    given = msgspec.Raw(text[:at] + broken + text[at + 1 :])
    with pytest.raises(ValueError, match="malformed") as whole:
        to_exact_value(given, Exact)
    with pytest.raises(ValueError, match="malformed") as sliced:
        await convert_exact(given, Exact, anyio.lowlevel.checkpoint)
    assert str(sliced.value) == str(whole.value)


class Wrapper(msgspec.Struct, frozen=True):
    meta: dict[str, Any]
    rows: list[Row]


async def test_raw_cuts_only_the_top_level_array() -> None:
    """A nested key spelled like the list field, met first, is not mistaken for the field."""
    rows = big_exact(ROWS).rows
    nested = {"rows": [1, "two"]}  # not Row items: cutting this would refuse a valid input
    text = msgspec.json.encode({"meta": nested, "rows": rows})
    value, _ = await convert_exact(msgspec.Raw(text), Wrapper, anyio.lowlevel.checkpoint)
    assert value == Wrapper(meta=nested, rows=rows)


async def test_raw_with_whitespace_and_top_level_key_twice() -> None:
    """Pretty-printed text converts alike, and a top-level key given twice is still refused."""
    typed = big_exact(ROWS)
    pretty = msgspec.json.format(msgspec.json.encode(typed), indent=2)
    value, beat = await _converted_with_heartbeat(msgspec.Raw(pretty), Exact)
    assert value == typed
    assert len(beat.seen) > 2
    twice = msgspec.Raw(pretty[:-1] + b', "rows": []}')
    with pytest.raises(ValueError, match=r"names one key twice at `\$`"):
        await convert_exact(twice, Exact, anyio.lowlevel.checkpoint)


async def test_release_empties_only_the_list_it_was_given() -> None:
    """``release`` empties the converted list slice by slice, yielding between slices."""
    plain = msgspec.to_builtins(big_exact(ROWS))
    value, owned = await convert_exact(plain, Exact, anyio.lowlevel.checkpoint)
    assert owned is not None
    assert len(owned) == 1
    assert owned[0] is value.rows
    steps: list[int] = []

    async def checkpoint() -> None:
        steps.append(len(value.rows))
        await anyio.lowlevel.checkpoint()

    await release(owned, checkpoint)
    assert value.rows == []
    assert owned == []
    assert len(steps) > 2
    assert steps == sorted(steps, reverse=True)
    assert len(plain["rows"]) == ROWS
