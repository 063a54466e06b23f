"""PostgreSQL's dialect: the claim with ``FOR UPDATE SKIP LOCKED``, the round's
compare-and-set from a JSON array of rows, lease times on the database's clock, and
finished transactions as the alerts' watermark."""

from __future__ import annotations

from resetctl.store.backend import Dialect
from resetctl.store.records import NOTICE_COLUMNS, TERMINAL_SQL

#: The database's clock, in epoch seconds: every host compares leases against this one.
#: A session may move it forward (SET resetctl.clock_offset = seconds): tests and
#: simulations use that to let leases pass without waiting for them.
DB_NOW = (
    "(EXTRACT(EPOCH FROM now())::float8"
    " + COALESCE(NULLIF(current_setting('resetctl.clock_offset', true), '')::float8, 0))"
)
#: "Now" for lease and due comparisons: never later than the database's clock, so a host
#: whose clock runs fast cannot see a live lease as expired.
LEASE_NOW = f"LEAST(CAST(:now AS float8), {DB_NOW})"

_CLAIM_SET = (
    "UPDATE notices SET taken_over_from = lease_owner, lease_owner = :worker,"
    " lease_token = :token, lease_expires_at = :until, due_at = :until,"
    " lease_recoveries = lease_recoveries + (lease_owner IS NOT NULL)::int,"
    " version = version + 1"
)
_QUALIFIED = ", ".join(f"notices.{column.strip()}" for column in NOTICE_COLUMNS.split(","))
#: Claimed rows come back as written (NOTICE_COLUMNS), oldest due first, as on SQLite
#: (RETURNING alone has no order).
_CLAIM_RETURNING = (
    f" WHERE notices.id = due.id RETURNING notices.taken_over_from, {_QUALIFIED},"
    f" due.due_at AS was_due) SELECT taken_over_from, {NOTICE_COLUMNS} FROM claimed"
    " ORDER BY was_due, id"
)

#: The claim: one UPDATE over the oldest due live notices (the partial index notices_due),
#: skipping rows another claim or writer holds (never waiting on them). Every right-hand
#: side reads the row as it was, so `taken_over_from` keeps the previous holder.
CLAIM_SQL = (
    # Each part locks its rows as it reads them, skipping rows another claim holds, so
    # hosts claiming at once share the work rather than all finding the same few locked.
    "WITH candidates AS ("
    "SELECT id, due_at, expires_at FROM (SELECT id, due_at, expires_at FROM notices"
    f" WHERE due_at IS NOT NULL AND due_at <= {LEASE_NOW}"
    " ORDER BY due_at LIMIT :limit FOR UPDATE SKIP LOCKED) AS oldest"
    " UNION SELECT id, due_at, expires_at FROM (SELECT id, due_at, expires_at FROM notices"
    f" WHERE phase = 'queued' AND due_at IS NOT NULL AND due_at <= {LEASE_NOW}"
    " ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED) AS soonest),"
    f" claimed AS ({_CLAIM_SET}"
    " FROM (SELECT id, due_at FROM candidates ORDER BY expires_at LIMIT :limit) AS due"
    + _CLAIM_RETURNING
)

#: The claim of chosen notices (``enqueue --send``): live, due and not under a live lease.
CLAIM_IDS_SQL = (
    f"WITH claimed AS ({_CLAIM_SET}"
    " FROM (SELECT id, due_at FROM notices WHERE id IN"
    " (SELECT value FROM jsonb_array_elements_text(CAST(:ids AS jsonb)))"
    f" AND due_at IS NOT NULL AND due_at <= {LEASE_NOW}"
    " LIMIT :limit FOR UPDATE SKIP LOCKED) AS due" + _CLAIM_RETURNING
)

#: A round's compare-and-sets in one statement (see the SQLite one): only rows whose
#: version (and token, when given) still match change; a terminal row keeps its phase
#: (and the trigger notices_terminal_guard refuses any writer that tries otherwise).
STEP_CAS_SQL = (
    "UPDATE notices SET"
    f" phase = CASE WHEN notices.phase IN {TERMINAL_SQL} THEN notices.phase ELSE j.phase END,"
    f" reason = CASE WHEN notices.phase IN {TERMINAL_SQL} THEN notices.reason ELSE j.reason END,"
    " phase_since = CASE WHEN notices.phase = j.phase OR notices.phase IN"
    f" {TERMINAL_SQL} THEN notices.phase_since ELSE j.now END,"
    " version = notices.version + 1,"
    " lease_owner = CASE WHEN j.release = 1 THEN NULL ELSE notices.lease_owner END,"
    " lease_token = CASE WHEN j.release = 1 THEN NULL ELSE notices.lease_token END,"
    " lease_expires_at = CASE WHEN j.release = 1 THEN NULL ELSE notices.lease_expires_at END,"
    f" due_at = CASE WHEN notices.phase IN {TERMINAL_SQL} THEN NULL"
    " WHEN j.release = 1 THEN j.due_at ELSE notices.due_at END"
    " FROM (SELECT e.v ->> 0 AS id, (e.v ->> 1)::bigint AS version, e.v ->> 2 AS token,"
    " e.v ->> 3 AS phase, e.v ->> 4 AS reason, (e.v ->> 5)::float8 AS now,"
    " (e.v ->> 6)::int AS release, (e.v ->> 7)::float8 AS due_at"
    " FROM jsonb_array_elements(CAST(? AS jsonb)) AS e(v)) AS j"
    " WHERE notices.id = j.id AND notices.version = j.version"
    " AND (j.token IS NULL OR notices.lease_token = j.token)"
    " RETURNING notices.id, notices.phase, notices.reason"
)

DIALECT = Dialect(
    claim=CLAIM_SQL,
    claim_ids=CLAIM_IDS_SQL,
    step_cas=STEP_CAS_SQL,
    ids_template="(SELECT value FROM jsonb_array_elements_text(CAST({param} AS jsonb)))",
    day_template="to_char(to_timestamp({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    lease_now=LEASE_NOW,
    database_clock=DB_NOW,
    # Event ids follow insert order, not commit order, on a server where writers run at
    # once: the watermark is the newest transaction below which every one has ended, so
    # none can still add an event the next read would skip.
    events_watermark="SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1",
    event_mark_template="e.xid {op} CAST(CAST({param} AS text) AS xid8)",
    events_order="e.xid, e.id",
    # The planner picks the partial index by itself once finished rows outnumber live ones.
    live_notices="notices",
    lock_rows=" FOR UPDATE",
    row_bytes_template="pg_column_size({alias}.*)",
)
