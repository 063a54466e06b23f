"""The store: one class over the backend its database names, and :func:`open_store`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resetctl.errors import StoreError
from resetctl.store.backend import is_postgres
from resetctl.store.instances import InstanceHealthRows
from resetctl.store.limits import LimitCounts
from resetctl.store.notice_writes import NoticeWrites
from resetctl.store.operations import Operations
from resetctl.store.outbox import OutboxMessages
from resetctl.store.rollout import RolloutRecords
from resetctl.store.sqlite.backend import BUSY_TIMEOUT_SECONDS, SqliteBackend

#: Seconds between two reads of the database's clock by one decision clock: in between,
#: the host's clock measures only the time gone by (its drift over this is negligible).
CLOCK_RESYNC = 5.0


class Store(
    NoticeWrites, Operations, OutboxMessages, LimitCounts, RolloutRecords, InstanceHealthRows
):
    """A resetctl database: all of resetctl's SQL, on SQLite or PostgreSQL.

    ``db`` is a file path (SQLite, the embedded default) or a ``postgresql://`` URI
    (libpq syntax; its password comes from PGPASSWORD, ~/.pgpass or a service file, never
    from the URI). A missing file, or an empty database, gets the schema; older ones are
    migrated. With ``must_exist`` (commands that only read) a missing file or a database
    without resetctl's schema is a StoreError and nothing is created. ``busy_timeout``
    bounds SQLite's wait for the write lock, in seconds (PostgreSQL's lock_timeout is the
    store's own).

    Every write to a notice row is a compare-and-set on its row version (and lease
    token); the store decides nothing about what happens next.
    """

    def __init__(
        self,
        db: str | Path,
        *,
        must_exist: bool = False,
        busy_timeout: float | None = None,
    ) -> None:
        if is_postgres(db):
            # Imported here: the embedded default never loads the server backend's stack.
            from resetctl.store.postgres.backend import PostgresBackend

            super().__init__(PostgresBackend(str(db), must_exist=must_exist))
        else:
            wait = BUSY_TIMEOUT_SECONDS if busy_timeout is None else busy_timeout
            super().__init__(SqliteBackend(db, wait, must_exist=must_exist))

    def decision_clock(self, host: Callable[[], float]) -> Callable[[], float]:
        """The clock every decision about this database's notices is made on (expiry,
        useful time left, poll slots, settle times, leases): ``host`` for a file only this
        host writes; where several hosts share the database, its own clock, read again
        every CLOCK_RESYNC seconds, with ``host`` measuring only how much time went by in
        between. Every host then judges on the same clock, whatever its own says."""
        database_clock = self.sql.database_clock
        if database_clock is None:
            return host
        read_clock = f"SELECT {database_clock}"
        anchor: list[float] = []  # [database minus host, when read (monotonic)]

        def now() -> float:
            read_at = time.monotonic()
            if not anchor or read_at - anchor[1] >= CLOCK_RESYNC:
                (database_now,) = self.conn.execute(read_clock).fetchone()
                anchor[:] = [float(database_now) - host(), read_at]
            return host() + anchor[0]

        return now

    def explain_claim(self) -> list[str]:
        """The query plan of the claim statement itself (tests and diagnostics)."""
        params: dict[str, object] = {
            "worker": "",
            "token": "",
            "until": 0.0,
            "now": 0.0,
            "limit": 1,
        }
        return self.database.explain(self.sql.claim, params)

    def storage(self) -> dict[str, Any]:
        """Measured bytes by table (with its indexes) and row counts: ``bytes`` are the
        pages allocated, ``encoded`` the records' own bytes in them."""
        allocated, encoded, total = self.database.table_bytes()
        first = self.conn.execute("SELECT MIN(at), MAX(at) FROM events").fetchone()
        return {
            "bytes": allocated,
            "encoded": encoded,
            "rows": self.row_counts(),
            "events_span": (first[0], first[1]),
            "file_bytes": total,
        }


def open_store(
    db: str | Path, *, must_exist: bool = False, busy_timeout: float | None = None
) -> Store:
    """Open the database ``db`` names: a file path (SQLite) or a ``postgresql://`` URI.

    The password of a PostgreSQL URI comes from PGPASSWORD, ~/.pgpass or a service file,
    never from the command line. ``busy_timeout`` bounds SQLite's wait for the write lock
    (PostgreSQL's lock_timeout is the store's own).
    """
    return Store(db, must_exist=must_exist, busy_timeout=busy_timeout)


def copy_database(source: Store, target_uri: str, now: float) -> dict[str, int]:
    """Copy the SQLite database ``source`` into the empty PostgreSQL database at
    ``target_uri``; returns the rows copied per table, verified on both sides."""
    if not isinstance(source.database, SqliteBackend):
        raise StoreError(f"database {source.path}: db copy reads a SQLite file")
    from resetctl.store.postgres.backend import PostgresBackend
    from resetctl.store.postgres.copy import copy_into

    target = PostgresBackend(target_uri)
    try:
        return copy_into(source.database.conn, target, now)
    finally:
        target.close()
