-- resetctl schema for PostgreSQL (version 8): the same tables and indexes as the top-level
-- schema.sql (SQLite's), in PostgreSQL's types. Times are seconds since the Unix epoch
-- (double precision, UTC). The store applies this file to an empty database and records
-- its version in meta (key schema_version); schema.py's MIGRATIONS move older databases.
-- tests/test_schema_agreement.py compares the two as created.

-- Per-database facts: the salt of request digests and recipient hashes.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Policy records by (name, version), as resolved at enqueue: a config change never
-- rewrites a notice in flight.
CREATE TABLE IF NOT EXISTS policies (
    name       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    body       TEXT    NOT NULL,
    stored_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE IF NOT EXISTS notices (
    id               TEXT    PRIMARY KEY,
    idempotency_key  TEXT    NOT NULL UNIQUE,
    request_digest   TEXT    NOT NULL,
    account_ref      TEXT,
    region           TEXT    NOT NULL,
    policy_name      TEXT    NOT NULL,
    policy_version   INTEGER NOT NULL,
    channels         TEXT    NOT NULL,          -- delivery order, comma-separated
    recipient_hash   TEXT,                      -- salted HMAC for correlation, never the address
    created_at       DOUBLE PRECISION NOT NULL,
    expires_at       DOUBLE PRECISION NOT NULL,
    locale           TEXT,                      -- the reader's language (BCP 47), if given
    phase            TEXT    NOT NULL,
    phase_since      DOUBLE PRECISION NOT NULL,
    reason           TEXT,                      -- the machine's reason for the current phase
    due_at           DOUBLE PRECISION,                      -- NULL once terminal; the lease end while leased
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at DOUBLE PRECISION,
    lease_recoveries INTEGER NOT NULL DEFAULT 0,  -- claims that took over an unreleased lease
    taken_over_from  TEXT,                      -- the previous holder, on such a claim
    version          INTEGER NOT NULL DEFAULT 0, -- row version: every write is a compare-and-set
    consent          TEXT                       -- the channels the person agreed to (comma-separated); NULL: not given
);

-- Live notices only: a claim reads O(batch) rows however many finished notices exist.
CREATE INDEX IF NOT EXISTS notices_due ON notices (due_at) WHERE due_at IS NOT NULL;
-- First submissions by deadline: under a backlog, a claim takes the queued notices whose
-- links die soonest (the only queued ones not due are leased: a claim walks few extra).
CREATE INDEX IF NOT EXISTS notices_queued_expiry ON notices (expires_at)
    WHERE phase = 'queued' AND due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS notices_created ON notices (created_at);
-- An account's notices, newest first: what supersede cancels and `list --account` reads.
CREATE INDEX IF NOT EXISTS notices_account ON notices (account_ref, created_at)
    WHERE account_ref IS NOT NULL;
-- Finished notices by the time they finished: what `purge` walks.
CREATE INDEX IF NOT EXISTS notices_finished ON notices (phase_since) WHERE due_at IS NULL;
-- ... and by policy: `purge` applies each region's retention.
CREATE INDEX IF NOT EXISTS notices_finished_policy ON notices (policy_name, phase_since)
    WHERE due_at IS NULL;

-- Contact data and the reset URL live in their own row, read only by the lease holder,
-- and are deleted when the notice becomes terminal.
CREATE TABLE IF NOT EXISTS notice_secrets (
    notice_id    TEXT PRIMARY KEY REFERENCES notices (id) ON DELETE CASCADE,
    email        TEXT,
    phone        TEXT,
    reset_url    TEXT NOT NULL,
    display_name TEXT
);

-- At most one attempt per channel: UNIQUE (notice_id, channel).
CREATE TABLE IF NOT EXISTS attempts (
    attempt_key      TEXT    PRIMARY KEY,
    notice_id        TEXT    NOT NULL REFERENCES notices (id) ON DELETE CASCADE,
    channel          TEXT    NOT NULL,
    transport        TEXT    NOT NULL,
    template_version TEXT    NOT NULL,
    segments         INTEGER,
    state            TEXT    NOT NULL,
    recoverable      INTEGER NOT NULL,
    started_at       DOUBLE PRECISION NOT NULL,
    last_call_at     DOUBLE PRECISION NOT NULL,
    submitted_at     DOUBLE PRECISION,
    message_id       TEXT,
    calls            INTEGER NOT NULL DEFAULT 1,
    settled          INTEGER NOT NULL DEFAULT 0,
    polls            INTEGER NOT NULL DEFAULT 0,
    last_read_at     DOUBLE PRECISION,                      -- the latest status read (late slots collapse)
    lookup_settle    DOUBLE PRECISION,                      -- NULL: the transport cannot look messages up
    lookups          INTEGER NOT NULL DEFAULT 0,  -- not-found lookups since the latest call
    first_lookup_at  DOUBLE PRECISION,                      -- when the first of those was made
    locale           TEXT,                      -- the template locale actually rendered
    last_error       TEXT,
    -- What a lookup must match, recorded with the intent (JSON: sender, body digest,
    -- the provider's metadata); never the body. Cleared when the notice is terminal.
    sent             TEXT,
    call_mono        TEXT,                      -- the host's monotonic clock at the latest call
    lookup_mono      TEXT,                      -- ... and at the first not-found lookup
    lookup_failing_since DOUBLE PRECISION,                -- lookups failing since then, unanswered
    UNIQUE (notice_id, channel)
);

CREATE INDEX IF NOT EXISTS attempts_message ON attempts (transport, message_id)
    WHERE message_id IS NOT NULL;

-- Evidence about attempts, stored even when it changes nothing (a late receipt).
CREATE TABLE IF NOT EXISTS observations (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    attempt_key TEXT    NOT NULL REFERENCES attempts (attempt_key) ON DELETE CASCADE,
    source      TEXT    NOT NULL,               -- submit, poll, callback
    raw_status  TEXT    NOT NULL,
    status      TEXT    NOT NULL,               -- normalized
    observed_at DOUBLE PRECISION NOT NULL,
    dedupe      TEXT                            -- a callback's identity: a replay is stored once
);
CREATE INDEX IF NOT EXISTS observations_attempt ON observations (attempt_key, id);
CREATE UNIQUE INDEX IF NOT EXISTS observations_dedupe ON observations (dedupe)
    WHERE dedupe IS NOT NULL;

-- One row per recorded transition.
CREATE TABLE IF NOT EXISTS events (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    notice_id   TEXT    NOT NULL,
    at          DOUBLE PRECISION NOT NULL,
    worker      TEXT    NOT NULL,
    kind        TEXT    NOT NULL,               -- intent, outcome, poll, callback, tick, lost_race, lease_recovered
    old_phase   TEXT    NOT NULL,
    new_phase   TEXT    NOT NULL,
    attempt_key TEXT,
    channel     TEXT,
    status      TEXT,
    polls       INTEGER,
    reason      TEXT,
    lane_wait   DOUBLE PRECISION,               -- seconds the step's call waited in its transport's lane
    -- The writing transaction: ids are handed out at insert, not at commit, so a reader
    -- that must see every event once (alerts' watermark) reads by finished transaction.
    xid         XID8    NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX IF NOT EXISTS events_notice ON events (notice_id, id);
CREATE INDEX IF NOT EXISTS events_xid ON events (xid);
CREATE INDEX IF NOT EXISTS events_at ON events (at);

-- The outbox transport's messages: what a local mail catcher would hold.
CREATE TABLE IF NOT EXISTS outbox (
    message_id   TEXT PRIMARY KEY,
    attempt_key  TEXT NOT NULL UNIQUE,
    notice_id    TEXT NOT NULL,
    channel      TEXT NOT NULL,
    status       TEXT NOT NULL,
    submitted_at DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    content      TEXT NOT NULL                  -- JSON: subject/text/html, or body
);
CREATE INDEX IF NOT EXISTS outbox_submitted ON outbox (submitted_at);
-- Scrubbing and purging a notice's messages must not scan the outbox.
CREATE INDEX IF NOT EXISTS outbox_notice ON outbox (notice_id);

-- Event counts by day, kept when `purge` deletes old notices and their events, so
-- `health` over long windows and the metrics' counters still add up.
CREATE TABLE IF NOT EXISTS daily_counts (
    day              TEXT    NOT NULL,          -- YYYY-MM-DD, UTC
    kind             TEXT    NOT NULL,
    old_phase        TEXT    NOT NULL,
    new_phase        TEXT    NOT NULL,
    channel          TEXT    NOT NULL,          -- '' when none
    status           TEXT    NOT NULL,
    reason           TEXT    NOT NULL,
    policy           TEXT    NOT NULL,          -- the policy record's name (bounded by config)
    policy_version   INTEGER NOT NULL,
    template_version TEXT    NOT NULL,
    count            INTEGER NOT NULL,
    PRIMARY KEY (day, kind, old_phase, new_phase, channel, status, reason, policy,
                 policy_version, template_version)
);

-- Abuse limits (a policy's `limits`), counted here so every process and host agrees: one
-- row per rule, policy and subject (a keyed recipient hash, never the address; or an
-- ISO 3166 country), holding the counts inside its window as JSON [[start, count], ...].
-- A write locks its row (PostgreSQL: FOR UPDATE; SQLite: BEGIN IMMEDIATE), so two
-- enqueues for one recipient are counted one after the other, never both under the limit.
CREATE TABLE IF NOT EXISTS limit_counts (
    rule     TEXT    NOT NULL,                  -- recipient, sms_country
    policy   TEXT    NOT NULL,
    subject  TEXT    NOT NULL,
    counts   TEXT    NOT NULL,
    last_at  DOUBLE PRECISION    NOT NULL,                  -- the latest count (purge drops idle rows)
    PRIMARY KEY (rule, policy, subject)
);
CREATE INDEX IF NOT EXISTS limit_counts_last ON limit_counts (last_at);

-- Requests enqueue refused for a policy reason (rate_limited, no_consent, a refused
-- destination), by minute (health's windows stay true to a minute) and day (purge keeps
-- the aggregates by day): no notice row holds them, and health and metrics count them.
CREATE TABLE IF NOT EXISTS refusals (
    day     TEXT    NOT NULL,                   -- YYYY-MM-DD, UTC
    minute  INTEGER NOT NULL,                   -- epoch minutes; 0 in purged days' totals
    policy  TEXT    NOT NULL,
    reason  TEXT    NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (day, minute, policy, reason)
);

-- Notices enqueued under [rollout] mode = "shadow". Every sweep, in whatever mode it runs
-- itself, takes them through claims, decisions, limits and rendering but makes no provider
-- call: each ends cancelled (reason shadow) at its would-send. A notice's mode is fixed at
-- enqueue, as its policy is, so a switch of mode never sends a shadow notice nor silences
-- a live one. Deleted with the notice.
CREATE TABLE IF NOT EXISTS shadow_notices (
    notice_id TEXT PRIMARY KEY REFERENCES notices (id) ON DELETE CASCADE
);

-- Idempotency keys [rollout] percent left out of the slice: no notice holds them, and a
-- retry answers "in_slice": false again whatever the percent is by then. Kept while the
-- link the request carried can live, and two days at least (health counts them over its
-- window); then an enqueue that answers more folds them into daily_counts and deletes them.
CREATE TABLE IF NOT EXISTS slice_answers (
    idempotency_key TEXT    PRIMARY KEY,
    request_digest  TEXT    NOT NULL,           -- as a notice's: a retry must match it
    policy          TEXT    NOT NULL,
    answered_at     DOUBLE PRECISION    NOT NULL,
    keep_until      DOUBLE PRECISION    NOT NULL
);
CREATE INDEX IF NOT EXISTS slice_answers_kept ON slice_answers (keep_until);

-- Each provider instance's health, shared by every process and host (resetctl/failover.py):
-- consecutive failures (transient errors, time-outs) and, once [failover] after of them
-- fell within its window, out of use until open_until; then one probe call decides.
CREATE TABLE IF NOT EXISTS provider_health (
    instance         TEXT    PRIMARY KEY,
    failures         INTEGER NOT NULL DEFAULT 0,  -- consecutive, since the last success
    first_failure_at DOUBLE PRECISION,                      -- the first of them
    open_until       DOUBLE PRECISION,                      -- out of use until then; NULL: closed
    probe_until      DOUBLE PRECISION,                      -- a probe's call in flight until then
    opened           INTEGER NOT NULL DEFAULT 0,  -- times it was opened
    total_failures   INTEGER NOT NULL DEFAULT 0,
    last_failure_at  DOUBLE PRECISION,
    last_success_at  DOUBLE PRECISION
);

-- A terminal notice never moves again, whoever writes: the compare-and-set keeps its
-- phase, and this trigger refuses any statement that would change it or make it due.
CREATE OR REPLACE FUNCTION notices_terminal_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.phase IN ('accepted', 'failed', 'expired', 'cancelled')
            AND (NEW.phase IS DISTINCT FROM OLD.phase OR NEW.due_at IS NOT NULL) THEN
        RAISE EXCEPTION 'notice % is terminal (%): it never moves again', OLD.id, OLD.phase
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER notices_terminal_guard BEFORE UPDATE ON notices
    FOR EACH ROW EXECUTE FUNCTION notices_terminal_guard();
