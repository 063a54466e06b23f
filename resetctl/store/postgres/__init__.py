"""The PostgreSQL backend: sweeps on many hosts over one database.

Claims skip rows others hold (``FOR UPDATE SKIP LOCKED``), every statement has a time-out
(statement_timeout, lock_timeout), and lease and due times are compared on the database's
clock, so a host whose clock runs fast never takes over a live lease. A lost connection is
a crash like any other: the lease runs out and another sweep recovers the notice.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from resetctl.errors import StoreError
from resetctl.store.outbox import OutboxRecords
from resetctl.store.postgres.connection import PgConnection, connect, redacted
from resetctl.store.postgres.schema import has_tables, migrate, schema_version
from resetctl.store.postgres.statements import CLAIM_SQL, DB_NOW, DIALECT
from resetctl.store.reads import OpsReads
from resetctl.store.steps import ClaimsAndSteps

#: Seconds between two reads of the database's clock by one decision clock: in between,
#: the host's clock measures only the time gone by (its drift over this is negligible).
CLOCK_RESYNC = 5.0
#: Tables that grow with traffic, for `storage`.
_TABLES = ("notices", "attempts", "observations", "events", "outbox", "daily_counts")


def refuse_password_in_uri(uri: str) -> None:
    """A password in the URI would sit in argv or a config file: refuse it."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return  # connect() says what to install
    try:
        parts = conninfo_to_dict(uri)
    except Exception as exc:
        raise StoreError(f"database {redacted(uri)}: not a valid URI ({exc})") from None
    if parts.get("password"):
        raise StoreError(
            f"database {redacted(uri)}: a password in the URI is refused (another user can"
            " read argv); use PGPASSWORD, ~/.pgpass or PGSERVICE"
        )


class PostgresStore(ClaimsAndSteps, OpsReads, OutboxRecords):
    """One PostgreSQL database, named by a libpq URI (``postgresql://…``).

    An empty database gets the schema; with ``must_exist`` (commands that only read) a
    database without resetctl's schema is a StoreError and nothing is created.
    """

    backend = "postgresql"
    conn: PgConnection

    def __init__(self, uri: str, *, must_exist: bool = False) -> None:
        super().__init__()
        refuse_password_in_uri(uri)
        self.path = redacted(uri)
        self.uri = uri
        self.sql = DIALECT
        self.conn = connect(uri, f"resetctl {socket.gethostname()} {os.getpid()}")
        try:
            if must_exist and schema_version(self.conn) == 0 and not has_tables(self.conn):
                raise StoreError(f"database {self.path}: not a resetctl database (no schema)")
            migrate(self.conn, self.path)
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgConnection]:
        """A READ COMMITTED write transaction: committed on success, else rolled back.
        Row versions, not isolation, make its writes safe (every write is a compare-and-set).
        """
        self.conn.execute("BEGIN")
        try:
            with self._deferred_outbox_joins():
                yield self.conn
        except BaseException:
            with contextlib.suppress(Exception):  # a lost connection has nothing to undo
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _dicts(
        self, sql: str, params: Sequence[object] | dict[str, object]
    ) -> list[dict[str, Any]]:
        return self.conn.dicts(sql, params)

    def database_now(self) -> float:
        """The database's clock, in epoch seconds (the one clock leases are read on)."""
        (now,) = self.conn.execute(f"SELECT {DB_NOW}").fetchone()
        return float(now)

    def decision_clock(self, host: Callable[[], float]) -> Callable[[], float]:
        """The database's clock, read again every CLOCK_RESYNC seconds; in between,
        ``host`` only measures how much time went by. Every host then judges expiry,
        settle times and poll slots on the same clock, whatever its own says."""
        anchor: list[float] = []  # [database minus host, when read (monotonic)]

        def now() -> float:
            read_at = time.monotonic()
            if not anchor or read_at - anchor[1] >= CLOCK_RESYNC:
                anchor[:] = [self.database_now() - host(), read_at]
            return host() + anchor[0]

        return now

    def ended_since(self, after_event: int, after_time: float) -> tuple[list[dict[str, Any]], int]:
        """Notices that ended without success in transactions that finished after the
        watermark ``after_event`` (a transaction id here), oldest first, and the new
        watermark: every transaction below it has ended, so none can still add an event
        the next read would skip. (Event ids follow insert order, not commit order, on a
        server where writers run at once.) A watermark from elsewhere (a copied SQLite
        file's event id) reads from ``after_time`` instead."""
        (horizon,) = self.conn.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
        ).fetchone()
        newest = int(horizon) - 1
        by_time = newest < after_event
        where = "e.at > :time" if by_time else "e.xid > CAST(CAST(:event AS text) AS xid8)"
        rows = self._dicts(
            "SELECT e.notice_id, n.region, e.new_phase AS phase, e.reason, e.at AS ended_at,"
            " n.policy_name AS policy, n.policy_version FROM events e"
            " JOIN notices n ON n.id = e.notice_id"
            f" WHERE {where} AND e.xid <= CAST(CAST(:newest AS text) AS xid8)"
            " AND e.new_phase IN ('expired', 'failed')"
            " AND e.old_phase <> e.new_phase AND e.kind <> 'lost_race' ORDER BY e.xid, e.id",
            {"time": after_time, "event": after_event, "newest": newest},
        )
        return rows, newest

    def explain_claim(self) -> list[str]:
        """The query plan of the claim statement itself (tests and diagnostics)."""
        params = {"worker": "", "token": "", "until": 0.0, "now": 0.0, "limit": 1}
        rows = self.conn.execute("EXPLAIN " + CLAIM_SQL, params).fetchall()
        return [str(r[0]) for r in rows]

    def storage(self) -> dict[str, Any]:
        """Bytes by table (with its indexes and TOAST) and row counts."""
        sizes = {
            table: int(
                self.conn.execute(
                    "SELECT pg_total_relation_size(to_regclass(?))", (table,)
                ).fetchone()[0]
            )
            for table in _TABLES
        }
        first = self.conn.execute("SELECT MIN(at), MAX(at) FROM events").fetchone()
        (total,) = self.conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return {
            "bytes": sizes,
            "encoded": {
                table: int(
                    self.conn.execute(
                        f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t"
                    ).fetchone()[0]
                )
                for table in _TABLES
            },
            "rows": self.row_counts(),
            "events_span": (first[0], first[1]),
            "file_bytes": int(total),
        }
