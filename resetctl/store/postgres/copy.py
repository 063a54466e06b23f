"""`resetctl db copy`: a SQLite file into an empty PostgreSQL database, in one transaction.

Live notices arrive with their leases cleared and due at once (whatever held them on the
old database is gone); history, the outbox, aggregates, policies and the salt come as
they are. The target must be empty; every table's row count is verified before commit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from resetctl.errors import StoreError
from resetctl.store.postgres.backend import PostgresBackend

#: Tables in the order their references need, each copied whole.
TABLES = (
    "meta",
    "policies",
    "notices",
    "notice_secrets",
    "attempts",
    "observations",
    "events",
    "outbox",
    "daily_counts",
    "limit_counts",
    "refusals",
    "shadow_notices",
    "slice_answers",
    "provider_health",
)
#: Tables whose ids PostgreSQL hands out (identity columns), continued after the copy.
IDENTITY_TABLES = ("observations", "events")
#: Meta keys that belong to the target itself.
_TARGET_META = ("schema_version",)


def _columns(source: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in source.execute(f"PRAGMA table_info({table})")]


def _cleared_lease(columns: list[str], now: float) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A notice row with its lease cleared: a live one is due at once."""
    at = {name: i for i, name in enumerate(columns)}

    def clear(row: tuple[Any, ...]) -> tuple[Any, ...]:
        values = list(row)
        if values[at["lease_owner"]] is not None or values[at["lease_token"]] is not None:
            values[at["lease_owner"]] = values[at["lease_token"]] = None
            values[at["lease_expires_at"]] = None
            if values[at["due_at"]] is not None:
                values[at["due_at"]] = min(values[at["due_at"]], now)
        return tuple(values)

    return clear


def copy_into(source: sqlite3.Connection, target: PostgresBackend, now: float) -> dict[str, int]:
    """Copy every table of ``source`` into ``target`` (which must hold no notices, events,
    policies or messages); returns the rows copied per table, verified on both sides."""
    raw = target.conn.raw
    for table in TABLES:
        if table == "meta":
            continue
        (count,) = target.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        if count:
            raise StoreError(
                f"database {target.path}: not empty ({table} holds {count} row(s));"
                " db copy only fills an empty database"
            )
    copied: dict[str, int] = {}
    source.execute("BEGIN")  # one consistent read of the file
    try:
        with raw.transaction(), raw.cursor() as cur:
            for table in TABLES:
                columns = _columns(source, table)
                names = ", ".join(columns)
                rows: Iterable[tuple[Any, ...]] = source.execute(f"SELECT {names} FROM {table}")
                if table == "meta":
                    cur.execute("DELETE FROM meta WHERE key <> ALL(%s)", (list(_TARGET_META),))
                    rows = (r for r in rows if r[0] not in _TARGET_META)
                if table == "notices":
                    clear = _cleared_lease(columns, now)
                    rows = (clear(r) for r in rows)
                with cur.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                (expected,) = source.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
                (landed,) = cur.execute(f"SELECT COUNT(*) FROM {table}").fetchone() or (0,)
                if table == "meta":
                    expected = source.execute(
                        "SELECT COUNT(*) FROM meta WHERE key NOT IN ('schema_version')"
                    ).fetchone()[0]
                    landed -= len(_TARGET_META)
                if int(landed) != int(expected):
                    raise StoreError(
                        f"db copy: {table}: {expected} row(s) in the file, {landed} copied"
                    )
                copied[table] = int(expected)
            for table in IDENTITY_TABLES:
                cur.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                    f" GREATEST((SELECT MAX(id) FROM {table}), 1))"
                )
    finally:
        source.execute("ROLLBACK")
    return copied
