"""Developer tasks. ``nox`` runs tests and lint; ``nox -s bench`` and ``nox -s demo`` on demand."""

from __future__ import annotations

import os
import shutil

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
    _install_bindfs(session)
    session.run("pytest", *session.posargs)


def _install_bindfs(session: nox.Session) -> None:
    """bindfs, for the test of a store on a stalled FUSE mount, where it can be had.

    Only as root on a Debian-like system with ``/dev/fuse`` (a CI box, a container): nobody
    else's system is changed; without it that one test is skipped.
    """
    if shutil.which("bindfs") or not shutil.which("apt-get") or not os.path.exists("/dev/fuse"):
        return
    if os.geteuid() != 0:
        return
    session.run("apt-get", "install", "-y", "-q", "--no-install-recommends", "bindfs",
                external=True, success_codes=range(256), silent=True)  # fmt: skip


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


@nox.session(default=False)
def live(session: nox.Session) -> None:
    """README model example and CLI against a real server: ``OPENAI_BASE_URL=... nox -s live``.

    Any OpenAI-compatible base URL (``../shared/tools/local-llm.sh start`` prints one);
    ``RESPONSE_COMPACTION_MODEL``, ``LIVE_TIMEOUT_MS`` and ``LIVE_BYTES`` tune it (tests/live.py).
    """
    _install(session)
    session.run("python", "-m", "tests.live", *session.posargs)
