"""The pool of verification workers (``python -m response_compaction._worker``), per process.

msgspec holds the GIL while it decodes, so verifying a large value in a thread freezes the
caller's event loop, and verifying many at once uses one core. Large values nobody needs the
decoded value of are verified in worker processes instead: the worker reads the temporary
file itself, checks its size and sha256 and decodes it against the schema, GC off.

The worker is the library's own module ``response_compaction._worker``, never the caller's
``__main__`` (``multiprocessing``-style workers re-import it: an unguarded
``asyncio.run(main())`` ran the caller's program again in the worker). The schema travels as
module-and-qualname references (``list[pkg.mod.Row] | None``, ``_described``); one that
cannot (in ``__main__``, a function, a factory) is verified in the caller, as is one a worker
cannot load: never skipped.

One worker per usable core, started in the background when the process opens its first
store (warm before the first large value), shared by every store and loop, shut down at
exit. A call finding no idle worker may queue behind a busy one of its own event loop
(``_verifiers``), or verify in the caller: the caller's core is one more worker.

Workers also cut a part of a large stored entry for ``read_part`` (request kind ``part``,
see ``_store._partial``): they read it, check its keyed digest and send back only the part.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["NOT_DONE", "POOL", "call", "receive", "send", "usable_cores"]

#: What :func:`verify` returns when no worker did the job: the caller must verify.
NOT_DONE: Any = object()

_HEADER = struct.Struct(">I")
_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.Decoder().decode


def send(file: Any, payload: Any) -> None:
    data = _ENCODE(payload)
    file.write(_HEADER.pack(len(data)) + data)
    file.flush()


def receive(file: Any) -> Any:
    header = file.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("verification worker closed its pipe")
    (length,) = _HEADER.unpack(header)
    data = file.read(length)
    if len(data) < length:
        raise EOFError("verification worker closed its pipe")
    return _DECODE(data)


class _Worker:
    """One worker process and our end of the socket pair that is its stdin and stdout.

    Requests and replies go over the socket on the event loop itself (non-blocking, woken by
    ``anyio.wait_readable``), not through a worker thread: while the loop encoded other values
    a thread waited for the GIL after each of its syscalls (up to the 5 ms switch interval),
    so a 3 ms verification took 10-70 ms to come back.
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.sock, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and fixed entry
                # -P: no working directory first on sys.path (a planted msgspec.py was run)
                [sys.executable, "-P", "-c", _ENTRY],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                env=env,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self.used = False
        #: Requests sent (or being sent) and not yet answered; one more may queue behind one.
        self.queued = 0
        #: The bytes of the files those requests verify (their ``size``).
        self.queued_bytes = 0
        self.sending = False
        #: A call on it failed or was cancelled: its replies no longer line up with calls.
        self.broken = False
        self._sent = 0
        self._answered = 0
        self._turn: Any = None  # an anyio.Event of the loop whose calls queue here

    def ready(self) -> bool:
        """Blocking (a starter thread): whether the worker said it is ready."""
        try:
            (length,) = _HEADER.unpack(_recv_blocking(self.sock, _HEADER.size))
            ok = bool(_DECODE(_recv_blocking(self.sock, length)).get("ready"))
        except (EOFError, OSError, msgspec.DecodeError):
            return False
        self.sock.setblocking(False)
        return ok

    def can_queue(self, most_bytes: int) -> bool:
        """Whether one more request may be sent now, behind a job of at most ``most_bytes``.

        The worker starts it as soon as it is done, not when the caller's loop next comes
        round to send it: in 32 concurrent compactions the loop encodes for milliseconds at a
        time, and the workers had idled about a third of the time. Behind a larger job it
        could wait longer than for another worker.
        """
        return (
            self.queued == 1
            and self.queued_bytes <= most_bytes
            and not self.sending
            and not self.broken
        )

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send ``request`` and wait for the reply on the event loop (no thread).

        Two calls may be outstanding (:meth:`can_queue`), both from the event loop that
        holds the worker: the worker answers in order, and only the call whose reply is next
        reads the socket. Once a call fails or is cancelled the worker is :attr:`broken`
        and the calls behind it raise ``EOFError`` without reading.
        """
        self.used = True
        data = _ENCODE(request)
        ticket, self._sent = self._sent, self._sent + 1
        size = request.get("size")
        size = size if type(size) is int else 0
        self.queued += 1
        self.queued_bytes += size
        try:
            await self._send(memoryview(_HEADER.pack(len(data)) + data))
            await self._turn_of(ticket)
            (length,) = _HEADER.unpack(await self._recv(_HEADER.size))
            reply: dict[str, Any] = _DECODE(await self._recv(length))
        except BaseException:
            self.broken = True
            raise
        finally:
            self.queued -= 1
            self.queued_bytes -= size
            self._answered = max(self._answered, ticket + 1)
            if self._turn is not None:
                self._turn.set()
                self._turn = None
        return reply

    async def _send(self, out: memoryview) -> None:
        import anyio

        self.sending = True
        while out:
            try:
                out = out[self.sock.send(out) :]
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
        self.sending = False

    async def _turn_of(self, ticket: int) -> None:
        """Wait until the reply to read next is ``ticket``'s; EOFError once :attr:`broken`."""
        import anyio

        while self._answered != ticket and not self.broken:
            self._turn = self._turn or anyio.Event()
            await self._turn.wait()
        if self.broken:
            raise EOFError("a call before this one on the verification worker failed")

    async def _recv(self, size: int) -> bytearray:
        import anyio

        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            try:
                count = self.sock.recv_into(view[got:])
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            if count == 0:
                raise EOFError("verification worker closed its socket")
            got += count
        return buffer

    def stop(self, wait: float) -> None:
        self.sock.close()  # the worker reads end-of-file and exits
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _recv_blocking(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("verification worker closed its socket")
        data += chunk
    return data


# ``python -m response_compaction._worker``, niced first: a worker's start (an interpreter and
# this package's imports, ~0.2 s of CPU) must not compete with the caller, whose first large
# compaction it otherwise slowed by 0.2 s on 2 cores; verifying is background work too.
_ENTRY = (
    "import os; os.nice(10); import runpy;"
    " runpy.run_module('response_compaction._worker', run_name='__main__', alter_sys=True)"
)
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class Pool:
    """Verification workers of this process: one per usable core, started in the background."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._started = False
        self._closed = False
        self._pid = os.getpid()
        #: Requests answered by a worker, and workers checked out (tests and benchmarks).
        self.calls = self.checkouts = 0
        self._threads: list[threading.Thread] = []

    def ready_count(self) -> int:
        """How many workers are idle and ready now."""
        with self._lock:
            return len(self._idle)

    def worker_count(self) -> int:
        """How many workers are starting, idle or busy now (tests)."""
        with self._lock:
            return len(self._all)

    def wait_ready(self, ready: Callable[[int], bool], timeout: float) -> bool:
        """Block until ``ready(idle worker count)`` holds (tests, benchmarks); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: ready(len(self._idle)), timeout)

    def start(self) -> None:
        """Start the workers (once per process) without waiting for them."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            count = usable_cores()
        for _ in range(count):
            self._spawn_soon()

    def _spawn_soon(self) -> None:
        thread = threading.Thread(target=self._spawn, name="rc-worker-start", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _spawn(self) -> None:
        env = dict(os.environ)
        # The worker finds this package first, then whatever the caller could import.
        paths = [_PACKAGE_PARENT, *(p or os.getcwd() for p in sys.path)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        try:
            worker = _Worker(env)
        except OSError:
            return  # no workers: every value is verified in the caller
        with self._lock:
            if self._closed:
                worker.stop(0)
                return
            self._all.append(worker)
        if not worker.ready():  # it died starting: not counted, not replaced (no respawn loop)
            with self._lock:
                if worker in self._all:
                    self._all.remove(worker)
            worker.stop(0)
            return
        with self._lock:
            if self._closed:
                return
            self._idle.append(worker)
            self._changed.notify_all()

    def checkout(self) -> _Worker | None:
        """An idle, ready worker, or None (verify in the caller)."""
        with self._lock:
            self._changed.notify_all()
            self.checkouts += bool(self._idle)
            return self._idle.pop() if self._idle else None

    def checkin(self, worker: _Worker) -> None:
        """Give back a worker that answered."""
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                self._changed.notify_all()
                return
        worker.stop(1)

    def discard(self, worker: _Worker) -> None:
        """Kill a worker whose call was cancelled or failed, and start a replacement.

        Its exit is waited for by a helper, not the caller (the loop's thread): a killed
        process holding 50 MB / 300 MB / 1 GB took 4 / 21 / 59 ms to exit here.
        """
        from ._store._aside import Aside  # not at import: the store imports this module

        worker.proc.kill()
        with self._lock:
            # Once, should a worker ever be discarded twice (only the last call out does).
            replace = worker in self._all and not self._closed
            if worker in self._all:
                self._all.remove(worker)
        Aside(worker.stop, 1, pool="reap")
        if replace:
            self._spawn_soon()

    def close(self) -> None:
        """Stop every worker: idle ones read end-of-file and exit; others are killed."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = self._all, [], []
            threads, self._threads = self._threads, []
        for worker in workers:
            if not worker.used:
                worker.proc.kill()
            worker.stop(2)
        for thread in threads:
            thread.join(2)


POOL = Pool()
atexit.register(POOL.close)


def _after_fork() -> None:
    global POOL
    # The parent's workers are the parent's: a child starts its own and closes its copies of
    # their sockets (held, a worker stopped at the parent's exit waited 2 s for end-of-file).
    for worker in POOL._all:
        with contextlib.suppress(OSError):
            worker.sock.close()
    POOL = Pool()
    atexit.register(POOL.close)


os.register_at_fork(after_in_child=_after_fork)


async def call(request: dict[str, Any], worker: _Worker | None = None) -> Any:
    """A worker's reply to ``request`` (``worker``, else an idle one), or NOT_DONE.

    NOT_DONE: no worker was idle, or it could not do the job.
    """
    worker = worker or POOL.checkout()
    if worker is None:
        return NOT_DONE
    try:
        reply = await worker.call(request)
    except Exception:  # broken: the caller verifies
        worker.broken = True
        return NOT_DONE
    except BaseException:  # cancelled
        worker.broken = True
        raise
    finally:
        # The last call out gives it back, or kills it once a call on it failed or was
        # cancelled (killing drops what it was doing; its replies no longer line up). Not
        # before: the call reading its socket must not have it closed under it.
        if not worker.queued:
            (POOL.discard if worker.broken else POOL.checkin)(worker)
    if "error" in reply:
        return NOT_DONE
    POOL.calls += 1
    return reply
