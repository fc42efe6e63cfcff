"""The public face: what ``__all__`` promises is what the package exports, and nothing private."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import msgspec
import pytest

import response_compaction as rc
import response_compaction.sync as rc_sync


def test_all_matches_the_public_names() -> None:
    """Every public attribute is in ``__all__`` and every name in ``__all__`` exists."""
    public = {
        name
        for name, value in vars(rc).items()
        if not name.startswith("_") and not isinstance(value, type(rc)) and name != "annotations"
    }
    assert set(rc.__all__) == public
    assert list(rc.__all__) == sorted(rc.__all__)


def test_exports_come_from_private_modules() -> None:
    """Public names live in private modules and are re-exported, so the layout can move."""
    for name in rc.__all__:
        module = getattr(getattr(rc, name), "__module__", "")
        assert module.startswith("response_compaction._"), (name, module)


#: The public names users and outside acceptance tests rely on (the project's contract, kept
#: here so this repository states it): removing or renaming one is a breaking change.
CONTRACT_NAMES = (
    "Attempt",
    "Broken",
    "Compacted",
    "CompactionOptions",
    "ExactOutput",
    "FallbackOutput",
    "Found",
    "Harness",
    "LocalWorkspace",
    "Missing",
    "OpenAICatalog",
    "Part",
    "Receipt",
    "SummarizedOutput",
    "response_compact",
    "response_compaction_read_exact",
    "response_compaction_read_part",
)
#: The blocking twins in ``response_compaction.sync``.
SYNC_NAMES = (
    "close",
    "response_compact",
    "response_compaction_read_exact",
    "response_compaction_read_part",
)


def test_contract_names_exist() -> None:
    """Every contract name is exported in ``__all__`` and importable from the package."""
    for name in CONTRACT_NAMES:
        assert name in rc.__all__, name
        assert hasattr(rc, name), name


def test_sync_exports_its_twins() -> None:
    """``response_compaction.sync`` exports exactly the blocking twins and close()."""
    assert sorted(rc_sync.__all__) == sorted(SYNC_NAMES)
    for name in SYNC_NAMES:
        assert callable(getattr(rc_sync, name)), name


def test_star_import_gives_exactly_all() -> None:
    """``from response_compaction import *`` binds exactly the names in ``__all__``."""
    namespace: dict[str, object] = {}
    exec("from response_compaction import *", namespace)  # noqa: S102 - a fixed import line
    assert set(namespace) - {"__builtins__"} == set(rc.__all__)


def test_version_comes_from_the_package_metadata() -> None:
    """``__version__`` is the installed distribution's version, written once in pyproject."""
    assert rc.__version__ == importlib.metadata.version("response-compaction")


def test_import_leaves_what_it_does_not_need_unloaded() -> None:
    """A bare import loads neither the version machinery nor asyncio (a trio process never
    needs it): together 35-55 ms of a 150 ms import budget, paid only when used."""
    heavy = ("importlib.metadata", "asyncio", "aiofiles")
    script = f"import sys, response_compaction; print([m for m in {heavy!r} if m in sys.modules])"
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "[]"


def test_outputs_and_read_results_carry_their_kind_and_state() -> None:
    """``.kind`` and ``.state`` are fixed per type and are what encoding writes."""
    assert rc.ExactOutput(value=1).kind == "exact"
    assert rc.SummarizedOutput(value=1).kind == "summarized"
    assert rc.FallbackOutput(value=1).kind == "fallback"
    assert rc.Found(value=1).state == "found"
    assert rc.Missing().state == "missing"
    assert rc.Broken(detail="x").state == "broken"
    assert msgspec.json.encode(rc.Broken(detail="x")) == b'{"state":"broken","detail":"x"}'
    assert msgspec.json.encode(rc.ExactOutput(value=1)) == b'{"kind":"exact","value":1}'


def test_value_types_are_frozen_and_keyword_only() -> None:
    """Results cannot be mutated after the fact, and fields are never positional."""
    receipt = rc.Receipt(
        exact_ref="rc1:" + "0" * 64,
        exact_digest="sha256:" + "0" * 64,
        exact_bytes=1,
        exact_cache="stored",
        summary_cache="not_needed",
        elapsed_ms=0,
    )
    with pytest.raises(AttributeError):
        receipt.exact_bytes = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        rc.Found(1)  # type: ignore[call-arg]


def test_unset_receipt_fields_are_omitted_and_zero_is_kept() -> None:
    """An unavailable token count is absent when encoded; a measured 0 is written."""
    base = {
        "exact_ref": "rc1:" + "0" * 64,
        "exact_digest": "sha256:" + "0" * 64,
        "exact_bytes": 1,
        "exact_cache": "stored",
        "summary_cache": "none",
        "elapsed_ms": 0,
    }
    absent = msgspec.json.decode(msgspec.json.encode(rc.Receipt(**base)))  # type: ignore[arg-type]
    assert "input_tokens" not in absent
    zero = msgspec.json.decode(msgspec.json.encode(rc.Receipt(**base, input_tokens=0)))  # type: ignore[arg-type]
    assert zero["input_tokens"] == 0
