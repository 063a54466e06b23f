"""The SQLite connection: one file, opened private to its owner and brought to the current
schema, autocommit, and every write inside an explicit ``BEGIN IMMEDIATE`` that is never
held across a transport call (WAL, ``busy_timeout``, ``synchronous=NORMAL``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from resetctl.errors import StoreError
from resetctl.files import create_private
from resetctl.privacy import warn_if_shared
from resetctl.store.backend import Dialect
from resetctl.store.sqlite.dialect import DIALECT
from resetctl.store.sqlite.schema import migrate

#: How long a write waits for another writer's lock by default: seconds.
BUSY_TIMEOUT_SECONDS = 30.0
#: The files SQLite keeps beside a database, by suffix.
COMPANION_SUFFIXES = ("-wal", "-shm", "-journal")
#: Seconds a connection that lost the race to switch a new file to WAL waits before it
#: tries again (doubling each time, up to WAL_RETRY_MOST).
WAL_RETRY_FIRST = 0.002
WAL_RETRY_MOST = 0.1
#: While checkpoints run aside, how often (seconds) the WAL is copied back into the file,
#: and how seldom at most while nothing is written.
CHECKPOINT_EVERY = 0.1
CHECKPOINT_IDLE_EVERY = 1.0

LOGGER = logging.getLogger("resetctl.store")


def refuse_unsafe_path(path: str) -> None:
    """StoreError unless ``path`` names a database file resetctl may open itself.

    ``:memory:``, an empty name (a temporary database) and ``file:`` URIs are refused: a
    notice written there vanishes when the process ends, or lands in a file whose mode
    nobody chose, while the command answers as if it were kept. A symbolic link (at the
    database or at its -wal, -shm or -journal) is refused too: a planted link would have
    SQLite write reset links wherever it points, with whatever mode the target gets.
    """
    if path in ("", ":memory:") or path[:5].lower() == "file:":
        raise StoreError(
            f"database {path or '(empty)'}: not a database file (in-memory databases and"
            " file: URIs are refused: give the file's path)"
        )
    for candidate in (path, *(path + suffix for suffix in COMPANION_SUFFIXES)):
        if os.path.islink(candidate):
            raise StoreError(
                f"database {path}: {candidate} is a symbolic link; give the real file's"
                " path (resetctl never writes a database through a link)"
            )


def _enter_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Put the file in WAL mode (a no-op once it is). On a new file, several processes or
    threads opening it at once race to switch its journal, and SQLite answers the losers
    "database is locked" at once, without waiting as busy_timeout does for a write: they
    try again, a little later each time, for as long as a write would wait."""
    give_up = time.monotonic() + busy_timeout
    pause = WAL_RETRY_FIRST
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > give_up:
                raise
        time.sleep(pause)
        pause = min(pause * 2, WAL_RETRY_MOST)


class SqliteBackend:
    """One SQLite database file.

    By default a missing file is created, private to its owner (0600; SQLite gives the
    -wal and -shm files the database's mode). With ``must_exist`` (commands that do not
    create a database) a missing file, or one that holds no resetctl schema, is a
    StoreError and nothing is created. A path that is not a plain file name (see
    :func:`refuse_unsafe_path`) is a StoreError either way.
    """

    name = "sqlite"
    dialect: Dialect = DIALECT
    #: errors that mean the database broke a cycle of waiting writers: none, since one
    #: SQLite writer holds the whole file (BEGIN IMMEDIATE) and others wait their turn
    lock_cycles: tuple[type[Exception], ...] = ()

    def __init__(
        self,
        path: str | Path,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        *,
        must_exist: bool = False,
    ) -> None:
        self.path = str(path)
        refuse_unsafe_path(self.path)
        target = self.path
        try:
            if must_exist:
                if not Path(self.path).is_file():
                    raise StoreError(f"database {self.path}: no such file (nothing created)")
                # mode=rw: SQLite itself never creates the file, even in a race.
                target = Path(self.path).resolve().as_uri() + "?mode=rw"
            else:
                create_private(Path(self.path))
        except OSError as exc:
            raise StoreError(f"database {self.path}: cannot create ({exc.strerror})") from None
        try:
            #: the connection every statement runs on
            self.conn = sqlite3.connect(
                target,
                isolation_level=None,
                timeout=busy_timeout,
                check_same_thread=False,
                uri=target != self.path,
            )
            # A link swapped in between the check and the open: refused before a write.
            self._refuse_swapped_path()
            if must_exist and self._schema_version() == 0 and not self._has_tables():
                self.conn.close()
                raise StoreError(f"database {self.path}: not a resetctl database (no schema)")
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            _enter_wal(self.conn, busy_timeout)
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            migrate(self.conn, self.path)
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None
        warn_if_shared(Path(self.path))

    def _refuse_swapped_path(self) -> None:
        try:
            refuse_unsafe_path(self.path)
        except StoreError:
            self.conn.close()
            raise

    def _schema_version(self) -> int:
        (version,) = self.conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _has_tables(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextlib.contextmanager
    def checkpoints_aside(self) -> Iterator[None]:
        """Inside: a commit on this connection never checkpoints the WAL (copies its pages
        back into the database file, and syncs it) before it returns; a thread of its own,
        on its own connection, does that every CHECKPOINT_EVERY seconds (PASSIVE: it never
        waits for, nor holds up, a writer or a reader). A sweep's thread commits a round
        of outcomes and intents hundreds of times a second: otherwise one commit in about
        a hundred also copies a thousand pages, while the calls it should start wait."""
        stop = threading.Event()
        worker = threading.Thread(
            target=self._checkpoint_until, args=(stop,), name="resetctl-checkpoint", daemon=True
        )
        (before,) = self.conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        self.conn.execute("PRAGMA wal_autocheckpoint = 0")
        try:
            worker.start()
            yield
        finally:
            stop.set()
            if worker.ident is not None:
                worker.join()
            with contextlib.suppress(sqlite3.Error):  # (never hides why the sweep ended)
                self.conn.execute(f"PRAGMA wal_autocheckpoint = {int(before)}")

    def _checkpoint_until(self, stop: threading.Event) -> None:
        try:
            refuse_unsafe_path(self.path)
            conn = sqlite3.connect(
                Path(self.path).resolve().as_uri() + "?mode=rw", isolation_level=None, uri=True
            )
        except (sqlite3.Error, StoreError) as exc:
            # Commits then only grow the WAL until the next one outside this context.
            LOGGER.warning("database %s: no checkpoints aside (%s)", self.path, exc)
            return
        every, last = CHECKPOINT_EVERY, None
        try:
            while not stop.wait(every):
                try:
                    (_, frames, copied) = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # a busy or failing file: the next one tries
                    LOGGER.debug("database %s: checkpoint: %s", self.path, exc)
                    continue
                # Nothing was written since the last one: an idle sweep looks less often.
                idle = (frames, copied) == last
                every = min(every * 2, CHECKPOINT_IDLE_EVERY) if idle else CHECKPOINT_EVERY
                last = (frames, copied)
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` write transaction: committed on success, else rolled back."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def dicts(self, sql: str, params: Sequence[object] | dict[str, object]) -> list[dict[str, Any]]:
        """Rows of a read-only query (inspect, ops, export) as dicts, keyed by the
        cursor's column names (what psycopg's dict rows give on PostgreSQL)."""
        cursor = self.conn.execute(sql, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def explain(self, sql: str, params: dict[str, object]) -> list[str]:
        """The query plan of a statement (EXPLAIN QUERY PLAN), one line per step."""
        rows = self.conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
        return [str(r[-1]) for r in rows]

    def table_bytes(self) -> tuple[dict[str, int], dict[str, int], int]:
        """From dbstat: the pages allocated by table (with its indexes), the records' own
        bytes in them, and the file's size."""
        measured = self.conn.execute(
            "SELECT COALESCE(m.tbl_name, s.name), SUM(s.pgsize), SUM(s.payload) FROM dbstat s"
            " LEFT JOIN sqlite_master m ON m.name = s.name GROUP BY 1"
        ).fetchall()
        allocated = {str(name): int(size) for name, size, _ in measured}
        encoded = {str(name): int(payload or 0) for name, _, payload in measured}
        (page_size,) = self.conn.execute("PRAGMA page_size").fetchone()
        (pages,) = self.conn.execute("PRAGMA page_count").fetchone()
        return allocated, encoded, int(page_size) * int(pages)
