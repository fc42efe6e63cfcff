"""Time in a store shared by writers whose clocks disagree: the rules no single clock can abuse.

Every process is a *writer* with a random id. Each write (and each batch of recorded uses)
records the writer's clock in the ``clocks`` table (its highest value seen), and each entry
row names the writer that last stored it. From these:

* **Deleting by expiry** needs two clocks: a row is deleted only when it is expired by the
  deleting writer's clock AND either that writer stored it itself, or the highest clock
  recorded by some *other* writer has passed its expiry too. One writer ten years ahead can
  delete its own entries, never another writer's live ones.
* **The attested time** a writer uses is ``max(its clock, the highest clock it recorded
  itself, the second-highest clock recorded by anyone)``. A clock going backwards is corrected
  by what was already witnessed, so it neither revives an expired entry (reads say ``Missing``)
  nor stores an expiry earlier than the honest one; one clock far ahead cannot move the
  second-highest value. A stored expiry only ever moves later.
* **Capacity eviction** (``max_entries``) follows a use counter, not a clock: each store or
  recorded read takes the next number, and the lowest numbers go first.
"""

from __future__ import annotations

import errno
import math
import secrets
import sqlite3
from collections.abc import Callable

from .._errors import StoreError
from ._paths import PROCESS

__all__ = [
    "ATTESTED_SQL",
    "DELETABLE_SQL",
    "MAX_CLOCKS",
    "attested_sql",
    "finite_clock",
    "record_clock",
    "writer_id",
]

#: Writers whose clocks are kept (the highest ones); older entries only ever lower nothing.
MAX_CLOCKS = 64

_writer: tuple[int, str] = (-1, "")


def finite_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """An injected clock whose NaN or infinite time is a :class:`StoreError`, not a time.

    A NaN compares false with every expiry (an expired entry read ``Found``), and an
    infinite one expires everything it stores before the receipt is read.
    """

    def now() -> float:
        value = clock()
        if not math.isfinite(value):
            raise StoreError(errno.EINVAL, "the workspace clock gave a time that is not finite")
        return value

    return now


def writer_id() -> str:
    """The writer id of this process (a new one after fork)."""
    global _writer
    pid = PROCESS.pid  # not os.getpid(): a system call, on every read (see _paths.PROCESS)
    if _writer[0] != pid:
        _writer = (pid, secrets.token_hex(8))
    return _writer[1]


# Only numbers count as clocks: SQLite orders any text above every number, so a corrupt cell
# would otherwise witness every expiry.


def attested_sql(now: str, me: str) -> str:
    """The attested time (see the module docstring) as SQL, for the placeholders given.

    Reads bind numbered placeholders (``?3``): a tuple binds faster than a dict of names,
    and Python 3.12 warns when names are bound from a tuple. The second-highest clock walks
    the ``clocks_seen`` index (``_sqlite``) instead of sorting the table in a temp B-tree:
    1.4 us of a 5 us lookup with one writer, and it grew with every writer (9 us at 61).
    """
    # Only placeholder names are put in (constants of this package), never a value.
    return f"""max({now},
    coalesce((SELECT seen FROM clocks WHERE writer = {me}
        AND typeof(seen) IN ('integer', 'real')), {now}),
    coalesce((SELECT seen FROM clocks WHERE typeof(seen) IN ('integer', 'real')
        ORDER BY seen DESC LIMIT 1 OFFSET 1), {now}))"""  # noqa: S608


#: The attested time for writer ``:me`` and clock ``:now`` (see the module docstring).
ATTESTED_SQL = attested_sql(":now", ":me")

#: Whether a row may be deleted by expiry by writer ``:me`` at attested time ``:now``.
DELETABLE_SQL = """(typeof(expires_at) IN ('integer', 'real') AND expires_at <= :now
    AND (writer IS :me OR expires_at <= (SELECT max(seen) FROM clocks
        WHERE writer != :me AND typeof(seen) IN ('integer', 'real'))))"""


# Writers of this process that trimmed the table after recording themselves (see below).
_trimmed: set[str] = set()


def record_clock(conn: sqlite3.Connection, me: str, now: float) -> None:
    """Record ``now`` as seen by writer ``me`` (never lowering it); keep the highest few.

    Only a writer's first record in a process can add a row, so only it trims (a statement
    less per write): a writer trimmed away by others and back adds one row until the next
    new writer trims, so the table stays near ``MAX_CLOCKS`` rows.
    """
    conn.execute(
        "INSERT INTO clocks VALUES (?, ?) ON CONFLICT (writer)"
        " DO UPDATE SET seen = max(seen, excluded.seen)",
        (me, now),
    )
    if me in _trimmed:
        return
    _trimmed.add(me)  # before the DELETE: a rolled-back trim is redone by the next new writer
    conn.execute(
        "DELETE FROM clocks WHERE writer NOT IN"
        " (SELECT writer FROM clocks ORDER BY seen DESC LIMIT ?)",
        (MAX_CLOCKS,),
    )
