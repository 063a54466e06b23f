"""The store's facts that the idle cron tick needs too: the schema version this code
writes, and the two statements an idle tick runs (the next due time, the sweep record).

A leaf (standard library only) outside the store package: ``resetctl.tick`` answers an
idle ``resetctl sweep`` before the store, the configuration's heavier users or the command
line are imported, and the store reads the same constants, so each exists once.
"""

from __future__ import annotations

#: The schema version this code writes (SQLite's PRAGMA user_version, PostgreSQL's
#: meta row ``schema_version``).
SCHEMA_VERSION = 9
#: The earliest due time of any live notice, read through the partial index over live
#: notices (leased ones fall due at their lease end).
NEXT_DUE_SQL = "SELECT due_at FROM notices WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
#: Remember a sweep's end and duration (metrics and the stalled-sweeper alert).
RECORD_SWEEP_SQL = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


def sweep_record(finished_at: float, duration: float) -> list[tuple[str, str]]:
    """The meta rows a finished sweep writes."""
    return [("last_sweep_at", repr(finished_at)), ("last_sweep_duration", repr(duration))]
