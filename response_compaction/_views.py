"""What the model sees of a large value under ``coverage="sampled"`` and ``"full"``. Pure.

Every view is bounded by a byte budget (the route's context, see ``_prompt.prompt_bytes``)
and shows records whole, never cut mid-value, each as a line ``[i] <canonical JSON>``:

- sampled: the profile, the document with its records array replaced by a marker (the
  "envelope"), then records from the head, the tail, those holding rare values and evenly
  spaced ones, as many as fit.
- full (map): consecutive records, as many as fit, one chunk per model call.
- full (reduce): the profile, the envelope and the part summaries, saying which records no
  part summary covers.

``covered`` counts the canonical bytes a view shows: the envelope's own bytes, each record's
bytes and the comma between two shown neighbours, so showing everything covers exactly the
whole canonical size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ._profile import ProfiledValue, render_profile

__all__ = [
    "Chunk",
    "View",
    "chunks",
    "covered_bytes",
    "first_half",
    "reduce_view",
    "sampled_view",
]

_ENCODER = msgspec.json.Encoder(order="sorted")
#: The records' path is named in every prompt's wording, beside the budgeted content: a path
#: made of a 300 KB key made prompts of 300 KB on a 4 KB budget. Longer ones are cut.
_PATH_CHARS = 120
_HEAD_ITEMS = 3
_TAIL_ITEMS = 3
_RARE_ITEMS = 12


@dataclass(frozen=True, slots=True)
class View:
    """One user message and the canonical bytes of the exact value it shows."""

    text: str
    covered: int
    shown: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of records ``[lo, hi)`` for one map call."""

    lo: int
    hi: int
    items: tuple[int, ...]
    text: str


def _records_at(pv: ProfiledValue) -> str:
    """The records' path for the wording, cut to ``_PATH_CHARS`` characters."""
    path = str(pv.profile.records)
    return path if len(path) <= _PATH_CHARS else path[: _PATH_CHARS - 1] + "…"


def _envelope(pv: ProfiledValue, limit: int) -> tuple[str, int]:
    """The document with the records replaced by a marker, cut to ``limit`` bytes if need be."""
    if pv.trail is None or pv.records is None:
        return "", 0
    if not pv.trail:  # the value is the records array itself
        return "", 2
    marker = f"<{len(pv.records)} records of {_records_at(pv)}: see RECORDS>"
    data = _ENCODER.encode(_replace(pv.root, pv.trail, marker))
    own = len(data) - len(_ENCODER.encode(marker)) + 2
    if len(data) <= limit:
        return "DOCUMENT (records replaced by a marker):\n" + data.decode(), own
    cut = data[:limit].decode("utf-8", "ignore")
    text = f"DOCUMENT (records replaced by a marker; first {limit} of {len(data)} bytes):\n{cut}"
    return text + "\n[truncated]", len(cut.encode())


def _replace(node: Any, trail: tuple[str, ...], marker: str) -> Any:
    if not trail:
        return marker
    copy = dict(node)
    copy[trail[0]] = _replace(node[trail[0]], trail[1:], marker)
    return copy


def _line(index: int, item: Any) -> bytes:
    return b"[%d] " % index + _ENCODER.encode(item)


def covered_bytes(pv: ProfiledValue, envelope: int, shown: Sequence[int]) -> int:
    """Canonical bytes shown: envelope, records, and the commas between shown neighbours."""
    if pv.records is None:
        return envelope
    marks = sorted(set(shown))
    total = envelope + sum(len(_ENCODER.encode(pv.records[i])) for i in marks)
    return total + sum(1 for a, b in itertools.pairwise(marks) if b == a + 1)


def sampled_view(pv: ProfiledValue, data: bytes, budget: int) -> View:
    """Profile, envelope and whole records from across the value, within ``budget`` bytes."""
    total = len(data)
    profile = render_profile(pv.profile, max(256, budget * 3 // 10))
    room = budget - len(profile.encode()) - 600
    if total <= room:
        text = f"The document is {total} bytes of JSON, shown in full after its profile."
        return View(f"{text}\n\n{profile}\n\nDOCUMENT:\n{data.decode()}", total)
    if pv.records is None:  # nothing to sample whole: the head, cut and marked
        shown = data[: max(0, room)].decode("utf-8", "ignore")
        text = (
            f"The document is {total} bytes of JSON. You see its profile, then its first "
            f"{len(shown.encode())} bytes (it ends mid-value)."
        )
        return View(f"{text}\n\n{profile}\n\n{shown}\n[truncated]", len(shown.encode()))
    envelope, own = _envelope(pv, max(256, budget // 5))
    room -= len(envelope.encode()) + len(_records_at(pv).encode())  # the intro names it
    picked, lines = _pick(pv, room)
    n = len(pv.records)
    intro = (
        f"The document is {total} bytes of JSON; you cannot see all of it. You see:\n"
        "1. PROFILE: exact counts computed in code over the WHOLE document; use these numbers, "
        "do not count the records yourself.\n"
        + ("2. DOCUMENT: the document with its records replaced by a marker.\n" if envelope else "")
        + f"3. RECORDS: {len(picked)} of the {n} records of {_records_at(pv)}, whole, "
        "chosen from the start, the end, evenly across, and those holding RARE values; [i] is "
        "the record's index.\nDescribe the whole document, not only the records you see."
    )
    body = "\n".join(line.decode() for line in lines)
    parts = [intro, profile, envelope, f"RECORDS ({len(picked)} of {n}):\n{body}"]
    text = "\n\n".join(p for p in parts if p)
    return View(text, covered_bytes(pv, own, picked), tuple(picked))


def _pick(pv: ProfiledValue, room: int) -> tuple[list[int], list[bytes]]:
    """Records in priority order (head, tail, rare, evenly spaced) while they fit, by index."""
    records = pv.records or []
    chosen: dict[int, bytes] = {}
    misses = 0
    for index in _candidates(len(records), pv.rare_records):
        if index in chosen:
            continue
        line = _line(index, records[index])
        if len(line) + 1 > room:
            misses += 1
            if misses > 50 or room < 64:
                break
            continue
        chosen[index] = line
        room -= len(line) + 1
    order = sorted(chosen)
    return order, [chosen[i] for i in order]


def _candidates(n: int, rare: Sequence[int]) -> Iterator[int]:
    yield 0
    yield n - 1  # the tail is never left out when anything fits
    yield from rare[:_RARE_ITEMS]
    yield from range(1, min(_HEAD_ITEMS, n))
    yield from range(max(0, n - _TAIL_ITEMS), n)
    level = 2
    while level < 2 * n:  # evenly spaced, each pass halving the gaps
        for k in range(1, level, 2):
            yield k * n // level
        level *= 2


def chunks(pv: ProfiledValue, budget: int, calls: int) -> tuple[list[Chunk], list[int]]:
    """Consecutive records packed into map prompts of at most ``budget`` bytes.

    When more than ``calls`` chunks would be needed, evenly spaced chunks are kept. Returns
    the chunks and the indices of records too large for any prompt.
    """
    records = pv.records or []
    n = len(records)
    runs: list[tuple[int, int, list[int], list[bytes]]] = []
    too_big: list[int] = []
    lo, size = 0, 0
    items: list[int] = []
    lines: list[bytes] = []
    room = budget - 400 - len(_records_at(pv).encode())  # named in each part's header
    for index, item in enumerate(records):
        line = _line(index, item)
        if len(line) + 1 > room:
            too_big.append(index)
            continue
        if size + len(line) + 1 > room and lines:
            runs.append((lo, index, items, lines))
            size, items, lines = 0, [], []
        if not lines:
            lo = index
        items.append(index)
        lines.append(line)
        size += len(line) + 1
    if lines:
        runs.append((lo, n, items, lines))
    if len(runs) > calls:
        runs = [runs[k * len(runs) // calls] for k in range(calls)]
    out = [
        _chunk(pv, p, len(runs), lo, hi, items, body)
        for p, (lo, hi, items, body) in enumerate(runs)
    ]
    return out, too_big


def _chunk(
    pv: ProfiledValue, part: int, parts: int, lo: int, hi: int, items: list[int], body: list[bytes]
) -> Chunk:
    text = (
        f"Part {part + 1} of {parts} of a {pv.profile.exact_bytes}-byte JSON document: records "
        f"{lo}..{hi - 1} of the {pv.profile.record_count} records of {_records_at(pv)}. "
        "Summarize this part only; a later step combines the parts.\n\n"
    )
    return Chunk(lo, hi, tuple(items), text + "\n".join(x.decode() for x in body))


def first_half(pv: ProfiledValue, chunk: Chunk) -> Chunk:
    """The chunk's first half of records: the smaller retry after a context overflow."""
    records = pv.records or []
    items = list(chunk.items[: max(1, len(chunk.items) // 2)])
    body = [_line(i, records[i]) for i in items]
    return _chunk(pv, 0, 1, items[0], items[-1] + 1, items, body)


def reduce_view(
    pv: ProfiledValue, parts: Sequence[tuple[Chunk, bytes]], missing: Sequence[Chunk], budget: int
) -> View:
    """Profile, envelope and the part summaries, saying plainly what no part covered."""
    profile = render_profile(pv.profile, max(256, budget * 3 // 10))
    envelope, own = _envelope(pv, max(256, budget // 5))
    room = budget - len(profile.encode()) - len(envelope.encode()) - 800
    room -= len(_records_at(pv).encode())  # the intro names it
    lines: list[str] = []
    used: list[Chunk] = []
    for chunk, summary in parts:
        line = f"records {chunk.lo}..{chunk.hi - 1}: {summary.decode()}"
        if len(line.encode()) + 1 > room:
            continue
        room -= len(line.encode()) + 1
        lines.append(line)
        used.append(chunk)
    n = pv.profile.record_count
    left = n - sum(len(c.items) for c in used)
    intro = (
        f"The document is {pv.profile.exact_bytes} bytes of JSON with {n} records at "
        f"{_records_at(pv)}. Each PART SUMMARY below summarizes a run of records; combine "
        "them with the PROFILE (exact counts over the whole document) into one summary."
    )
    if left:
        gaps = ", ".join(f"{c.lo}..{c.hi - 1}" for c in missing[:20])
        intro += (
            f" {left} of the {n} records are in no part summary"
            + (f" (runs {gaps})" if gaps else "")
            + ": say that the summary does not cover them."
        )
    parts_text = f"PART SUMMARIES ({len(used)}):\n" + "\n".join(lines)
    text = "\n\n".join(p for p in (intro, profile, envelope, parts_text) if p)
    shown = [i for c in used for i in c.items]
    return View(text, covered_bytes(pv, own, shown), tuple(shown))
