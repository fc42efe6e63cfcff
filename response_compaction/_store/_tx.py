"""The index's rows and its write statements (valid only inside ``Index.transaction``)."""

from __future__ import annotations

import math
import re
import sqlite3
from typing import NamedTuple

from ._clocks import ATTESTED_SQL, DELETABLE_SQL, attested_sql, record_clock, writer_id
from ._paths import KINDS, Kind, valid_name

__all__ = [
    "HAS_ROW",
    "HEX",
    "LOOKUP",
    "CorruptRowError",
    "Entry",
    "Row",
    "Transaction",
    "entry_of",
    "number",
]

HEX = re.compile(r"[0-9a-f]{64}")
# Constant fragments from _clocks; every value is a bound parameter.
_EXPIRED = f"SELECT kind, key FROM entries WHERE {DELETABLE_SQL} LIMIT :limit"  # noqa: S608
_BEYOND_BOUND = (
    "SELECT key FROM entries WHERE kind = :kind AND key != :keep"  # noqa: S608
    f" AND NOT {DELETABLE_SQL} ORDER BY last_used DESC LIMIT -1 OFFSET :skip"
)
#: Bound as (kind, key, now, writer id): numbered, so a tuple binds it (see attested_sql).
LOOKUP = (
    f"SELECT digest, size, expires_at, layout, {attested_sql('?3', '?4')}"  # noqa: S608
    " FROM entries WHERE kind = ?1 AND key = ?2"
)
_ATTESTED = f"SELECT {ATTESTED_SQL}"
#: Use numbers at or above this are passed over (a tampered cell): from 2**53 on, adding one
#: gives the same float, and every later use would tie.
_USES_LIMIT = float(1 << 53)
#: The highest use number recorded: each kind's most recent row by its LRU index (numbers
#: only: SQLite sorts text and blobs above every number), and the counter an older version
#: of this library kept in ``meta``. Bound to ``(*KINDS, _USES_LIMIT)``.
_TOP_USES = (
    "SELECT (SELECT value FROM meta WHERE name = 'uses'),"
    " (SELECT last_used FROM entries WHERE kind = ?1 AND last_used < ?3"
    " ORDER BY last_used DESC LIMIT 1),"
    " (SELECT last_used FROM entries WHERE kind = ?2 AND last_used < ?3"
    " ORDER BY last_used DESC LIMIT 1)"
)
#: What a put asks before recording its row, in one statement rather than three (each about
#: 3 us between two puts): the attested time, the row's expiry, and the ``_TOP_USES``. Bound to
#: ``(*KINDS, _USES_LIMIT, now, writer id, kind, key)``.
_BEFORE_UPSERT = (
    f"SELECT {attested_sql('?4', '?5')},"  # noqa: S608
    " (SELECT expires_at FROM entries WHERE kind = ?6 AND key = ?7),"
    + _TOP_USES.removeprefix("SELECT ")
)

# An upsert, not INSERT OR REPLACE: a replace deletes without firing triggers. An expiry is
# kept if later, unless it is not a finite number as :func:`number` reads one (an infinity
# minus itself is NaN, which SQLite makes NULL).
_UPSERT = (
    "INSERT INTO entries (kind, key, digest, size, expires_at, last_used, layout, writer)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, key)"
    " DO UPDATE SET digest = excluded.digest, size = excluded.size,"
    " expires_at = CASE WHEN typeof(expires_at) IN ('integer', 'real')"
    " AND expires_at - expires_at = 0"
    " THEN max(expires_at, excluded.expires_at) ELSE excluded.expires_at END,"
    " last_used = excluded.last_used, layout = excluded.layout, writer = excluded.writer"
)


class CorruptRowError(ValueError):
    """An index row whose cells are not what this library writes (types, names, ranges)."""


def number(value: object) -> float | None:
    if type(value) is float:  # the usual cell first: every read asks twice (a finite x - x is 0)
        return value if value - value == 0.0 else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class Row(NamedTuple):
    """What a read needs to know about one entry."""

    digest: str
    size: int
    expires_at: float
    layout: bytes | None
    #: The attested time (see ``_clocks``) when this row was read; 0 when not read back.
    attested: float = 0.0


class Entry(NamedTuple):
    """One recorded entry, as ``verify`` walks them."""

    kind: Kind
    key: str
    digest: str
    size: int
    expires_at: float
    corrupt: bool = False


def entry_of(kind: object, key: object, digest: object, size: object, expires: object) -> Entry:
    """An :class:`Entry`, or a corrupt one (for verify to report) when a cell is wrong."""
    if not (isinstance(kind, str) and isinstance(key, str) and valid_name(kind, key)):
        raise CorruptRowError("index row names no entry")
    when = number(expires)
    if not (isinstance(digest, str) and HEX.fullmatch(digest)) or when is None:
        return Entry(kind, key, "", 0, 0.0, corrupt=True)  # type: ignore[arg-type]
    if not (isinstance(size, int) and size >= 0):
        return Entry(kind, key, "", 0, 0.0, corrupt=True)  # type: ignore[arg-type]
    return Entry(kind, key, digest, size, when)  # type: ignore[arg-type]


#: Whether a key is recorded (expired or not), bound as (kind, key).
HAS_ROW = "SELECT 1 FROM entries WHERE kind = ? AND key = ?"


class Transaction:
    """The write statements, valid only inside :meth:`Index.transaction`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.me = writer_id()
        self._uses: float | None = None
        self._attested: tuple[float, float] | None = None  # (now, attested at now)
        #: The rows of each kind as :meth:`victims` last counted them (before evicting).
        self.counted: dict[str, int] = {}

    def next_use(self) -> float:
        """The next number of the use counter that orders capacity eviction (not a clock).

        One above every use recorded, read from the rows themselves rather than kept in a
        counter row: a counter was one more page in every write's WAL commit (7 pages,
        each ~10 us of its fsync here). A number freed by an eviction may be taken again,
        which orders nothing differently: every live row's is lower.

        An older version's counter, found, counts and is deleted: that version trusts it
        whenever it exists (and looks at the rows when it does not), so a counter left stale
        gave its newest writes the lowest numbers.
        """
        if self._uses is None:
            row = self._conn.execute(_TOP_USES, (*KINDS, _USES_LIMIT)).fetchone()
            self._uses = self._top_uses(*row)
        self._uses += 1
        return self._uses

    def _top_uses(self, counter: object, *tops: object) -> float:
        """The highest use in a ``_TOP_USES`` row; an older version's counter is deleted."""
        if counter is not None:
            self._conn.execute("DELETE FROM meta WHERE name = 'uses'")
        found = (number(top) for top in (counter, *tops))
        return max((n for n in found if n is not None and n < _USES_LIMIT), default=0.0)

    def attested(self, now: float) -> float:
        """``now`` corrected by the clocks already witnessed (see ``_clocks``).

        Asked once per transaction and ``now``: no other writer can record a clock while
        this transaction holds the write lock, and this one records only ``now`` (``saw``).
        """
        if self._attested is not None and self._attested[0] == now:
            return self._attested[1]
        (value,) = self._conn.execute(_ATTESTED, {"now": now, "me": self.me}).fetchone()
        attested = number(value) or now
        self._attested = (now, attested)
        return attested

    def saw(self, now: float) -> None:
        """Record this writer's clock."""
        self._attested = None  # it may raise this writer's own highest clock
        record_clock(self._conn, self.me, now)

    def is_live(self, kind: Kind, key: str, now: float) -> bool:
        """Whether ``key`` has an unexpired row.

        Asked before an upsert: the same statement reads the attested time at ``now`` and
        (first time) the highest use, which the upsert then needs.
        """
        attested, expires, *uses = self._conn.execute(
            _BEFORE_UPSERT, (*KINDS, _USES_LIMIT, now, self.me, kind, key)
        ).fetchone()
        self._attested = (now, number(attested) or now)
        if self._uses is None:
            self._uses = self._top_uses(*uses)
        when = number(expires)
        return when is not None and when > now

    def upsert(self, kind: Kind, key: str, row: Row, now: float) -> None:
        """Record ``key`` as just stored and used.

        ``row.expires_at`` was computed from ``now``; a clock behind the attested time is
        corrected, and an expiry already recorded is never moved earlier, unless it is not a
        finite number (a tampered cell: SQLite ranks text above every number, so ``max``
        kept it, and the new receipt read Broken for good).
        """
        expires_at = row.expires_at + max(0.0, self.attested(now) - now)
        self._conn.execute(
            _UPSERT,
            (kind, key, row.digest, row.size, expires_at, self.next_use(), row.layout, self.me),
        )

    def has_row(self, kind: Kind, key: str) -> bool:
        """Whether ``key`` is recorded (expired or not)."""
        return self._conn.execute(HAS_ROW, (kind, key)).fetchone() is not None

    def writer_of(self, kind: Kind, key: str) -> object:
        """The writer that last stored or renewed ``key`` (as recorded: maybe not a str)."""
        found = self._conn.execute(
            "SELECT writer FROM entries WHERE kind = ? AND key = ?", (kind, key)
        ).fetchone()
        return None if found is None else found[0]

    def renew(self, kind: Kind, key: str, row: Row, now: float) -> bool:
        """Store ``key`` again without rewriting it; False if no live row holds ``row``'s digest.

        The row gets ``row``'s expiry (never earlier than recorded), a use, and this writer.
        """
        attested = self.attested(now)
        cursor = self._conn.execute(
            "UPDATE entries SET expires_at = max(expires_at, ?), last_used = ?, writer = ?"
            " WHERE kind = ? AND key = ? AND digest = ? AND size = ? AND expires_at > ?",
            (
                row.expires_at + max(0.0, attested - now),
                self.next_use(),
                self.me,
                kind,
                key,
                row.digest,
                row.size,
                attested,
            ),
        )
        return cursor.rowcount == 1

    def victims(
        self,
        kinds: tuple[Kind, ...],
        now: float,
        max_entries: int | None,
        *,
        keep: str = "",
        expired_limit: int = -1,
    ) -> list[tuple[Kind, str]]:
        """The rows to evict: expired ones, then each kind's least recently used beyond the bound.

        Expired means deletable by this writer at the attested time (``_clocks``: one skewed
        clock cannot delete another writer's live rows). At most ``expired_limit`` expired
        rows (-1: all). ``keep`` is never chosen, and counts as one of the ``max_entries``.
        """
        params = {"now": self.attested(now), "me": self.me}
        found: list[tuple[Kind, str]] = [
            (kind, key)
            for kind, key in self._conn.execute(
                _EXPIRED,
                {**params, "limit": expired_limit},
            )
        ]
        if max_entries is None:
            return found
        for kind in kinds:
            counted = self._conn.execute("SELECT n FROM counts WHERE kind = ?", (kind,)).fetchone()
            if counted is not None and isinstance(counted[0], int):
                self.counted[kind] = counted[0]
            # The counter includes expired rows not yet deleted, so it only says when to look.
            if counted is None or (isinstance(counted[0], int) and counted[0] <= max_entries):
                continue
            found.extend(
                (kind, key)
                for (key,) in self._conn.execute(
                    _BEYOND_BOUND,
                    {
                        **params,
                        "kind": kind,
                        "keep": keep,
                        "skip": max_entries - 1 if keep else max_entries,
                    },
                )
            )
        return found

    def touch(self, kind: Kind, key: str, when: float) -> None:
        """Record a use of ``key`` (read at ``when``, which only feeds the witnessed clock)."""
        self._conn.execute(
            "UPDATE entries SET last_used = ? WHERE kind = ? AND key = ?",
            (self.next_use(), kind, key),
        )

    def delete(self, kind: Kind, key: str) -> None:
        """Drop one row."""
        self._conn.execute("DELETE FROM entries WHERE kind = ? AND key = ?", (kind, key))

    def keys(self, kind: Kind) -> set[str]:
        """Every recorded key of ``kind``, expired or not."""
        return {
            key for (key,) in self._conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
        }
