"""References (strict, opaque, never a path) and option validation."""

from __future__ import annotations

import math
import pathlib
import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction._options import MAX_TTL_SECONDS, resolve_options
from response_compaction._prompt import summary_key
from response_compaction._refs import (
    MalformedRefError,
    ParsedRef,
    exact_ref_for,
    hex_of_digest,
    parse_exact_ref,
)
from tests._store_support import HYPOTHESIS, compact, snapshot, store_root
from tests.schemas import FALLBACK, Exact, Row, Summary

pytestmark = pytest.mark.anyio

HEX = "0123456789abcdef"
VALID = re.compile(r"rc1:[0-9a-f]{64}")
_hex64 = st.text(alphabet=HEX, min_size=64, max_size=64)

# ----------------------------------------------------------------------------- reference format


def test_reference_of_a_digest() -> None:
    """A keyed digest becomes "rc1:" + its hex, and parses back to that hex."""
    digest = "sha256:" + "ab" * 32
    ref = exact_ref_for(digest)
    assert ref == "rc1:" + "ab" * 32
    assert parse_exact_ref(ref) == ParsedRef("ab" * 32)


@pytest.mark.parametrize(
    "digest",
    [
        "ab" * 32,
        "sha256:" + "AB" * 32,
        "sha256:" + "ab" * 31,
        "sha256:" + "ab" * 33,
        "md5:" + "ab" * 32,
        "sha256:" + "ab" * 31 + "g0",
        "sha256:" + "ab" * 32 + "\n",
    ],
)
def test_bad_digests_are_refused(digest: str) -> None:
    """hex_of_digest accepts only "sha256:" and exactly 64 lowercase hex."""
    with pytest.raises(ValueError, match="not a sha256 digest"):
        hex_of_digest(digest)


@HYPOTHESIS
@given(hex_part=_hex64)
def test_every_well_formed_reference_parses(hex_part: str) -> None:
    """Any "rc1:" + 64 lowercase hex parses to exactly its hex."""
    assert parse_exact_ref("rc1:" + hex_part) == ParsedRef(hex_part)


def _near_misses() -> st.SearchStrategy[str]:
    """References one small step away from valid."""
    upper = _hex64.filter(lambda h: h != h.upper()).map(lambda h: "rc1:" + h.upper())
    short = st.text(alphabet=HEX, min_size=63, max_size=63).map(lambda h: "rc1:" + h)
    long = st.text(alphabet=HEX, min_size=65, max_size=65).map(lambda h: "rc1:" + h)
    affixed = st.tuples(
        _hex64,
        st.sampled_from(["\x00", "\n", " ", "/", "/..", "\\", "%00", "\u200b", "."]),
        st.booleans(),
    ).map(lambda t: ("rc1:" + t[0] + t[1]) if t[2] else (t[1] + "rc1:" + t[0]))
    prefix = st.tuples(
        st.sampled_from(["RC1:", "rc2:", "rc1", "rc1::", "sha256:", "", "rc0:", "rc1:/"]), _hex64
    ).map(lambda t: t[0] + t[1])
    # Unicode digits and letters that a loose \d or \w, or case folding, would accept.
    lookalike = st.tuples(
        _hex64,
        st.integers(0, 63),
        st.sampled_from(["\u0663", "\uff10", "\uff41", "\uff21", "\u00df", "\u212a"]),
    ).map(lambda t: "rc1:" + t[0][: t[1]] + t[2] + t[0][t[1] + 1 :])
    traversal = st.sampled_from(
        [
            "rc1:../../../../etc/passwd",
            "rc1:" + "../" * 21 + "x",
            "../exact/ab/" + "ab" * 32,
            "/etc/passwd",
            "rc1:/" + "a" * 63,
            "rc1:" + "a" * 62 + "/.",
            "rc1:..%2f..%2f" + "a" * 58,
            "exact/ab/" + "ab" * 32,
            "rc1:" + "ab" * 32 + "\x00/etc/passwd",
            "",
            "rc1:",
        ]
    )
    return upper | short | long | affixed | prefix | lookalike | traversal


_malformed_text = st.text().filter(lambda s: VALID.fullmatch(s) is None) | _near_misses()
_not_str = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(),
    _hex64.map(lambda h: ("rc1:" + h).encode()),
    _hex64.map(lambda h: pathlib.PurePosixPath("rc1:" + h)),
    _hex64.map(lambda h: ["rc1:" + h]),
    _hex64.map(lambda h: msgspec.Raw(("rc1:" + h).encode())),
    st.builds(object),
)


@HYPOTHESIS
@given(ref=_malformed_text | _not_str)
def test_parser_rejects_malformed_references(ref: object) -> None:
    """The parser raises MalformedRefError with a sentence, never returns a ParsedRef."""
    assert VALID.fullmatch(ref) is None if isinstance(ref, str) else True
    with pytest.raises(MalformedRefError) as caught:
        parse_exact_ref(ref)
    assert str(caught.value)


@settings(HYPOTHESIS, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ref=_malformed_text | _not_str)
async def test_malformed_references_read_broken_and_touch_nothing(
    tmp_path: pathlib.Path, harness: rc.Harness, ref: Any
) -> None:
    """A malformed reference reads Broken with a detail, raises nothing, and changes no file."""
    if not store_root(harness.fs).exists():
        await compact(harness, Exact(rows=[Row(id=1, name="a")], total=1))
    before = snapshot(tmp_path)
    result = await rc.response_compaction_read_exact(harness, ref, Exact)
    assert isinstance(result, rc.Broken)
    assert result.detail
    assert snapshot(tmp_path) == before


async def test_malformed_reference_creates_no_store(tmp_path: pathlib.Path) -> None:
    """Reading a malformed reference from a fresh workspace creates no directory at all."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "fresh"), llm=None)
    result = await rc.response_compaction_read_exact(harness, "rc1:../../x", Exact)
    assert isinstance(result, rc.Broken)
    assert snapshot(tmp_path) == {}


async def test_well_formed_unknown_reference_reads_missing(harness: rc.Harness) -> None:
    """A well-formed reference that was never stored reads Missing, not Broken."""
    result = await rc.response_compaction_read_exact(harness, "rc1:" + "0" * 64, Exact)
    assert result == rc.Missing()


# ----------------------------------------------------------------------------- summary identity

_IDENTITY: dict[str, Any] = {
    "exact_digest": "sha256:" + "ab" * 32,
    "summary_json_schema": {"type": "object"},
    "instructions": "be brief",
    "ladder": "cheap",
    "routes": ("m1", "m2"),
    "token_bound": 100,
    "shown_bytes": 2048,
}
_CHANGED: dict[str, Any] = {
    "exact_digest": "sha256:" + "cd" * 32,
    "summary_json_schema": {"type": "object", "title": "x"},
    "instructions": "be briefer",
    "ladder": "other",
    "routes": ("m2", "m1"),
    "token_bound": 101,
    "shown_bytes": 2049,
    "coverage": "full",
    "context_tokens": (4096,),
    "schema_dialect": "full",
    "temperature": 0.5,
    "max_model_calls": 3,
    "grounded": ("overview",),
}


def test_summary_key_is_stable() -> None:
    """The same identity always gives the same 64-hex key (dict order does not matter)."""
    key = summary_key(**_IDENTITY)
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    reordered = dict(reversed(list(_IDENTITY.items())))
    reordered["summary_json_schema"] = {"type": "object"}
    assert summary_key(**reordered) == key


@pytest.mark.parametrize("field", sorted(_CHANGED))
def test_summary_key_changes_with_every_field(field: str) -> None:
    """Changing any one part of what the model is shown gives a different cache key."""
    assert summary_key(**{**_IDENTITY, field: _CHANGED[field]}) != summary_key(**_IDENTITY)


# ----------------------------------------------------------------------------- options


def test_mapping_gets_defaults() -> None:
    """A mapping with only the required keys gets the contract's defaults."""
    opts = resolve_options({"fallback": FALLBACK, "ladder": "cheap"}, Summary)
    assert opts.fallback == FALLBACK
    assert (
        opts.summarize_above_bytes,
        opts.instructions,
        opts.timeout_ms,
        opts.ttl_seconds,
        opts.max_entries,
        opts.token_bound,
    ) == (32000, "", 20000, 86400, 256, 1024)


def test_options_struct_and_builtin_fallback_are_accepted() -> None:
    """CompactionOptions instances and builtins fallbacks validate to the summary type."""
    opts = resolve_options(
        rc.CompactionOptions(fallback=FALLBACK, ladder="x", timeout_ms=5), Summary
    )
    assert opts.timeout_ms == 5
    opts = resolve_options(
        {"fallback": {"overview": "o", "critical_facts": ["f"]}, "ladder": "x"}, Summary
    )
    assert opts.fallback == Summary(overview="o", critical_facts=["f"])


def test_a_fallback_function_is_kept_in_the_struct_as_in_a_mapping() -> None:
    """A callable fallback is the same option in CompactionOptions as in a mapping: kept as
    the function (called later), the other fields still checked."""

    def made(profile: rc.Profile) -> Summary:
        return Summary(overview=str(profile.record_count), critical_facts=[])

    by_struct = resolve_options(rc.CompactionOptions[Summary](fallback=made, ladder="x"), Summary)
    by_mapping = resolve_options({"fallback": made, "ladder": "x"}, Summary)
    assert by_struct.fallback is by_mapping.fallback is made
    with pytest.raises(ValueError, match="timeout_ms"):
        resolve_options(
            rc.CompactionOptions[Summary](fallback=made, ladder="x", timeout_ms=0), Summary
        )


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("summarize_above_bytes", -1),
        ("timeout_ms", 0),
        ("timeout_ms", 600_001),
        ("timeout_ms", 1.5),
        ("timeout_ms", "100"),
        ("ttl_seconds", 0),
        ("ttl_seconds", True),
        ("max_entries", 0),
        ("max_entries", None),
        ("max_entries", 2.0),
        ("token_bound", 0),
        ("instructions", 3),
        ("ladder", None),
        ("fallback", {"overview": 1}),
        ("fallback", "text"),
        ("fallback", object()),
    ],
)
@pytest.mark.parametrize("as_struct", [False, True])
def test_bad_option_raises_value_error_naming_the_key(key: str, bad: Any, as_struct: bool) -> None:
    """An out-of-range or wrongly typed option raises ValueError whose message names the key."""
    values = {"fallback": FALLBACK, "ladder": "cheap", key: bad}
    options: Any = rc.CompactionOptions(**values) if as_struct else values
    with pytest.raises(ValueError, match=key):
        resolve_options(options, Summary)


@pytest.mark.parametrize("key", ["timeout_ms"])
@pytest.mark.parametrize("good", [1, 600_000])
def test_option_bounds_are_inclusive(key: str, good: int) -> None:
    """The ends of the documented ranges are accepted."""
    assert getattr(resolve_options({"fallback": FALLBACK, "ladder": "x", key: good}, Summary), key)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ladder": "x"}, "fallback"),
        ({"fallback": FALLBACK}, "ladder"),
        ({"fallback": FALLBACK, "ladder": "x", "max_entry": 3}, "max_entry"),
        (None, "options"),
        (["fallback", "ladder"], "options"),
        ({1: 2}, "str"),
    ],
)
def test_missing_unknown_and_non_mapping_options(options: Any, named: str) -> None:
    """Missing required keys, unknown keys and non-mappings raise ValueError saying what."""
    with pytest.raises(ValueError, match=named):
        resolve_options(options, Summary)


class Measure(msgspec.Struct):
    value: float | None


@pytest.mark.parametrize("as_struct", [False, True])
def test_fallback_is_kept_unchanged(as_struct: bool) -> None:
    """The fallback comes back as given: a NaN in it is not rewritten to None."""
    fallback = Measure(value=math.nan)
    values: dict[str, Any] = {"fallback": fallback, "ladder": "x"}
    options: Any = rc.CompactionOptions(**values) if as_struct else values
    resolved = resolve_options(options, Measure)
    assert isinstance(resolved.fallback, Measure)
    assert resolved.fallback.value is not None
    assert math.isnan(resolved.fallback.value)


async def test_bad_options_fail_before_any_work(tmp_path: pathlib.Path) -> None:
    """Bad options raise ValueError before the store directory is even created."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "ws"), llm=None)
    value = Exact(rows=[], total=0)
    with pytest.raises(ValueError, match="max_entries"):
        await rc.response_compact(
            harness, value, Exact, Summary, {"fallback": FALLBACK, "ladder": "x", "max_entries": 0}
        )
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("ttl_seconds", 10**400),
        ("ttl_seconds", MAX_TTL_SECONDS + 1),
        ("max_entries", 2**63),
        ("summarize_above_bytes", 10**30),
        ("instructions", "summarise \ud800 this"),
        ("ladder", "\udfff"),
    ],
    ids=[
        "ttl-10**400",
        "ttl-over-100-years",
        "max-entries-2**63",
        "threshold-10**30",
        "instructions-surrogate",
        "ladder-surrogate",
    ],
)
async def test_unrepresentable_options_fail_before_any_work(
    tmp_path: pathlib.Path, key: str, bad: Any
) -> None:
    """Huge integers and lone surrogates raise ValueError naming the key before any work."""
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "ws"), llm=None)
    big = Exact(rows=[Row(id=i, name="n" * 40) for i in range(2000)], total=0)
    with pytest.raises(ValueError, match=key) as caught:
        await rc.response_compact(
            harness, big, Exact, Summary, {"fallback": FALLBACK, "ladder": "x", key: bad}
        )
    assert "\ud800" not in str(caught.value)
    assert snapshot(tmp_path) == {}


def test_longest_ttl_is_accepted() -> None:
    """A TTL of exactly the documented maximum is accepted."""
    options = resolve_options(
        {"fallback": FALLBACK, "ladder": "x", "ttl_seconds": MAX_TTL_SECONDS}, Summary
    )
    assert options.ttl_seconds == MAX_TTL_SECONDS
