"""Size limits that keep the library livable: modules <= 400 lines, functions <= 60 lines.

Run by ``nox -s lint`` as well as with the suite. Tests and benchmarks are exempt: a table of
cases may read better long.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "response_compaction"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Known offenders being split right now, each with who splits it. An entry that no longer
#: offends fails the test, so this list can only shrink.
PENDING: dict[str, str] = {
    "_summarize.py": "issue 8: the split into _prompt.py and _summary.py",
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > MAX_FUNCTION_LINES:
                long.append(f"{node.name} ({length} lines)")
    return long


@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_module_and_function_sizes(path: Path) -> None:
    """No library module over 400 lines and no function over 60 lines."""
    lines = len(path.read_text(encoding="utf-8").splitlines())
    problems = _long_functions(path)
    if lines > MAX_MODULE_LINES:
        problems.append(f"module ({lines} lines)")
    if _name(path) in PENDING:
        assert problems, f"{_name(path)} is within the limits now: drop it from PENDING"
        pytest.xfail(PENDING[_name(path)])
    assert not problems, f"{_name(path)}: over the limits: {', '.join(problems)}"


def test_pending_offenders_exist() -> None:
    """Every known offender is still a module: a split or renamed one leaves the list."""
    assert {name for name in PENDING if not (PACKAGE / name).exists()} == set()
