"""The blocking facade: one background loop, many threads, one client, nothing left at exit."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import anyio.to_thread
import openai
import pytest
import sniffio

import response_compaction as rc
from response_compaction import sync
from tests._hanging import HangingModel
from tests.fake_openai import FakeOpenAI
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap", "summarize_above_bytes": 2000}
REPO = Path(__file__).resolve().parent.parent


def run_script(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter with every warning (ResourceWarning too) an error.

    Not ``-X dev``: its asyncio debug mode logs slow callbacks, which a loaded machine makes.
    """
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_same_names_and_arguments_as_the_coroutines() -> None:
    """Each blocking twin takes exactly the arguments of its coroutine."""
    for name in ("response_compact", "response_compaction_read_exact"):
        blocking = inspect.signature(getattr(sync, name)).parameters
        awaitable = inspect.signature(getattr(rc, name)).parameters
        assert list(blocking) == list(awaitable)


def test_compact_and_read_back_from_plain_code(harness: rc.Harness) -> None:
    """From code with no event loop, compact returns the exact value and the ref reads Found."""
    value = Exact(rows=[Row(id=1, name="a")], total=1)
    compacted = sync.response_compact(harness, value, Exact, Summary, OPTIONS)
    assert compacted.output.kind == "exact"
    assert compacted.output.value == value
    read = sync.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=value)


def test_large_value_without_a_model_gets_the_fallback(harness: rc.Harness) -> None:
    """Over the threshold with no model, the blocking call hands back the fallback (no_llm)."""
    compacted = sync.response_compact(harness, big_exact(200), Exact, Summary, OPTIONS)
    assert compacted.output == rc.FallbackOutput(value=FALLBACK)
    assert compacted.receipt.fallback_reason == "no_llm"


def test_errors_come_through_unchanged(harness: rc.Harness) -> None:
    """A value that does not validate raises the coroutine's ValueError, not a wrapper."""
    with pytest.raises(ValueError, match="does not validate"):
        sync.response_compact(harness, {"rows": "nope"}, Exact, Summary, OPTIONS)


def test_eight_threads_at_once(harness: rc.Harness) -> None:
    """Eight threads compacting and reading back at the same time all get their own values."""

    def job(i: int) -> tuple[Exact, rc.Compacted[Exact, Summary], object]:
        value = big_exact(10 + 40 * i)
        compacted = sync.response_compact(harness, value, Exact, Summary, OPTIONS)
        read = sync.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
        return value, compacted, read

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(job, range(8)))
    refs = set()
    for value, compacted, read in results:
        assert read == rc.Found(value=value)
        refs.add(compacted.receipt.exact_ref)
        expected = "exact" if compacted.receipt.exact_bytes <= 2000 else "fallback"
        assert compacted.output.kind == expected
    assert len(refs) == 8


@pytest.mark.anyio
async def test_refuses_inside_a_running_event_loop(harness: rc.Harness) -> None:
    """Called from a running asyncio or trio loop, both twins raise RuntimeError saying await."""
    value = Exact(rows=[], total=0)
    with pytest.raises(RuntimeError, match=r"await response_compaction\.response_compact\("):
        sync.response_compact(harness, value, Exact, Summary, OPTIONS)
    with pytest.raises(RuntimeError, match="await"):
        sync.response_compaction_read_exact(harness, "rc1:" + "0" * 64, Exact)


@pytest.mark.anyio
async def test_works_from_a_worker_thread_of_a_running_loop(harness: rc.Harness) -> None:
    """A worker thread inherits the loop's context (sniffio's marker) but may block: it works."""
    value = Exact(rows=[Row(id=1, name="a")], total=1)

    def blocking() -> rc.Found[Exact] | rc.Missing | rc.Broken:
        ref = sync.response_compact(harness, value, Exact, Summary, OPTIONS).receipt.exact_ref
        return sync.response_compaction_read_exact(harness, ref, Exact)

    assert await anyio.to_thread.run_sync(blocking) == rc.Found(value=value)
    if sniffio.current_async_library() == "asyncio":
        assert await asyncio.to_thread(blocking) == rc.Found(value=value)


def test_refuses_inside_a_plain_asyncio_callback(harness: rc.Harness) -> None:
    """A loop callback that is not a task is still on a running loop: RuntimeError, no deadlock."""
    errors: list[BaseException] = []

    def callback() -> None:
        try:
            sync.response_compaction_read_exact(harness, "rc1:" + "0" * 64, Exact)
        except RuntimeError as exc:
            errors.append(exc)

    async def main() -> None:
        asyncio.get_running_loop().call_soon(callback)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(errors) == 1
    assert "await" in str(errors[0])


def test_one_client_one_connection_across_calls(harness: rc.Harness) -> None:
    """An AsyncOpenAI client in the harness keeps one connection over calls; close() closes it."""
    with FakeOpenAI(fill_unscripted=True) as server:
        # No keep-alive expiry: httpx's 5 s one would open a second connection after a stall.
        # (The Limits class of whichever httpx this openai builds its client on.)
        limits = type(openai.DEFAULT_CONNECTION_LIMITS)(max_connections=10, keepalive_expiry=None)
        http_client = openai.DefaultAsyncHttpxClient(limits=limits)
        client = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="test", http_client=http_client
        )
        model_harness = rc.Harness(
            fs=harness.fs, llm=rc.OpenAICatalog(client, {"cheap": ["small-model"]})
        )
        for i in range(3):
            compacted = sync.response_compact(
                model_harness, big_exact(100 + i), Exact, Summary, OPTIONS
            )
            assert compacted.output.kind == "summarized"
            assert compacted.receipt.route == "small-model"
        assert len(server.requests) == 3
        assert server.connections == 1
        sync.close()
        assert client.is_closed()
        sync.close()  # a second close is harmless
        # Its client closed, the model would fail every summary into the fallback unseen.
        with pytest.raises(RuntimeError, match=r"closed by response_compaction\.sync\.close"):
            sync.response_compact(model_harness, big_exact(99), Exact, Summary, OPTIONS)
    # The next call starts a fresh background loop.
    value = Exact(rows=[], total=0)
    assert sync.response_compact(harness, value, Exact, Summary, OPTIONS).output.value == value


def test_a_model_whose_close_hangs_does_not_hold_close(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() (and so the interpreter's exit) is bounded by each model's ACLOSE_SECONDS."""
    monkeypatch.setattr(sync, "ACLOSE_SECONDS", 0.05)
    closing = threading.Event()

    class Stuck(HangingModel):
        async def aclose(self) -> None:
            closing.set()
            await anyio.sleep_forever()

    stuck = rc.Harness(fs=harness.fs, llm=Stuck())
    value = Exact(rows=[], total=0)  # small: the model is bound to the loop, never asked
    assert sync.response_compact(stuck, value, Exact, Summary, OPTIONS).output.value == value
    done = threading.Event()

    def close() -> None:
        sync.close()
        done.set()

    threading.Thread(target=close, daemon=True).start()
    assert done.wait(60), "close() waited on a hung aclose()"
    assert closing.is_set()


def test_a_new_model_equal_to_a_closed_one_is_a_new_model(harness: rc.Harness) -> None:
    """Models are told apart by identity: a fresh one that compares equal to one close()
    closed (a dataclass of its settings) was refused as closed, and never closed itself."""
    closed: list[int] = []

    class Model(HangingModel):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Model)

        def __hash__(self) -> int:
            return 1

        async def aclose(self) -> None:
            closed.append(id(self))

    value = Exact(rows=[], total=0)
    first, second = Model(), Model()
    first_harness = rc.Harness(fs=harness.fs, llm=first)
    assert (
        sync.response_compact(first_harness, value, Exact, Summary, OPTIONS).output.value == value
    )
    sync.close()
    second_harness = rc.Harness(fs=harness.fs, llm=second)
    assert (
        sync.response_compact(second_harness, value, Exact, Summary, OPTIONS).output.value == value
    )
    with pytest.raises(RuntimeError, match="closed by"):
        sync.response_compact(first_harness, value, Exact, Summary, OPTIONS)
    sync.close()
    assert closed == [id(first), id(second)]


_FORK_AFTER_USE = """
import os, sys
import response_compaction as rc
from response_compaction import sync
from tests.schemas import FALLBACK, Exact, Row, Summary

harness = rc.Harness(fs=rc.LocalWorkspace("ws"), llm=None)
value = Exact(rows=[Row(id=1, name="a")], total=1)
options = {"fallback": FALLBACK, "ladder": "cheap"}
ref = sync.response_compact(harness, value, Exact, Summary, options).receipt.exact_ref
for how in ("_exit", "exit"):
    child = os.fork()
    if child == 0:
        # A loop of the child's own; it ends, either way, without the parent's loop thread.
        found = sync.response_compaction_read_exact(harness, ref, Exact)
        code = 0 if found == rc.Found(value=value) else 3
        if how == "_exit":
            os._exit(code)
        sys.exit(code)
    _, status = os.waitpid(child, 0)
    print(how, os.waitstatus_to_exitcode(status), flush=True)  # not again by the next child
print(sync.response_compaction_read_exact(harness, ref, Exact) == rc.Found(value=value))
"""


def test_a_process_forked_after_a_call_runs_and_ends_in_the_child(tmp_path: Path) -> None:
    """The child of a fork after the facade ran (multiprocessing's fork, a prefork server)
    calls it and exits; it hung at the fork, where the parent's loop was let go of."""
    done = run_script(_FORK_AFTER_USE, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.split("\n") == ["_exit 0", "exit 0", "True", ""]


def test_nothing_left_behind_at_interpreter_exit(tmp_path: Path) -> None:
    """A script that never closes anything exits cleanly: no thread, socket or warning left."""
    script = textwrap.dedent(
        """
        import atexit, threading
        # Registered before the facade's own handler, so it runs after it.
        atexit.register(lambda: print("threads at exit:", threading.active_count()))
        import openai
        import response_compaction as rc
        from response_compaction import sync
        from tests.fake_openai import FakeOpenAI
        from tests.schemas import FALLBACK, Exact, Summary, big_exact

        with FakeOpenAI(fill_unscripted=True) as server:
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
            harness = rc.Harness(
                fs=rc.LocalWorkspace("ws"), llm=rc.OpenAICatalog(client, {"cheap": ["m"]})
            )
            options = {"fallback": FALLBACK, "ladder": "cheap", "summarize_above_bytes": 100}
            for i in range(2):
                out = sync.response_compact(harness, big_exact(50 + i), Exact, Summary, options)
                print(out.output.kind)
        """
    )
    done = run_script(script, tmp_path)
    assert done.stderr == ""
    assert done.returncode == 0
    assert done.stdout.split("\n") == ["summarized", "summarized", "threads at exit: 1", ""]


def test_ctrl_c_cancels_the_coroutine(tmp_path: Path) -> None:
    """Ctrl-C while blocked raises KeyboardInterrupt and cancels the coroutine behind it."""
    script = textwrap.dedent(
        """
        import os, signal, threading
        import response_compaction as rc
        from response_compaction import sync
        from tests._hanging import HANG_OPTIONS, HangingModel
        from tests.schemas import FALLBACK, Exact, Summary, big_exact

        model = HangingModel()

        def press_ctrl_c():
            model.started.wait()
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=press_ctrl_c, daemon=True).start()
        harness = rc.Harness(fs=rc.LocalWorkspace("ws"), llm=model)
        options = {"fallback": FALLBACK, **HANG_OPTIONS}
        try:
            sync.response_compact(harness, big_exact(100), Exact, Summary, options)
        except KeyboardInterrupt:
            print("interrupted")
        print("cancelled", model.cancelled.wait(30))
        """
    )
    done = run_script(script, tmp_path)
    assert done.stderr == ""
    assert done.stdout.split("\n") == ["interrupted", "cancelled True", ""]
    assert done.returncode == 0


def test_exit_cancels_a_call_still_in_flight(tmp_path: Path) -> None:
    """A daemon thread blocked in a call at exit is cancelled; the interpreter does not hang."""
    script = textwrap.dedent(
        """
        import atexit, threading
        import response_compaction as rc
        from response_compaction import sync
        from tests._hanging import HANG_OPTIONS, HangingModel
        from tests.schemas import FALLBACK, Exact, Summary, big_exact

        model = HangingModel()
        atexit.register(lambda: print("cancelled", model.cancelled.is_set()))  # after sync's
        harness = rc.Harness(fs=rc.LocalWorkspace("ws"), llm=model)
        options = {"fallback": FALLBACK, **HANG_OPTIONS}

        def call():
            sync.response_compact(harness, big_exact(100), Exact, Summary, options)

        threading.Thread(target=call, daemon=True).start()
        model.started.wait()
        print("exiting")
        """
    )
    done = run_script(script, tmp_path)
    assert done.stdout.split("\n") == ["exiting", "cancelled True", ""]
    assert done.returncode == 0
    # The coroutine was cancelled (its cleanup ran); the daemon thread was not woken to print
    # into a finalizing interpreter, which could abort the process.
    assert done.stderr == ""


class _InterruptingModel:
    """Raises KeyboardInterrupt from inside the model call, as a model adapter might."""

    def routes(self, ladder: str) -> tuple[str, ...]:
        return ("interrupts",)

    async def complete(self, route: str, request: rc.SummaryRequest) -> rc.RungReply:
        raise KeyboardInterrupt


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_loop_survives_a_keyboard_interrupt_from_a_model(harness: rc.Harness, backend: str) -> None:
    """A KeyboardInterrupt raised inside the coroutine reaches the caller; later calls work."""
    loop = sync._BackgroundLoop(backend)
    interrupting = rc.Harness(fs=harness.fs, llm=_InterruptingModel())
    options = {**OPTIONS, "ladder": "x"}
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.call(
                "response_compact",
                interrupting,
                rc.response_compact,
                interrupting,
                big_exact(100),
                Exact,
                Summary,
                options,
            )
        value = Exact(rows=[], total=0)
        after = loop.call(
            "response_compact",
            harness,
            rc.response_compact,
            harness,
            value,
            Exact,
            Summary,
            OPTIONS,
        )
        assert after.output.value == value
    finally:
        loop.close()
    loop.close()


class Abort(BaseException):
    """A model's own BaseException (not an Exception): it stopped the loop for every caller."""


class _AbortingModel(_InterruptingModel):
    def __init__(self, error: Callable[[], BaseException]) -> None:
        self.error = error

    async def complete(self, route: str, request: rc.SummaryRequest) -> rc.RungReply:
        raise self.error()


@pytest.mark.parametrize(
    "error",
    [Abort, lambda: BaseExceptionGroup("g", [asyncio.CancelledError(), KeyboardInterrupt()])],
    ids=["base-exception", "group-with-a-cancellation"],
)
def test_module_functions_survive_a_model_s_own_base_exception(
    harness: rc.Harness, error: Callable[[], BaseException]
) -> None:
    """It reaches the caller; later calls, for any harness, and close() keep working (they
    all raised "This portal is not running" until close(), which raised it too)."""
    aborting = rc.Harness(fs=harness.fs, llm=_AbortingModel(error))
    with pytest.raises((Abort, BaseExceptionGroup)):
        sync.response_compact(aborting, big_exact(100), Exact, Summary, {**OPTIONS, "ladder": "x"})
    value = Exact(rows=[], total=0)
    assert sync.response_compact(harness, value, Exact, Summary, OPTIONS).output.value == value
    sync.close()


class _ClosableModel(_InterruptingModel):
    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("joined", [True, False], ids=["thread-ended", "thread-ending"])
def test_a_loop_stopped_from_outside_is_started_again(harness: rc.Harness, joined: bool) -> None:
    """A loop that ended without close() is not called into again: the next call starts one.
    A model bound to it is refused with the reason (its client failed every summary)."""
    loop = sync._BackgroundLoop("asyncio")
    value = Exact(rows=[], total=0)
    bound = rc.Harness(fs=harness.fs, llm=_ClosableModel())
    try:
        loop.call("response_compact", bound, rc.response_compact, bound, value, Exact, Summary,
                  OPTIONS)  # fmt: skip
        portal = loop._portal_for(harness)
        portal.call(portal.stop)  # the loop ends: its thread returns, soon or already
        if joined:
            assert loop._thread is not None
            loop._thread.join()
        else:
            loop.close()  # raised "This portal is not running" while its thread was ending
        args = (harness, value, Exact, Summary, OPTIONS)
        after = loop.call("response_compact", harness, rc.response_compact, *args)
        assert after.output.value == value
        with pytest.raises(RuntimeError, match="background loop ended"):
            loop.call("response_compact", bound, rc.response_compact, bound, value, Exact,
                      Summary, OPTIONS)  # fmt: skip
    finally:
        loop.close()


def test_module_functions_survive_a_keyboard_interrupt(harness: rc.Harness) -> None:
    """Through the module functions too: after the interrupt, calls and close() keep working."""
    interrupting = rc.Harness(fs=harness.fs, llm=_InterruptingModel())
    with pytest.raises(KeyboardInterrupt):
        sync.response_compact(
            interrupting, big_exact(100), Exact, Summary, {**OPTIONS, "ladder": "x"}
        )
    value = Exact(rows=[], total=0)
    assert sync.response_compact(harness, value, Exact, Summary, OPTIONS).output.value == value
    sync.close()
