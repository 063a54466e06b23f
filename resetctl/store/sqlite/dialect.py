"""SQLite's dialect: the claim and the round's compare-and-set (json_each), JSON arrays
as subqueries, calendar days, and event ids as the alerts' watermark."""

from __future__ import annotations

from collections.abc import Sequence

from resetctl.store.backend import Dialect
from resetctl.store.records import NOTICE_COLUMNS, TERMINAL_SQL

#: The claim: one UPDATE over due live notices, setting the lease: the longest-waiting
#: due ones and the queued ones whose links die soonest, nearest expiry first, so under a
#: backlog a short-lived notice enqueued last is still sent first (each part walks one
#: partial index for at most the batch's rows). Every
#: right-hand side reads the row as it was, so `taken_over_from` keeps the previous
#: holder: a lease that was never released belonged to a dead or stalled worker. It
#: returns the claimed rows as written (NOTICE_COLUMNS), so the sweep need not read them.
CLAIM_SQL = (
    "UPDATE notices SET taken_over_from = lease_owner, lease_owner = :worker,"
    " lease_token = :token, lease_expires_at = :until, due_at = :until,"
    " lease_recoveries = lease_recoveries + (lease_owner IS NOT NULL),"
    " version = version + 1"
    " WHERE id IN (SELECT id FROM ("
    "SELECT id, expires_at FROM (SELECT id, expires_at FROM notices"
    " WHERE due_at <= :now ORDER BY due_at LIMIT :limit)"
    " UNION SELECT id, expires_at FROM (SELECT id, expires_at FROM notices"
    " INDEXED BY notices_queued_expiry WHERE phase = 'queued' AND due_at IS NOT NULL"
    " AND due_at <= :now ORDER BY expires_at LIMIT :limit)"
    ") ORDER BY expires_at LIMIT :limit)"
    f" RETURNING taken_over_from, {NOTICE_COLUMNS}"
)

#: A round's compare-and-sets in one statement: each row of the JSON array names a notice,
#: the version and lease token its decision was made on, and what to write, as an array
#: [id, version, token, phase, reason, now, release, due_at] (shorter to encode and to
#: read than an object). Only rows whose version (and token, when given) still match
#: change; RETURNING names them. A terminal notice never moves again, whatever a writer
#: decided.
STEP_CAS_SQL = (
    "UPDATE notices SET"
    f" phase = CASE WHEN notices.phase IN {TERMINAL_SQL}"
    " THEN notices.phase ELSE j.phase END,"
    f" reason = CASE WHEN notices.phase IN {TERMINAL_SQL}"
    " THEN notices.reason ELSE j.reason END,"
    " phase_since = CASE WHEN notices.phase = j.phase OR notices.phase IN"
    f" {TERMINAL_SQL} THEN notices.phase_since ELSE j.now END,"
    " version = notices.version + 1,"
    " lease_owner = CASE WHEN j.release THEN NULL ELSE notices.lease_owner END,"
    " lease_token = CASE WHEN j.release THEN NULL ELSE notices.lease_token END,"
    " lease_expires_at = CASE WHEN j.release THEN NULL ELSE notices.lease_expires_at END,"
    f" due_at = CASE WHEN notices.phase IN {TERMINAL_SQL} THEN NULL"
    " WHEN j.release THEN j.due_at ELSE notices.due_at END"
    " FROM (SELECT value ->> 0 AS id, value ->> 1 AS version, value ->> 2 AS token,"
    " value ->> 3 AS phase, value ->> 4 AS reason, value ->> 5 AS now,"
    " value ->> 6 AS release, value ->> 7 AS due_at FROM json_each(?)) AS j"
    " WHERE notices.id = j.id AND notices.version = j.version"
    " AND (j.token IS NULL OR notices.lease_token = j.token)"
    " RETURNING notices.id, notices.phase, notices.reason"
)

#: The claim of chosen notices (``enqueue --send``): the same update, limited to ids that
#: are live, due and not under a live lease.
CLAIM_IDS_SQL = (
    "UPDATE notices SET taken_over_from = lease_owner, lease_owner = :worker,"
    " lease_token = :token, lease_expires_at = :until, due_at = :until,"
    " lease_recoveries = lease_recoveries + (lease_owner IS NOT NULL),"
    " version = version + 1"
    " WHERE id IN (SELECT id FROM notices WHERE id IN (SELECT value FROM json_each(:ids))"
    " AND due_at <= :now LIMIT :limit)"
    f" RETURNING taken_over_from, {NOTICE_COLUMNS}"
)

DIALECT = Dialect(
    claim=CLAIM_SQL,
    claim_ids=CLAIM_IDS_SQL,
    step_cas=STEP_CAS_SQL,
    ids_template="(SELECT value FROM json_each({param}))",
    day_template="date({expr}, 'unixepoch')",
    lease_now=":now",
    database_clock=None,
    # Writes are serialized, so event ids follow commit order: a watermark on them never
    # skips a step that committed late.
    events_watermark="SELECT COALESCE(MAX(id), 0) FROM events",
    event_mark_template="e.id {op} {param}",
    events_order="e.id",
    live_notices="notices INDEXED BY notices_due",
)


def _varint_bytes(value: int) -> int:
    """Bytes of SQLite's variable-length integer for a non-negative ``value``."""
    size = 1
    while value >= 1 << (7 * size) and size < 9:
        size += 1
    return size


def _integer_serial(value: int) -> tuple[int, int]:
    """(serial type, body bytes) of an integer in a record (file format 4)."""
    if value in (0, 1):
        return 8 + value, 0
    for serial, size in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 6)):
        if -(1 << (8 * size - 1)) <= value < 1 << (8 * size - 1):
            return serial, size
    return 6, 8


def record_bytes(values: Sequence[object], real_columns: frozenset[int] = frozenset()) -> int:
    """The bytes of the record SQLite stores for a row of ``values`` (a rowid alias is
    NULL in it): the header of serial types and the body. A whole number in a REAL
    column is stored as an integer (``real_columns``: their positions)."""
    header = body = 0
    for position, value in enumerate(values):
        if isinstance(value, float) and position in real_columns and value.is_integer():
            value = int(value) if abs(value) < 1 << 51 else value
        if value is None:
            serial, size = 0, 0
        elif isinstance(value, int):
            serial, size = _integer_serial(value)
        elif isinstance(value, float):
            serial, size = 7, 8
        elif isinstance(value, bytes):
            serial, size = 12 + 2 * len(value), len(value)
        else:
            size = len(str(value).encode("utf-8"))
            serial = 13 + 2 * size
        header, body = header + _varint_bytes(serial), body + size
    size_of_header = header + 1
    while _varint_bytes(size_of_header) + header > size_of_header:
        size_of_header += 1
    return size_of_header + body
