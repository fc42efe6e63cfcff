"""The deterministic profile of an exact value: counts computed in code, not by a model.

Pure: no I/O, no event loop (the summary step runs it in a worker thread). One walk over the
decoded canonical JSON gives, per array path, how many arrays and items it holds; per field
path, its JSON types, null count, numeric min/max and, for low-cardinality strings, the count
of every value, with rare values spotlighted. The walk is bounded: at most
:data:`MAX_VALUES` values are visited and at most :data:`MAX_PATHS` paths are tracked; when
either bound is hit the profile says ``complete=False`` and its counts cover what was walked.

Paths are JSONPath-like: ``$`` is the root, ``.name`` a field, ``[*]`` every item of an array,
``.*`` every value of an object with more than :data:`MAP_KEYS` keys (a map, not a record).

The "records" of a value are the items of its largest array that is not inside another
array (``$`` itself for a top-level list): what sampling and map-reduce cut on, whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ._canonical import Span

__all__ = [
    "ArrayProfile",
    "FieldProfile",
    "Profile",
    "ProfiledValue",
    "decode_canonical",
    "profile_value",
    "render_profile",
]

MAX_VALUES = 2_000_000
MAX_PATHS = 512
MAP_KEYS = 64
#: A string field with more distinct values than this is not low-cardinality.
LOW_CARDINALITY = 24
#: Strings longer than this are never counted as values (they are text, not categories).
VALUE_CHARS = 80
#: Record indices remembered per counted value, so rare values can be shown in context.
EXAMPLES = 3
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_Record = tuple[str, int] | None


class ArrayProfile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Arrays found at one path: how many arrays, how many items in all, shortest, longest."""

    path: str
    arrays: int
    items: int
    min_items: int
    max_items: int


class FieldProfile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The values found at one path.

    ``types`` counts JSON types (``string``, ``integer``, ``number``, ``boolean``, ``null``,
    ``object``, ``array``). ``values`` counts each string value when there are at most
    :data:`LOW_CARDINALITY` distinct short ones; ``rare`` lists those that occur in under 1 %
    of the path's strings (and at most twice when there are fewer than 200).
    """

    path: str
    count: int
    types: dict[str, int]
    nulls: int = 0
    min: int | float | UnsetType = UNSET
    max: int | float | UnsetType = UNSET
    values: dict[str, int] | UnsetType = UNSET
    rare: tuple[str, ...] = ()


class Profile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What is in the whole exact value, computed in code.

    It holds response content (counts and low-cardinality values): it goes into prompts and
    to a fallback function, never into a receipt or a log.
    """

    exact_bytes: int
    complete: bool
    records: str | UnsetType = UNSET
    record_count: int = 0
    arrays: tuple[ArrayProfile, ...] = ()
    fields: tuple[FieldProfile, ...] = ()


@dataclass(slots=True)
class _Field:
    count: int = 0
    types: dict[str, int] = field(default_factory=dict)
    low: float | int | None = None
    high: float | int | None = None
    values: dict[str, int] | None = field(default_factory=dict)
    examples: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    # The records holding the smallest and largest number: outliers worth showing whole.
    low_at: _Record = None
    high_at: _Record = None


@dataclass(slots=True)
class _Arrays:
    arrays: int = 0
    items: int = 0
    shortest: int = -1
    longest: int = 0


@dataclass(frozen=True, slots=True)
class ProfiledValue:
    """The profile, plus what sampling needs: the records and which of them to spotlight.

    ``rare_records`` lists the records holding rare strings first, then those holding each
    numeric field's smallest and largest value.
    """

    profile: Profile
    root: Any
    records: list[Any] | None
    trail: tuple[str, ...] | None  # object keys from the root to the records array
    rare_records: tuple[int, ...]


def decode_canonical(data: bytes, layout: Sequence[Span] = ()) -> Any:
    """Decode canonical JSON to builtins, the arrays the writer laid out one slice at a time.

    Slices keep each decode call short, so a worker thread running this hands the GIL back
    to the caller's event loop between slices.
    """
    spans = sorted((s for s in layout if s.slices), key=lambda s: s.start)
    if not spans:
        return msgspec.json.decode(data)
    parts, pos = [], 0
    for span in spans:
        parts += [data[pos : span.start], b"{}" if span.mapping else b"[]"]
        pos = span.end
    parts.append(data[pos:])
    root = msgspec.json.decode(b"".join(parts))
    for span in spans:
        items: list[Any] | dict[str, Any] = {} if span.mapping else []
        for start, end in span.slices:
            if isinstance(items, dict):
                items.update(msgspec.json.decode(b"{" + data[start:end] + b"}"))
            else:
                items.extend(msgspec.json.decode(b"[" + data[start:end] + b"]"))
        if span.field is None:
            root = items
        else:
            root[span.field] = items
    return root


def profile_value(root: Any, exact_bytes: int) -> ProfiledValue:
    """Walk ``root`` (decoded canonical JSON) once and profile it."""
    walk = _Walk()
    walk.run(root)
    return walk.result(root, exact_bytes)


class _Walk:
    def __init__(self) -> None:
        self.fields: dict[str, _Field] = {}
        self.arrays: dict[str, _Arrays] = {}
        self.complete = True
        # The records: (item count, path, trail) of the largest array not inside an array.
        self.best: tuple[int, str, tuple[str, ...]] | None = None

    def run(self, root: Any) -> None:
        # (path, node, trail or None once inside an array, (array path, item index) or None)
        stack: list[tuple[str, Any, tuple[str, ...] | None, _Record]] = [("$", root, (), None)]
        budget = MAX_VALUES
        while stack:
            budget -= 1
            if budget < 0:
                self.complete = False
                return
            path, node, trail, record = stack.pop()
            if isinstance(node, dict):
                self._note(path, "object", None, record)
                as_map = len(node) > MAP_KEYS
                for key, child in node.items():
                    sub = f"{path}.*" if as_map else _child_path(path, key)
                    deeper = None if trail is None or as_map else (*trail, key)
                    stack.append((sub, child, deeper, record))
            elif isinstance(node, list):
                self._note(path, "array", None, record)
                self._array(path, len(node), trail)
                sub = path + "[*]"
                top = trail is not None
                stack.extend(
                    (sub, node[index], None, (path, index) if top else record)
                    for index in range(len(node) - 1, -1, -1)
                )
            else:
                self._note(path, _kind(node), node, record)

    def _array(self, path: str, length: int, trail: tuple[str, ...] | None) -> None:
        arrays = self.arrays.get(path)
        if arrays is None:
            if len(self.arrays) + len(self.fields) >= MAX_PATHS:
                self.complete = False
                return
            arrays = self.arrays[path] = _Arrays()
        arrays.arrays += 1
        arrays.items += length
        arrays.shortest = length if arrays.shortest < 0 else min(arrays.shortest, length)
        arrays.longest = max(arrays.longest, length)
        # Sorted-key order walks the root's fields in order, so the first largest array wins.
        if trail is not None and length >= 2 and (self.best is None or length > self.best[0]):
            self.best = (length, path, trail)

    def _note(self, path: str, kind: str, value: Any, record: _Record) -> None:
        info = self.fields.get(path)
        if info is None:
            if len(self.arrays) + len(self.fields) >= MAX_PATHS:
                self.complete = False
                return
            info = self.fields[path] = _Field()
        info.count += 1
        info.types[kind] = info.types.get(kind, 0) + 1
        if kind in ("integer", "number"):
            if info.low is None or value < info.low:
                info.low, info.low_at = value, record
            if info.high is None or value > info.high:
                info.high, info.high_at = value, record
        elif kind == "string" and info.values is not None:
            if len(value) > VALUE_CHARS or (
                value not in info.values and len(info.values) >= LOW_CARDINALITY
            ):
                info.values = None
                info.examples = {}
                return
            info.values[value] = info.values.get(value, 0) + 1
            seen = info.examples.setdefault(value, [])
            if record is not None and len(seen) < EXAMPLES:
                seen.append(record)

    def result(self, root: Any, exact_bytes: int) -> ProfiledValue:
        fields: list[FieldProfile] = []
        rare_records: set[int] = set()
        extremes: set[int] = set()
        best = self.best[1] if self.best is not None else None
        for path, info in sorted(self.fields.items()):
            strings = info.types.get("string", 0)
            values = info.values if info.values and strings else None
            rare = _rare(values, strings) if values else ()
            for value in rare:
                rare_records.update(i for p, i in info.examples.get(value, ()) if p == best)
            extremes.update(r[1] for r in (info.low_at, info.high_at) if r and r[0] == best)
            fields.append(
                FieldProfile(
                    path=path,
                    count=info.count,
                    types=dict(sorted(info.types.items())),
                    nulls=info.types.get("null", 0),
                    min=UNSET if info.low is None else info.low,
                    max=UNSET if info.high is None else info.high,
                    values=UNSET if values is None else dict(sorted(values.items())),
                    rare=rare,
                )
            )
        arrays = tuple(
            ArrayProfile(
                path=path,
                arrays=a.arrays,
                items=a.items,
                min_items=max(a.shortest, 0),
                max_items=a.longest,
            )
            for path, a in sorted(self.arrays.items())
        )
        records, trail = None, None
        records_path: str | UnsetType = UNSET
        if self.best is not None:
            records_path, trail = self.best[1], self.best[2]
            records = _follow(root, trail)
        profile = Profile(
            exact_bytes=exact_bytes,
            complete=self.complete,
            records=records_path,
            record_count=len(records) if records is not None else 0,
            arrays=arrays,
            fields=tuple(fields),
        )
        # Rare strings first, then numeric extremes: sampling takes them in this order.
        spotlit = sorted(rare_records) + sorted(extremes - rare_records)
        return ProfiledValue(profile, root, records, trail, tuple(spotlit))


def _rare(values: dict[str, int], strings: int) -> tuple[str, ...]:
    if strings < 20 or len(values) < 2:
        return ()
    limit = max(2, strings // 100) if strings >= 200 else 2
    return tuple(sorted(v for v, n in values.items() if n <= limit and n * 100 < strings * 5))


def _follow(root: Any, trail: tuple[str, ...]) -> Any:
    node = root
    for key in trail:
        node = node[key]
    return node


def _child_path(path: str, key: str) -> str:
    if _NAME.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{msgspec.json.encode(key).decode()}]"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def render_profile(profile: Profile, limit: int) -> str:
    """The profile as short lines for a prompt, at most ``limit`` UTF-8 bytes."""
    head = f"PROFILE (computed in code over all {profile.exact_bytes} bytes; counts are exact"
    head += ")" if profile.complete else "; bounded walk: counts cover only part)"
    lines = [head]
    if profile.records is not UNSET:
        lines.append(f"records: {profile.records} ({profile.record_count} items)")
    lines += [
        f"{a.path}: {a.arrays} arrays, {a.items} items ({a.min_items}..{a.max_items} each)"
        if a.arrays > 1
        else f"{a.path}: array of {a.items} items"
        for a in profile.arrays
    ]
    lines += [_field_line(f) for f in profile.fields if set(f.types) - {"object", "array"}]
    out, size = [], 0
    for index, line in enumerate(lines):
        cost = len(line.encode()) + 1
        if size + cost > limit - 40:
            out.append(f"[... {len(lines) - index} more profile lines]")
            break
        out.append(line)
        size += cost
    return "\n".join(out)


def _field_line(f: FieldProfile) -> str:
    types = ", ".join(f"{k} {n}" for k, n in f.types.items())
    line = f"{f.path}: {types}"
    if f.min is not UNSET:
        line += f"; min {f.min}, max {f.max}"
    if isinstance(f.values, dict):
        counts = sorted(f.values.items(), key=lambda kv: (-kv[1], kv[0]))
        line += "; values: " + ", ".join(f"{_quote(v)} {n}" for v, n in counts)
    if f.rare:
        line += "; RARE: " + ", ".join(_quote(v) for v in f.rare)
    return line


def _quote(value: str) -> str:
    return msgspec.json.encode(value).decode()
