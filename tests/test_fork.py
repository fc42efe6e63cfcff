"""A process forked while another thread held one of the library's locks.

The child has only the forking thread: a lock some other thread held at the fork stays held
forever there, and the child's next store call would wait on it. Each module makes its locks
again in the child (``os.register_at_fork``), and a pause of the GC taken by a thread the
child lacks ends with the fork.
"""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: a fork of the test process (its threads running) can leave the
# child waiting on a lock held by one of them, whatever this library does.
_SCRIPT = """
import gc, os, threading
from response_compaction import _part_index, _perf
from response_compaction._store import _index, _paths, _tree

witness = _index._witnesses.setdefault("/nowhere", _index._Witness())
locks = {
    "tree": lambda: _tree._lock,
    "swept": lambda: _paths._swept_lock,
    "counts": lambda: _part_index._COUNTS_LOCK,
    "perf": lambda: _perf._lock,
    "witness": lambda: witness._lock,
}
holding, release = threading.Event(), threading.Event()

def hold():
    with _perf.paused_gc():
        for get in locks.values():
            get().acquire()
        holding.set()
        release.wait()
        for get in locks.values():
            get().release()

thread = threading.Thread(target=hold)
thread.start()
holding.wait()
assert not gc.isenabled()
child = os.fork()
if child == 0:
    held = [name for name, get in locks.items() if not get().acquire(blocking=False)]
    if held:
        os._exit(3)
    for get in locks.values():
        get().release()
    enabled = gc.isenabled()
    with _perf.paused_gc():  # a pause of the child's own ends as it should
        pass
    os._exit(0 if enabled and gc.isenabled() else 4)
release.set()
thread.join()
_, status = os.waitpid(child, 0)
assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
assert gc.isenabled()
"""


def test_a_child_forked_while_a_thread_held_the_locks_can_take_them() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


_WORKERS_AFTER_FORK = """
import os
from response_compaction import _pool

pool = _pool.POOL
pool.start()
assert pool.wait_ready(lambda idle: idle >= 1, 60)
socks = [worker.sock for worker in pool._all]
child = os.fork()
if child == 0:
    # The parent's worker sockets are let go of (else its workers never read end-of-file
    # when the parent stops them at exit), and the child has a pool of its own.
    closed = all(sock.fileno() == -1 for sock in socks)
    os._exit(0 if closed and _pool.POOL is not pool else 5)
_, status = os.waitpid(child, 0)
assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
assert all(sock.fileno() != -1 for sock in socks)  # the parent's own are untouched
"""


def test_a_forked_child_lets_go_of_the_parent_s_worker_sockets() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WORKERS_AFTER_FORK],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
