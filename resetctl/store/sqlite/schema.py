"""SQLite's schema (``schema.sql`` at the top level) and its forward migrations."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

from resetctl.errors import StoreError
from resetctl.schema_facts import SCHEMA_VERSION


def schema_sql() -> str:
    """The text of ``schema.sql``: inside the wheel, else at the checkout's top level."""
    packaged = resources.files("resetctl").joinpath("schema.sql")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[3] / "schema.sql").read_text(encoding="utf-8")


def statements(script: str) -> Iterator[str]:
    """The complete statements of a SQL script, in order."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""


#: Forward migrations: MIGRATIONS[n] moves a file from user_version n to n + 1.
#: Version 0 is an empty file; schema.sql creates the current version directly.
MIGRATIONS: dict[int, Sequence[str]] = {
    # 1 → 2: events name their channel (metrics labels); daily aggregates survive purge.
    1: (
        "ALTER TABLE events ADD COLUMN channel TEXT",
        "UPDATE events SET channel = (SELECT a.channel FROM attempts a"
        " WHERE a.attempt_key = events.attempt_key) WHERE attempt_key IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS notices_finished ON notices (phase_since) WHERE due_at IS NULL",
        "CREATE TABLE IF NOT EXISTS daily_counts (day TEXT NOT NULL, kind TEXT NOT NULL,"
        " old_phase TEXT NOT NULL, new_phase TEXT NOT NULL, channel TEXT NOT NULL,"
        " status TEXT NOT NULL, reason TEXT NOT NULL, policy TEXT NOT NULL,"
        " policy_version INTEGER NOT NULL, template_version TEXT NOT NULL,"
        " count INTEGER NOT NULL, PRIMARY KEY (day, kind, old_phase, new_phase, channel,"
        " status, reason, policy, policy_version, template_version)) WITHOUT ROWID",
    ),
    # 2 → 3: lookups of ambiguous submissions, collapsed late reads, callback dedupe,
    # the reader's locale, and an index so scrubbing never scans the outbox.
    2: (
        "ALTER TABLE notices ADD COLUMN locale TEXT",
        "ALTER TABLE attempts ADD COLUMN last_read_at REAL",
        "ALTER TABLE attempts ADD COLUMN lookup_settle REAL",
        "ALTER TABLE attempts ADD COLUMN lookups INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN first_lookup_at REAL",
        "ALTER TABLE attempts ADD COLUMN locale TEXT",
        "ALTER TABLE observations ADD COLUMN dedupe TEXT",
        "CREATE UNIQUE INDEX IF NOT EXISTS observations_dedupe ON observations (dedupe)"
        " WHERE dedupe IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS outbox_notice ON outbox (notice_id)",
    ),
    # 3 → 4: the outbox becomes a rowid table. As WITHOUT ROWID its rendered messages
    # (a few KB each) spilled into overflow pages and sat in message-id order; now each
    # is one row in the order it was written, so a round's inserts and scrubs share pages.
    3: (
        "CREATE TABLE outbox_v4 (message_id TEXT PRIMARY KEY, attempt_key TEXT NOT NULL"
        " UNIQUE, notice_id TEXT NOT NULL, channel TEXT NOT NULL, status TEXT NOT NULL,"
        " submitted_at REAL NOT NULL, updated_at REAL NOT NULL, content TEXT NOT NULL)",
        "INSERT INTO outbox_v4 (message_id, attempt_key, notice_id, channel, status,"
        " submitted_at, updated_at, content) SELECT message_id, attempt_key, notice_id,"
        " channel, status, submitted_at, updated_at, content FROM outbox"
        " ORDER BY submitted_at, message_id",
        "DROP TABLE outbox",
        "ALTER TABLE outbox_v4 RENAME TO outbox",
        "CREATE INDEX IF NOT EXISTS outbox_submitted ON outbox (submitted_at)",
        "CREATE INDEX IF NOT EXISTS outbox_notice ON outbox (notice_id)",
    ),
    # 4 → 5: a lookup matches what was sent (recorded with the intent), and a doubt's
    # waits are measured on the host's monotonic clock too.
    4: (
        "ALTER TABLE attempts ADD COLUMN sent TEXT",
        "ALTER TABLE attempts ADD COLUMN call_mono TEXT",
        "ALTER TABLE attempts ADD COLUMN lookup_mono TEXT",
        "ALTER TABLE attempts ADD COLUMN lookup_failing_since REAL",
        "CREATE INDEX IF NOT EXISTS notices_queued_expiry ON notices (expires_at)"
        " WHERE phase = 'queued' AND due_at IS NOT NULL",
    ),
    # 5 → 6: a notice may be cancelled (a new terminal phase: the column is free text),
    # an account's notices are found by index (supersede, list --account), and a step
    # records how long its call waited in its lane.
    5: (
        "CREATE INDEX IF NOT EXISTS notices_account ON notices (account_ref, created_at)"
        " WHERE account_ref IS NOT NULL",
        "ALTER TABLE events ADD COLUMN lane_wait REAL",
    ),
    # 6 → 7: region policy: the consent an enqueue gave, purge by each policy's
    # retention, abuse-limit counts and the requests refused for a policy reason.
    6: (
        "ALTER TABLE notices ADD COLUMN consent TEXT",
        "CREATE INDEX IF NOT EXISTS notices_finished_policy ON notices (policy_name, phase_since)"
        " WHERE due_at IS NULL",
        "CREATE TABLE IF NOT EXISTS limit_counts (rule TEXT NOT NULL, policy TEXT NOT NULL,"
        " subject TEXT NOT NULL, counts TEXT NOT NULL, last_at REAL NOT NULL,"
        " PRIMARY KEY (rule, policy, subject)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS limit_counts_last ON limit_counts (last_at)",
        "CREATE TABLE IF NOT EXISTS refusals (day TEXT NOT NULL, minute INTEGER NOT NULL,"
        " policy TEXT NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,"
        " PRIMARY KEY (day, minute, policy, reason))"
        " WITHOUT ROWID",
    ),
    # 7 → 8: rollout: the notices enqueued in shadow, and the keys left out of the slice.
    7: (
        "CREATE TABLE IF NOT EXISTS shadow_notices (notice_id TEXT PRIMARY KEY"
        " REFERENCES notices (id) ON DELETE CASCADE) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS slice_answers (idempotency_key TEXT PRIMARY KEY,"
        " request_digest TEXT NOT NULL, policy TEXT NOT NULL, answered_at REAL NOT NULL,"
        " keep_until REAL NOT NULL) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS slice_answers_kept ON slice_answers (keep_until)",
    ),
    8: (
        "CREATE TABLE IF NOT EXISTS provider_health (instance TEXT PRIMARY KEY,"
        " failures INTEGER NOT NULL DEFAULT 0, first_failure_at REAL, open_until REAL,"
        " probe_until REAL, opened INTEGER NOT NULL DEFAULT 0,"
        " total_failures INTEGER NOT NULL DEFAULT 0, last_failure_at REAL,"
        " last_success_at REAL) WITHOUT ROWID",
    ),
}


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring a file to SCHEMA_VERSION: schema.sql for an empty one, else migrations.
    ``conn`` is an autocommit connection; the change is one ``BEGIN IMMEDIATE``."""
    (current,) = conn.execute("PRAGMA user_version").fetchone()
    if current == SCHEMA_VERSION:
        return
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"database {path}: schema version {current} is newer than this "
            f"resetctl ({SCHEMA_VERSION}); upgrade resetctl"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        (current,) = conn.execute("PRAGMA user_version").fetchone()
        if current == 0:
            for statement in statements(schema_sql()):
                conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('salt', ?)",
                (secrets.token_hex(32),),
            )
        else:
            for version in range(current, SCHEMA_VERSION):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
