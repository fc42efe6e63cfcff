"""Large Raw and builtins inputs with a big ``dict[str, V]`` beside big lists: cut, same answers."""

from __future__ import annotations

import functools
from collections.abc import Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from response_compaction._canonical import to_exact_value
from response_compaction._convert import convert_exact
from response_compaction._raw import RAW_FROM
from response_compaction._raw_cut import SLICE_BYTES
from tests.schemas import Row
from tests.test_slices import CountingCheckpoint

pytestmark = pytest.mark.anyio

LABELS = 32_000  # over RAW_FROM on its own
DEEP = f"k{LABELS - 10:06d}"  # a label far inside the dict
# Values and keys that look like separators and brackets to a byte scan.
NOTES = ["plain", 'x,"y', '","', '{"n":1}', "a\\,b", "],[", "},{", '":{"n":']


class Cell(msgspec.Struct, frozen=True):
    n: int
    note: str = ""


class Mixed(msgspec.Struct, frozen=True):
    title: str
    labels: dict[str, Cell]
    words: list[str]
    rows: list[Row]


class Section(msgspec.Struct, frozen=True):
    title: str
    cells: list[Cell]


class Chapter(msgspec.Struct, frozen=True):
    id: int
    sections: list[Section]


class Book(msgspec.Struct, frozen=True):
    chapters: list[Chapter]
    title: str


def _key(i: int) -> str:
    return f'q{i},":{{' if i % 97 == 5 else f"k{i:06d}"


def _mixed() -> dict[str, Any]:
    return {
        "title": "t",
        "labels": {_key(i): {"n": i, "note": NOTES[i % len(NOTES)]} for i in range(LABELS)},
        "words": [NOTES[i % len(NOTES)] + str(i) for i in range(40_000)],
        "rows": [{"id": i, "name": "n" * 8, "tags": ["a"]} for i in range(20_000)],
    }


@functools.cache
def _text() -> bytes:
    return msgspec.json.encode(_mixed())


def _at(text: bytes, i: int) -> int:
    """Where label ``i``'s member starts in ``text``."""
    return text.index(msgspec.json.encode(_key(i)) + b":")


def _labels_end(text: bytes) -> int:
    """Where the labels object's closing brace is in ``text``."""
    return text.index(b',"words":') - 1


async def _same_error(given: Any, schema: Any) -> str:
    with pytest.raises(ValueError, match="exact_response") as whole:
        to_exact_value(given, schema)
    with pytest.raises(ValueError, match="exact_response") as sliced:
        await convert_exact(given, schema, CountingCheckpoint())
    assert str(sliced.value) == str(whole.value)
    return str(sliced.value)


def test_inputs_span_several_slices() -> None:
    """The labels alone span several slices, and the text is over the Raw threshold."""
    text = _text()
    assert len(text) > RAW_FROM
    assert _labels_end(text) - text.index(b'"labels"') > 3 * SLICE_BYTES


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_big_dict_and_lists_give_the_whole_value(kind: str) -> None:
    """A dict field and two list fields, all cut, give exactly the whole conversion's value."""
    given = _mixed() if kind == "builtins" else msgspec.Raw(_text())
    checkpoint = CountingCheckpoint()
    value, owned = await convert_exact(given, Mixed, checkpoint)
    assert value == to_exact_value(given, Mixed)
    assert owned is not None
    assert {id(c) for c in owned} == {id(value.labels), id(value.words), id(value.rows)}
    assert checkpoint.calls > 8  # the whole conversion has none


async def test_pretty_printed_text_is_cut_alike() -> None:
    """Whitespace around every member and element changes neither the cuts nor the value."""
    text = msgspec.json.format(_text(), indent=2)
    value, owned = await convert_exact(msgspec.Raw(text), Mixed, CountingCheckpoint())
    assert value == to_exact_value(msgspec.Raw(_text()), Mixed)
    assert owned is not None
    assert len(owned) == 3


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_a_top_level_dict_is_cut(kind: str) -> None:
    """A top-level ``dict[str, V]`` input is cut too, and gives the same mapping."""
    plain = _mixed()["labels"]
    given = plain if kind == "builtins" else msgspec.Raw(msgspec.json.encode(plain))
    checkpoint = CountingCheckpoint()
    value, owned = await convert_exact(given, dict[str, Cell], checkpoint)
    assert value == to_exact_value(given, dict[str, Cell])
    assert owned is not None
    assert owned[0] is value
    assert checkpoint.calls > 4


async def test_duplicate_key_inside_one_slice_is_refused() -> None:
    """A label given twice side by side is refused as the whole check refuses it."""
    text = _text()
    at = _at(text, LABELS - 40)
    given = msgspec.Raw(text[:at] + b'"k000001":{"n":0},' + text[at:])
    assert text.index(b'"k000001":') < at - 2 * SLICE_BYTES  # the first one: another slice
    message = await _same_error(given, Mixed)
    assert "names one key twice at `$[...]`" in message


async def test_duplicate_key_spanning_slices_equal_after_unescaping() -> None:
    """A key of an early slice spelled with escapes near the end is the same key: refused."""
    text = _text()
    end = _labels_end(text)
    given = msgspec.Raw(text[:end] + b',"\\u006b000001":{"n":3}' + text[end:])
    message = await _same_error(given, Mixed)
    assert "names one key twice at `$[...]`" in message


async def test_duplicate_key_in_a_nested_value_deep_in_the_dict() -> None:
    """A value's own object naming a key twice is refused with the whole check's path."""
    text = _text()
    at = _at(text, LABELS - 3)
    colon = text.index(b":{", at) + 2
    given = msgspec.Raw(text[:colon] + b'"n":1,' + text[colon:])
    message = await _same_error(given, Mixed)
    assert "names one key twice at `$[...][...]`" in message


async def test_duplicates_in_two_slices_of_a_list_name_the_whole_checks_one() -> None:
    """Two rows naming a key twice, far apart: the message is the one the whole check gives."""
    text = _text()
    first = text.index(b'{"id":10,')
    last = text.index(b'{"id":19990,')
    assert last - first > 3 * SLICE_BYTES
    given = msgspec.Raw(
        text[:first] + b'{"id":1,' + text[first + 1 : last] + b'{"id":1,' + text[last + 1 :]
    )
    message = await _same_error(given, Mixed)
    assert "`$[...][19990]`" in message


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_invalid_member_value_deep_in_the_dict(kind: str) -> None:
    """A wrong type far inside the dict is refused with the dict's path, no key, no value."""
    plain = _mixed()
    plain["labels"][DEEP]["n"] = "secret-value"
    given = plain if kind == "builtins" else msgspec.Raw(msgspec.json.encode(plain))
    message = await _same_error(given, Mixed)
    assert "`$.labels[...].n`" in message
    assert "secret" not in message
    assert DEEP not in message


async def test_a_key_of_the_wrong_type_in_builtins() -> None:
    """A non-string key deep in a builtins dict is refused as the whole conversion refuses it."""
    plain = _mixed()
    plain["labels"][12345] = {"n": 1}
    message = await _same_error(plain, Mixed)
    assert "`$.labels`" in message


@pytest.mark.parametrize("kind", ["builtins", "raw"])
async def test_an_earlier_field_error_comes_first(kind: str) -> None:
    """An error before the dict and one inside it: the earlier is named, as by the whole."""
    plain = _mixed()
    plain["title"] = 5
    plain["labels"][DEEP]["n"] = "x"
    given = plain if kind == "builtins" else msgspec.Raw(msgspec.json.encode(plain))
    message = await _same_error(given, Mixed)
    assert "`$.title`" in message


@pytest.mark.parametrize("broken", [b",,", b"}", b',"k"', b'{"n":'])
async def test_malformed_text_inside_the_dict_gives_the_whole_error(broken: bytes) -> None:
    """Text broken far inside the dict gets msgspec's own error, byte offset and all."""
    text = _text()
    at = _at(text, LABELS - 20) - 1
    await _same_error(msgspec.Raw(text[:at] + broken + text[at + 1 :]), Mixed)


async def test_nested_lists_of_objects_are_cut_between_top_level_elements() -> None:
    """Chapters full of ``,{`` separators of nested lists are still cut, between chapters."""
    cells = [Cell(n=i, note="x") for i in range(40)]
    chapters = [
        Chapter(id=c, sections=[Section(title=f"s{s}", cells=cells) for s in range(30)])
        for c in range(100)
    ]
    typed = Book(chapters=chapters, title="b")
    text = msgspec.json.encode(typed)
    assert len(text) > 2 * RAW_FROM
    checkpoint = CountingCheckpoint()
    value, owned = await convert_exact(msgspec.Raw(text), Book, checkpoint)
    assert value == typed
    assert owned is not None  # cut, not decoded whole after failed cuts
    assert owned[0] is value.chapters
    assert checkpoint.calls > 8


async def test_loop_turns_between_slices_of_the_dict() -> None:
    """Another task runs between the slices: the conversion yields to the loop, both inputs."""
    ticks = 0
    stop = anyio.Event()

    async def heartbeat() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await anyio.lowlevel.checkpoint()

    seen: list[int] = []

    async def checkpoint() -> None:
        seen.append(ticks)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        await anyio.lowlevel.checkpoint()
        for given in (_mixed()["labels"], msgspec.Raw(msgspec.json.encode(_mixed()["labels"]))):
            await convert_exact(given, dict[str, Cell], checkpoint)
        stop.set()
    assert len(seen) > 8
    assert seen[-1] - seen[0] >= len(seen) // 2  # the heartbeat ran at most of the yields


# ----------------------------------------------------------------------------- a property


def _now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine whose checkpoints never suspend, without a loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the coroutine suspended")


async def _no_turn() -> None:
    return None


_EDITS: dict[str, bytes] = {
    "dup-adjacent": b'"k000002":{"n":0},',
    "dup-escaped": b'"\\u006b00000\\u0032":{"n":0},',
    "tricky-key": b'"a,\\"b\\":{":{"n":0,"note":"},{\\",\\""},',
    "bad-value": b'"z1":{"n":"s"},',
    "nested-dup": b'"z2":{"n":1,"n":2},',
    "stray-comma": b",",
    "open-brace": b"{",
}


@settings(max_examples=40, deadline=None)  # each example decodes 2 MB twice
@given(edit=st.sampled_from(sorted(_EDITS)), where=st.integers(min_value=3, max_value=LABELS - 1))
def test_edits_anywhere_in_the_dict_answer_as_the_whole(edit: str, where: int) -> None:
    """Whatever is inserted before any label, the sliced decode answers as the whole decode."""
    text = _text()
    at = _at(text, where)
    given = msgspec.Raw(text[:at] + _EDITS[edit] + text[at:])
    try:
        expected: Any = to_exact_value(given, Mixed)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: Any = _now(convert_exact(given, Mixed, _no_turn))[0]
    except ValueError as exc:
        got = str(exc)
    assert got == expected


class Meta(msgspec.Struct, frozen=True):
    x: int


class WithMeta(msgspec.Struct, frozen=True):
    meta: Meta
    labels: dict[str, Cell]


async def test_a_nested_missing_field_before_the_dict_comes_first() -> None:
    """A nested object missing a field before the dict is named first, as by the whole."""
    plain = {"meta": {}, "labels": _mixed()["labels"]}
    plain["labels"][DEEP]["n"] = "x"
    message = await _same_error(msgspec.Raw(msgspec.json.encode(plain)), WithMeta)
    assert "missing required field `x` - at `$.meta`" in message


async def test_a_missing_top_level_field_comes_after_the_dict() -> None:
    """A top-level field missing and a bad member in the dict: the member is named first."""
    plain = _mixed()
    del plain["title"]
    plain["labels"][DEEP]["n"] = "x"
    message = await _same_error(msgspec.Raw(msgspec.json.encode(plain)), Mixed)
    assert "`$.labels[...].n`" in message
