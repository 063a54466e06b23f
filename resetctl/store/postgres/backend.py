"""The PostgreSQL backend's connection handling: one database named by a libpq URI.

Claims skip rows others hold (``FOR UPDATE SKIP LOCKED``, in the dialect), every statement
has a time-out (statement_timeout, lock_timeout), and lease and due times are compared on
the database's clock, so a host whose clock runs fast never takes over a live lease. A
lost connection is a crash like any other: the lease runs out and another sweep recovers
the notice.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence
from typing import Any

from resetctl.errors import ConfigError, StoreError
from resetctl.store.backend import Dialect, error_line
from resetctl.store.postgres.connection import (
    NOT_SHOWN,
    PgConnection,
    connect,
    names_password,
    parsed,
    redacted,
)
from resetctl.store.postgres.dialect import DIALECT
from resetctl.store.postgres.schema import has_tables, migrate, schema_version

#: Tables that grow with traffic, for `storage`.
_TABLES = ("notices", "attempts", "observations", "events", "outbox", "daily_counts")


def refuse_password_in_uri(uri: str) -> None:
    """A password in the URI would sit in argv or a config file: refuse it, and a string
    libpq cannot parse, both with a ConfigError that names the database without quoting
    what was given (libpq's own parse errors do quote it)."""
    if names_password(uri):
        raise ConfigError(
            f"database {NOT_SHOWN}: a password in the URI is refused (another user can"
            " read argv); use PGPASSWORD, ~/.pgpass or PGSERVICE"
        )
    if parsed(uri) is None and _has_driver():
        raise ConfigError(
            f"database {NOT_SHOWN}: not a valid PostgreSQL URI or connection string"
            " (not shown: it may hold a secret)"
        )


def _has_driver() -> bool:
    try:
        import psycopg.conninfo  # noqa: F401
    except ImportError:
        return False  # connect() says what to install
    return True


class PostgresBackend:
    """One PostgreSQL database, named by a libpq URI (``postgresql://…``).

    An empty database gets the schema; with ``must_exist`` (commands that only read) a
    database without resetctl's schema is a StoreError and nothing is created.
    """

    name = "postgresql"
    dialect: Dialect = DIALECT

    def __init__(self, uri: str, *, must_exist: bool = False) -> None:
        refuse_password_in_uri(uri)
        self.path = redacted(uri)
        #: the connection every statement runs on
        self.conn = connect(uri, f"resetctl {socket.gethostname()} {os.getpid()}")
        import psycopg

        try:
            if must_exist and schema_version(self.conn) == 0 and not has_tables(self.conn):
                raise StoreError(f"database {self.path}: not a resetctl database (no schema)")
            migrate(self.conn, self.path)
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(f"database {self.path}: {error_line(exc)}") from None
        except BaseException:
            self.conn.close()
            raise

    @property
    def lock_cycles(self) -> tuple[type[Exception], ...]:
        """Errors that mean the server rolled this transaction back to break a cycle of
        writers waiting on each other's rows (two sweeps, one with a stale lease, writing
        the same notices' facts in different orders): the whole transaction may be run
        again."""
        from psycopg import errors

        return (errors.DeadlockDetected, errors.SerializationFailure)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextlib.contextmanager
    def checkpoints_aside(self) -> Iterator[None]:
        """Nothing to do: the server checkpoints on its own."""
        yield

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgConnection]:
        """A READ COMMITTED write transaction: committed on success, else rolled back.
        Row versions, not isolation, make its writes safe (every write is a compare-and-set).
        """
        self.conn.execute("BEGIN")
        try:
            yield self.conn
        except BaseException:
            with contextlib.suppress(Exception):  # a lost connection has nothing to undo
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def dicts(self, sql: str, params: Sequence[object] | dict[str, object]) -> list[dict[str, Any]]:
        """Rows of a read-only query as dicts."""
        return self.conn.dicts(sql, params)

    def explain(self, sql: str, params: dict[str, object]) -> list[str]:
        """The query plan of a statement (EXPLAIN), one line per step."""
        rows = self.conn.execute("EXPLAIN " + sql, params).fetchall()
        return [str(r[0]) for r in rows]

    def table_bytes(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Bytes by table (with its indexes and TOAST), the rows' own bytes, and the
        database's size."""
        allocated = {
            table: int(
                self.conn.execute(
                    "SELECT pg_total_relation_size(to_regclass(?))", (table,)
                ).fetchone()[0]
            )
            for table in _TABLES
        }
        encoded = {
            table: int(
                self.conn.execute(
                    f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t"
                ).fetchone()[0]
            )
            for table in _TABLES
        }
        (total,) = self.conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return allocated, encoded, int(total)
