"""PostgreSQL's schema (``schema.sql`` beside this file) and its forward migrations.

The version lives in ``meta`` (key ``schema_version``); a migration holds an advisory
lock, so hosts starting together migrate once.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from importlib import resources

from resetctl.errors import StoreError
from resetctl.schema_facts import SCHEMA_VERSION
from resetctl.store.postgres.connection import PgConnection


def schema_sql() -> str:
    """The text of PostgreSQL's ``schema.sql``."""
    return resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")


def _function(name: str) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` statement of ``name`` in schema.sql (written
    once there; a migration that changes it replays it from there)."""
    text = schema_sql()
    start = text.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return text[start : text.index("$$;", start) + 2]


#: The trigger function that keeps terminal notices still.
TERMINAL_GUARD_SQL = _function("notices_terminal_guard")

#: Forward migrations: MIGRATIONS[n] moves a database from version n to n + 1. The
#: PostgreSQL schema begins at version 3 (the first with this backend).
MIGRATIONS: dict[int, Sequence[str]] = {
    # 3 → 4 rebuilt SQLite's outbox as a rowid table; PostgreSQL's tables are heaps
    # already, so only the version changes. That still matters: notice and outbox ids
    # gained a time prefix, and an older resetctl refuses to open a database at a newer
    # version (rather than write old-form outbox ids into it).
    3: (),
    # 4 → 5: a lookup matches what was sent (recorded with the intent), and a doubt's
    # waits are measured on the host's monotonic clock too; first submissions are
    # claimed by deadline.
    4: (
        "ALTER TABLE attempts ADD COLUMN sent TEXT",
        "ALTER TABLE attempts ADD COLUMN call_mono TEXT",
        "ALTER TABLE attempts ADD COLUMN lookup_mono TEXT",
        "ALTER TABLE attempts ADD COLUMN lookup_failing_since DOUBLE PRECISION",
        "CREATE INDEX IF NOT EXISTS notices_queued_expiry ON notices (expires_at)"
        " WHERE phase = 'queued' AND due_at IS NOT NULL",
    ),
    # 5 → 6: a notice may be cancelled (a new terminal phase, which the trigger guards
    # too), an account's notices are found by index (supersede, list --account), and a
    # step records how long its call waited in its lane.
    5: (
        "CREATE INDEX IF NOT EXISTS notices_account ON notices (account_ref, created_at)"
        " WHERE account_ref IS NOT NULL",
        TERMINAL_GUARD_SQL,
        "ALTER TABLE events ADD COLUMN lane_wait DOUBLE PRECISION",
    ),
    # 6 → 7: region policy: the consent an enqueue gave, purge by each policy's
    # retention, abuse-limit counts and the requests refused for a policy reason.
    6: (
        "ALTER TABLE notices ADD COLUMN consent TEXT",
        "CREATE INDEX IF NOT EXISTS notices_finished_policy ON notices (policy_name, phase_since)"
        " WHERE due_at IS NULL",
        "CREATE TABLE IF NOT EXISTS limit_counts (rule TEXT NOT NULL, policy TEXT NOT NULL,"
        " subject TEXT NOT NULL, counts TEXT NOT NULL, last_at DOUBLE PRECISION NOT NULL,"
        " PRIMARY KEY (rule, policy, subject))",
        "CREATE INDEX IF NOT EXISTS limit_counts_last ON limit_counts (last_at)",
        "CREATE TABLE IF NOT EXISTS refusals (day TEXT NOT NULL, minute INTEGER NOT NULL,"
        " policy TEXT NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,"
        " PRIMARY KEY (day, minute, policy, reason))"
        "",
    ),
    # 7 → 8: rollout: the notices enqueued in shadow, and the keys left out of the slice.
    7: (
        "CREATE TABLE IF NOT EXISTS shadow_notices (notice_id TEXT PRIMARY KEY"
        " REFERENCES notices (id) ON DELETE CASCADE)",
        "CREATE TABLE IF NOT EXISTS slice_answers (idempotency_key TEXT PRIMARY KEY,"
        " request_digest TEXT NOT NULL, policy TEXT NOT NULL,"
        " answered_at DOUBLE PRECISION NOT NULL, keep_until DOUBLE PRECISION NOT NULL)",
        "CREATE INDEX IF NOT EXISTS slice_answers_kept ON slice_answers (keep_until)",
    ),
    8: (
        "CREATE TABLE IF NOT EXISTS provider_health (instance TEXT PRIMARY KEY,"
        " failures INTEGER NOT NULL DEFAULT 0, first_failure_at DOUBLE PRECISION,"
        " open_until DOUBLE PRECISION,"
        " probe_until DOUBLE PRECISION, opened INTEGER NOT NULL DEFAULT 0,"
        " total_failures INTEGER NOT NULL DEFAULT 0, last_failure_at DOUBLE PRECISION,"
        " last_success_at DOUBLE PRECISION)",
    ),
}
#: The advisory lock key migrations hold ("resetctl" in ASCII).
MIGRATION_LOCK = 0x7265736574
#: The first version this backend was created at.
FIRST_VERSION = 3


def schema_version(conn: PgConnection) -> int:
    """The database's schema version; 0 for an empty database."""
    (exists,) = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return 0 if row is None else int(row[0])


def has_tables(conn: PgConnection) -> bool:
    """True when the current schema holds any table."""
    row = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() LIMIT 1"
    ).fetchone()
    return row is not None


def migrate(conn: PgConnection, name: str) -> None:
    """Bring the database to SCHEMA_VERSION in one transaction."""
    if schema_version(conn) == SCHEMA_VERSION:
        return
    # A session lock taken before the transaction begins, so the transaction's catalog
    # reads see whatever a host that migrated first committed.
    conn.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    try:
        _migrate_locked(conn, name)
    finally:
        conn.execute(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")


def _migrate_locked(conn: PgConnection, name: str) -> None:
    conn.execute("BEGIN")
    try:
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"database {name}: schema version {current} is newer than this "
                f"resetctl ({SCHEMA_VERSION}); upgrade resetctl"
            )
        if current == 0:
            conn.execute(schema_sql())
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('salt', ?) ON CONFLICT DO NOTHING",
                (secrets.token_hex(32),),
            )
        else:
            for version in range(current, SCHEMA_VERSION):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
