"""The README's examples run as written, so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_openai import FakeOpenAI

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)
PRINT_WITH_COMMENT = re.compile(r"^\s*print\(.*\)\s+# (.+)$")


def block_id(code: str) -> str:
    for name in (
        "read_part",
        "openai_agents",
        "pydantic_ai",
        "integrations.langchain",
        "BaseModel",
        "OpenAICatalog",
        "MCPServer",
        "sync.",
        "asyncio.run",
    ):
        if name in code:
            return name.strip(".").replace(".", "_").lower()
    return "block"


def expected_lines(code: str) -> list[str | None]:
    """For each print() line in order: the output its trailing comment promises, or None."""
    out: list[str | None] = []
    for line in code.splitlines():
        if line.strip().startswith("print("):
            match = PRINT_WITH_COMMENT.match(line)
            out.append(match.group(1) if match else None)
    return out


def test_readme_has_the_examples_it_promises() -> None:
    """The README holds its quickstarts, model, agent loop, MCP, pydantic and framework blocks."""
    assert sorted(block_id(code) for code in BLOCKS) == sorted(
        [
            "asyncio_run",
            "read_part",
            "sync",
            "openaicatalog",
            "mcpserver",
            "basemodel",
            "openai_agents",
            "pydantic_ai",
            "integrations_langchain",
        ]
    )


def test_run_it_commands_are_what_ci_runs() -> None:
    """The two "Run it" commands are in the README verbatim, and CI runs the test one."""
    demo = "python3 -m venv .venv && .venv/bin/pip install -q nox && .venv/bin/nox -s demo"
    tests = "python3 -m venv .venv && .venv/bin/pip install -q nox && .venv/bin/nox -s tests lint"
    assert demo in README
    assert tests in README
    assert ".venv/bin/nox -s tests lint" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("code", BLOCKS, ids=[block_id(code) for code in BLOCKS])
def test_readme_example_runs(code: str, tmp_path: Path) -> None:
    """Each ```python block of the README runs in a fresh interpreter and prints what it says."""
    script = tmp_path / "example.py"
    script.write_text(code)
    with FakeOpenAI(fill_unscripted=True) as server:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "RESPONSE_COMPACTION_"))
        }
        env |= {
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "test",
            "RESPONSE_COMPACTION_MODEL": "fake-small",
        }
        done = subprocess.run(
            [sys.executable, "-W", "error", str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    promised = expected_lines(code)
    assert len(lines) == len(promised)
    for line, expected in zip(lines, promised, strict=True):
        if expected is not None:
            assert line == expected
    if "OpenAICatalog" in code:
        assert lines[0].startswith("summarized ")
        assert lines[1] == "fake-small 11 7"
        assert [body["model"] for body in server.bodies()] == ["fake-small"]
