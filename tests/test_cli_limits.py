"""The command line's standard streams: a bounded document is read (an endless stdin is
refused, not buffered), and a closed stream is one line on stderr."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import clean_env, cli


def test_cli_endless_stdin_is_refused_at_the_bound(tmp_path: Path) -> None:
    """An endless stdin stops at --max-input-bytes with a one-line ValueError, storing nothing."""
    with Path("/dev/zero").open("rb") as endless:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "response_compaction",
                "compact",
                "-",
                "--root",
                str(tmp_path),
                "--max-input-bytes",
                "100000",
            ],
            stdin=endless,
            capture_output=True,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.count(b"\n") == 1
    assert b"--max-input-bytes (100000 bytes)" in done.stderr
    assert b"Traceback" not in done.stderr
    assert not (tmp_path / "response-compaction-v1" / "exact").exists() or not any(
        (tmp_path / "response-compaction-v1" / "exact").iterdir()
    )


def test_cli_input_at_the_bound_is_read(tmp_path: Path) -> None:
    """A document of exactly --max-input-bytes is compacted."""
    document = b'["' + b"x" * 96 + b'"]'
    done = cli(
        "compact", "-", "--root", tmp_path, "--max-input-bytes", str(len(document)), stdin=document
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("command", "redirect", "says"),
    [
        pytest.param("compact - --root {root}", "<&-", "standard input is closed", id="stdin"),
        pytest.param("compact - --root {root}", ">&-", "standard output is closed", id="stdout"),
        pytest.param("verify --root {root}", ">&-", "standard output is closed", id="verify"),
    ],
)
def test_a_closed_standard_stream_is_one_line_not_a_traceback(
    tmp_path: Path, command: str, redirect: str, says: str
) -> None:
    """Python sets a closed stream to None: every use of it was an AttributeError traceback."""
    line = f"{shlex.quote(sys.executable)} -m response_compaction {command} {redirect}"
    done = subprocess.run(
        ["/bin/sh", "-c", line.format(root=shlex.quote(str(tmp_path)))],
        input=b'{"a": 1}',
        capture_output=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.decode() == f"response-compaction: OSError: {says}\n"
