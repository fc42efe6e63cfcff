"""The public API is typed for the user: mypy --strict infers the schemas' types from a call."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

USAGE = Path(__file__).with_name("typing_usage.py")
REPO = USAGE.parent.parent


def test_mypy_infers_compacted_page_summary() -> None:
    """mypy --strict passes over typing_usage.py, whose assert_type calls pin every inference."""
    stdout, stderr, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", "/dev/null", str(USAGE)]
    )
    assert status == 0, stdout + stderr


def test_mypy_rejects_a_wrong_inference(tmp_path: Path) -> None:
    """The check can fail: a wrong assert_type in the same setting is an error."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        USAGE.read_text()
        + "\n\nasync def wrong(harness: rc.Harness, page: Page) -> None:\n"
        + "    c = await rc.response_compact(harness, page, Page, Summary, {})\n"
        + "    assert_type(c, rc.Compacted[Summary, Page])\n"
    )
    stdout, _, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", "/dev/null", str(wrong)]
    )
    assert status == 1
    assert "assert_type" in stdout or "Expression is of type" in stdout
