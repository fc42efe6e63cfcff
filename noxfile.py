"""Developer tasks. ``nox`` runs tests and lint; ``nox -s bench`` and ``nox -s demo`` on demand."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "lint"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
#: Every optional extra: the tests exercise each adapter, and mypy checks them.
EXTRAS = "[mcp,pydantic,openai-agents,pydantic-ai,langchain]"


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    session.install("--upgrade", "pip")
    session.install("-e", f".{extras}")
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite; every async test runs on asyncio and on trio."""
    _install(session, "test", extras=EXTRAS)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff (lint and format check), mypy --strict, and the size limits (modules, functions)."""
    _install(session, "lint", "bench", extras=EXTRAS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # covers tests/typing_usage.py, the user's view of the API
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/test_sizes.py")


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against the floor and peers: ``nox -s bench`` (quick) or ``-- --full``."""
    _install(session, "bench")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """Compact a large generated response end to end and read it back (model if configured)."""
    _install(session)
    session.run("python", "-m", "response_compaction", "demo", *session.posargs)
