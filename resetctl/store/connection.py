"""What every part of the store stands on: the backend its database names (SQLite or
PostgreSQL), the connection, write transactions, rows as dicts, and the options that
change what a write does (set by explicit methods, never by poking attributes).
"""

from __future__ import annotations

import contextlib
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

from resetctl.store.backend import Dialect
from resetctl.store.records import OutboxRow
from resetctl.store.sqlite.backend import SqliteBackend

if TYPE_CHECKING:  # loaded only for a PostgreSQL URI (see Store)
    from resetctl.store.postgres.backend import PostgresBackend
    from resetctl.store.postgres.connection import PgConnection

#: One of the two backends.
Backend: TypeAlias = "SqliteBackend | PostgresBackend"
#: The connection a backend runs statements on.
RawConnection: TypeAlias = "sqlite3.Connection | PgConnection"

LOGGER = logging.getLogger("resetctl.store")
#: How many times a write the database rolled back to break a lock cycle is run again.
LOCK_CYCLE_RETRIES = 8
T = TypeVar("T")


class StoreConnection:
    """The store over an open backend: the connection every statement runs on, write
    transactions, and the options of its writes."""

    def __init__(self, database: Backend) -> None:
        #: the backend: its connection handling, dialect and schema
        self.database = database
        #: the SQL fragments that differ between backends
        self.sql: Dialect = database.dialect
        #: what the store was opened from (a file path, or a URI without its password)
        self.path = database.path
        self._before_commit: Callable[[str], None] | None = None
        self._keep_outbox_content = False
        self._outbox_deferred = False
        self._deferred_outbox: list[OutboxRow] = []
        #: the sweep's calling threads add deferred messages while its own thread writes
        self._deferred_lock = threading.Lock()

    @property
    def backend(self) -> str:
        """ "sqlite" or "postgresql"."""
        return self.database.name

    @property
    def conn(self) -> RawConnection:
        """The connection every statement runs on (the backend's)."""
        return self.database.conn

    @conn.setter
    def conn(self, wrapped: Any) -> None:
        # Tests wrap the connection to count or trace what the store sends.
        self.database.conn = wrapped

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self.database.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[RawConnection]:
        """A write transaction: committed on success, else rolled back. Outbox messages
        deferred by :meth:`defer_outbox` are written first, so they commit with the
        outcomes that record them."""
        with self.database.transaction() as conn, self._joined_writes():
            yield conn

    def retried_transaction(self, body: Callable[[], T]) -> T:
        """``body`` inside :meth:`transaction`, run again (after a short random pause)
        when the database rolled it back to break a cycle of writers waiting on each
        other. Nothing of a rolled-back run is kept, so running it again is safe; a body
        must only write the database (no calls, no output) and read its results from
        what it wrote."""
        tries = 0
        while True:
            tries += 1
            try:
                with self.transaction():
                    return body()
            except self.database.lock_cycles as exc:
                if tries == LOCK_CYCLE_RETRIES:
                    raise
                LOGGER.info("write rolled back by the database (%s); again", type(exc).__name__)
                # The other writer finishes in milliseconds; a random pause keeps the two
                # from meeting in the same order again.
                time.sleep(random.uniform(0.001, 0.005 * tries))

    @contextlib.contextmanager
    def _joined_writes(self) -> Iterator[None]:
        """Writes held back for the next transaction, made inside it (the outbox's)."""
        yield

    def _dicts(
        self, sql: str, params: Sequence[object] | dict[str, object]
    ) -> list[dict[str, Any]]:
        """Rows of a read-only query as dicts."""
        return self.database.dicts(sql, params)

    def call_before_commit(self, hook: Callable[[str], None] | None) -> None:
        """Call ``hook`` with each step kind of a round, once per kind in order, after the
        round's writes and before its commit (fault injection's seam); None removes it."""
        self._before_commit = hook

    def keep_outbox_content(self, keep: bool = True) -> None:
        """Keep the outbox's rendered messages after their notice ends ([outbox]
        keep_content, for development); by default they are scrubbed with the notice."""
        self._keep_outbox_content = keep

    @contextlib.contextmanager
    def checkpoints_aside(self) -> Iterator[None]:
        """Inside: commits never wait for a checkpoint (see the backend's)."""
        with self.database.checkpoints_aside():
            yield

    @contextlib.contextmanager
    def defer_outbox(self) -> Iterator[None]:
        """Inside: outbox messages join the next write transaction (a sweep's round
        outcomes) instead of committing on their own."""
        before, self._outbox_deferred = self._outbox_deferred, True
        try:
            yield
        finally:
            self._outbox_deferred = before
