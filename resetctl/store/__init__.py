"""All SQL, behind one interface (:class:`Store`), with two implementations: SQLite (the
embedded default, ``resetctl.store.sqlite``) and PostgreSQL (``resetctl.store.postgres``,
for sweeps on several hosts; ``pip install 'resetctl[postgres]'``).

Shared statements are split by concern: claims and step writes (``steps``), ops and
export reads (``reads``), the outbox (``outbox``); each backend owns its connection, its
schema and migrations, and the few statements whose dialects differ.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from resetctl.errors import StoreError
from resetctl.schema_facts import SCHEMA_VERSION
from resetctl.store.interface import POSTGRES_SCHEMES, Store, is_postgres
from resetctl.store.reads import (
    DERIVED_ATTEMPT,
    DERIVED_EXPIRED_WITHOUT_OUTCOME,
    DERIVED_LATE_PRIMARY,
)
from resetctl.store.records import (
    Claim,
    Contact,
    DeclinedFacts,
    Facts,
    IntentFacts,
    LoadedNotice,
    LookupFacts,
    NewNotice,
    ObservationFacts,
    OutcomeFacts,
    Step,
    StepResult,
    new_notice_id,
    outbox_message_id,
)
from resetctl.store.sqlite.schema import MIGRATIONS, schema_sql
from resetctl.store.sqlite.statements import CLAIM_IDS_SQL, CLAIM_SQL, STEP_CAS_SQL

__all__ = [
    "CLAIM_IDS_SQL",
    "CLAIM_SQL",
    "DERIVED_ATTEMPT",
    "DERIVED_EXPIRED_WITHOUT_OUTCOME",
    "DERIVED_LATE_PRIMARY",
    "MIGRATIONS",
    "POSTGRES_SCHEMES",
    "SCHEMA_VERSION",
    "STEP_CAS_SQL",
    "Claim",
    "Contact",
    "DeclinedFacts",
    "Facts",
    "IntentFacts",
    "LoadedNotice",
    "LookupFacts",
    "NewNotice",
    "ObservationFacts",
    "OutcomeFacts",
    "Step",
    "StepResult",
    "Store",
    "copy_database",
    "database_errors",
    "is_postgres",
    "new_notice_id",
    "open_store",
    "outbox_message_id",
    "schema_sql",
]


def database_errors() -> tuple[type[Exception], ...]:
    """The driver exceptions a database failure raises (a full disk, a lost server)."""
    errors: list[type[Exception]] = [sqlite3.Error]
    if "psycopg" in sys.modules:
        errors.append(sys.modules["psycopg"].Error)
    return tuple(errors)


def copy_database(source: Store, target_uri: str, now: float) -> dict[str, int]:
    """Copy the SQLite database ``source`` into the empty PostgreSQL database at
    ``target_uri``; returns the rows copied per table, verified on both sides."""
    from resetctl.store.sqlite import SqliteStore

    if not isinstance(source, SqliteStore):
        raise StoreError(f"database {source.path}: db copy reads a SQLite file")
    from resetctl.store.postgres import PostgresStore
    from resetctl.store.postgres.copy import copy_into

    target = PostgresStore(target_uri)
    try:
        return copy_into(source.conn, target, now)
    finally:
        target.close()


def open_store(
    db: str | Path, *, must_exist: bool = False, busy_timeout: float | None = None
) -> Store:
    """Open the database ``db`` names: a file path (SQLite) or a ``postgresql://`` URI.

    The password of a PostgreSQL URI comes from PGPASSWORD, ~/.pgpass or a service file,
    never from the command line. ``busy_timeout`` bounds SQLite's wait for the write lock
    (PostgreSQL's lock_timeout is the store's own).
    """
    if is_postgres(db):
        from resetctl.store.postgres import PostgresStore

        return PostgresStore(str(db), must_exist=must_exist)
    from resetctl.store.sqlite import BUSY_TIMEOUT_SECONDS, SqliteStore

    wait = BUSY_TIMEOUT_SECONDS if busy_timeout is None else busy_timeout
    return SqliteStore(db, wait, must_exist=must_exist)
