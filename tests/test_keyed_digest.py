"""References and receipts carry a keyed digest: a low-entropy value cannot be guessed from them."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction._digest import digest_hex
from tests._store_support import canonical, entry_path, store_root
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


async def _compact(ws: Path, value: Any) -> rc.Receipt:
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    return (await rc.response_compact(harness, value, Any, Summary, OPTIONS)).receipt


async def _read(ws: Path, ref: str) -> Any:
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    return await rc.response_compaction_read_exact(harness, ref, Any)


async def test_a_pin_cannot_be_brute_forced_from_the_receipt(tmp_path: Path) -> None:
    """No four-digit pin's plain sha256 matches the receipt's digest or reference."""
    receipt = await _compact(tmp_path, {"pin": "4821"})
    shown = receipt.exact_digest + receipt.exact_ref
    for pin in range(10_000):
        guess = hashlib.sha256(canonical({"pin": f"{pin:04d}"})).hexdigest()
        assert guess not in shown
    assert receipt.exact_digest.startswith("sha256:")


async def test_the_digest_is_hmac_sha256_under_the_store_key(tmp_path: Path) -> None:
    """The receipt's digest is HMAC-SHA256 of the canonical bytes under the 0600 key file."""
    value = {"b": [1, 2.5, None], "a": "x"}
    receipt = await _compact(tmp_path, value)
    key_path = store_root(tmp_path) / "key"
    st = key_path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    key = key_path.read_bytes()
    assert len(key) == 32
    expected = hmac.new(key, canonical(value), hashlib.sha256).hexdigest()
    assert receipt.exact_digest == "sha256:" + expected
    assert receipt.exact_ref == "rc1:" + expected
    assert entry_path(store_root(tmp_path), expected).read_bytes() == canonical(value)


async def test_dedup_within_a_store_and_unlinkable_refs_across_stores(tmp_path: Path) -> None:
    """One value reuses its entry within a store, and gets unrelated references in two stores."""
    value = {"pin": "4821"}
    first = await _compact(tmp_path / "one", value)
    again = await _compact(tmp_path / "one", msgspec.Raw(b'{ "pin" : "4821" }'))
    other = await _compact(tmp_path / "two", value)
    assert again.exact_ref == first.exact_ref
    assert again.exact_cache == "reused"
    assert other.exact_ref != first.exact_ref
    assert await _read(tmp_path / "one", first.exact_ref) == rc.Found(value=value)
    assert await _read(tmp_path / "two", first.exact_ref) == rc.Missing()


async def test_concurrent_first_uses_agree_on_one_key(tmp_path: Path) -> None:
    """Many compactions racing to create a fresh store's key all end up under one key."""
    receipts: dict[int, rc.Receipt] = {}

    async def one(i: int) -> None:
        receipts[i] = await _compact(tmp_path, {"i": i})

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(one, i)
    key = (store_root(tmp_path) / "key").read_bytes()
    for i, receipt in receipts.items():
        expected = hmac.new(key, canonical({"i": i}), hashlib.sha256).hexdigest()
        assert receipt.exact_ref == "rc1:" + expected
        assert await _read(tmp_path, receipt.exact_ref) == rc.Found(value={"i": i})
    assert os.listdir(store_root(tmp_path) / "tmp") == []


def _key_symlink(key: Path, outside: Path) -> None:
    key.symlink_to(outside / "bait")


def _key_shared(key: Path, outside: Path) -> None:
    key.write_bytes(b"k" * 32)
    key.chmod(0o644)


def _key_directory(key: Path, outside: Path) -> None:
    key.mkdir()


@pytest.mark.parametrize("plant", [_key_symlink, _key_shared, _key_directory])
async def test_unsafe_key_files_are_refused(tmp_path: Path, plant: Any) -> None:
    """A key that is a symlink, a directory or readable by others raises UnsafeStoreError."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "bait").write_bytes(b"b" * 32)
    receipt = await _compact(tmp_path / "ws", {"a": 1})
    key = store_root(tmp_path / "ws") / "key"
    key.unlink()
    plant(key, outside)
    with pytest.raises(rc.UnsafeStoreError, match="store key"):
        await _compact(tmp_path / "ws", {"a": 2})
    with pytest.raises(rc.UnsafeStoreError, match="store key"):
        await _read(tmp_path / "ws", receipt.exact_ref)
    assert (outside / "bait").read_bytes() == b"b" * 32


async def test_a_damaged_key_raises_store_error(tmp_path: Path) -> None:
    """A key file of the wrong length raises StoreError (an OSError), not a wrong digest."""
    await _compact(tmp_path, {"a": 1})
    (store_root(tmp_path) / "key").write_bytes(b"short")
    with pytest.raises(rc.StoreError, match="damaged"):
        await _compact(tmp_path, {"a": 2})


async def test_entries_under_a_lost_key_read_broken(tmp_path: Path) -> None:
    """After the key is replaced, an old entry reads Broken (unverifiable), never Found."""
    receipt = await _compact(tmp_path, {"pin": "4821"})
    key = store_root(tmp_path) / "key"
    key.write_bytes(bytes(32))
    read = await _read(tmp_path, receipt.exact_ref)
    assert isinstance(read, rc.Broken)
    assert "4821" not in read.detail


_CHILD = """
import sys
from typing import Any
import response_compaction as rc
from response_compaction import sync
from tests.schemas import FALLBACK, Summary
harness = rc.Harness(fs=rc.LocalWorkspace(sys.argv[1]), llm=None)
options = {"fallback": FALLBACK, "ladder": "cheap"}
compacted = sync.response_compact(harness, {"i": int(sys.argv[2])}, Any, Summary, options)
print(compacted.receipt.exact_ref)
"""
REPO = Path(__file__).resolve().parent.parent


async def test_processes_racing_for_a_fresh_store_agree_on_one_key(tmp_path: Path) -> None:
    """Processes that create one fresh store's key at once all name entries under one key."""
    ws = tmp_path / "ws"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    refs: dict[int, str] = {}

    async def child(i: int) -> None:
        done = await anyio.run_process([sys.executable, "-c", _CHILD, str(ws), str(i)], env=env)
        refs[i] = done.stdout.decode().strip()

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(child, i)
    key = (store_root(ws) / "key").read_bytes()
    for i, ref in refs.items():
        assert ref == "rc1:" + hmac.new(key, canonical({"i": i}), hashlib.sha256).hexdigest()
        assert await _read(ws, ref) == rc.Found(value={"i": i})


@given(key=st.binary(max_size=200), data=st.binary(max_size=5000))
def test_the_digest_from_kept_pads_is_hmac_sha256(key: bytes, data: bytes) -> None:
    """digest_hex (the key's pads hashed once, then copied) equals hmac's HMAC-SHA256."""
    expected = hmac.digest(key, data, "sha256").hex()
    assert digest_hex(key, data) == expected
    assert digest_hex(key, memoryview(data)) == expected  # the cached pads were not updated
