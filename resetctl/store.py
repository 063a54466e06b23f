"""All SQL: schema and migrations, claims, compare-and-set writes, events, the outbox.

Connections are autocommit; every write runs inside an explicit ``BEGIN IMMEDIATE`` that
is never held across a transport call. Every write to a notice row is a compare-and-set
on its row version (and lease token, for a sweep) that checks exactly one row changed;
losing one is normal and recorded as a ``lost_race`` event. This module decides nothing
about what happens next: that is the machine's job.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from resetctl.config import Policy
from resetctl.errors import StoreError
from resetctl.machine import (
    Attempt,
    AttemptState,
    Decision,
    NoticeState,
    Phase,
    Status,
    fold_status,
)

#: The schema version this code writes (PRAGMA user_version).
SCHEMA_VERSION = 1
BUSY_TIMEOUT_SECONDS = 30.0


def schema_sql() -> str:
    """The text of ``schema.sql``: inside the wheel, else at the checkout's top level."""
    packaged = resources.files("resetctl").joinpath("schema.sql")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parent.parent / "schema.sql").read_text(encoding="utf-8")


def _statements(script: str) -> Iterator[str]:
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""


#: The claim: one UPDATE over the oldest due live notices, setting the lease. Every
#: right-hand side reads the row as it was, so `taken_over_from` keeps the previous
#: holder: a lease that was never released belonged to a dead or stalled worker.
CLAIM_SQL = (
    "UPDATE notices SET taken_over_from = lease_owner, lease_owner = :worker,"
    " lease_token = :token, lease_expires_at = :until, due_at = :until,"
    " lease_recoveries = lease_recoveries + (lease_owner IS NOT NULL),"
    " version = version + 1"
    " WHERE id IN (SELECT id FROM notices WHERE due_at <= :now"
    " ORDER BY due_at LIMIT :limit)"
    " RETURNING id, taken_over_from"
)

#: Forward migrations: MIGRATIONS[n] moves a file from user_version n to n + 1.
#: Version 0 is an empty file; schema.sql creates version 1.
MIGRATIONS: dict[int, Sequence[str]] = {}


@dataclass(frozen=True, slots=True)
class Claim:
    """A notice this worker now leases."""

    notice_id: str
    lease_token: str
    lease_expires_at: float
    #: the previous lease holder never released it (its worker died or stalled)
    recovered: bool


@dataclass(frozen=True, slots=True)
class LoadedNotice:
    """A notice as the machine sees it, plus the row's bookkeeping."""

    state: NoticeState
    version: int
    lease_token: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    region: str
    policy_name: str
    policy_version: int
    created_at: float
    phase_since: float
    due_at: float | None
    reason: str | None
    account_ref: str | None


@dataclass(frozen=True, slots=True)
class Contact:
    """The secret half of a notice. Never logged, never rendered into output."""

    email: str | None
    phone: str | None
    reset_url: str
    display_name: str | None

    def __repr__(self) -> str:
        return "Contact(<redacted>)"


@dataclass(frozen=True, slots=True)
class NewNotice:
    """A validated notice ready to insert."""

    notice_id: str
    idempotency_key: str
    request_digest: str
    account_ref: str | None
    region: str
    policy: Policy
    channels: tuple[str, ...]
    recipient_hash: str | None
    created_at: float
    expires_at: float
    contact: Contact


@dataclass(frozen=True, slots=True)
class IntentFacts:
    """A submission about to be attempted, with what was rendered for it."""

    attempt_key: str
    channel: str
    transport: str
    template_version: str
    segments: int | None
    recoverable: bool


@dataclass(frozen=True, slots=True)
class OutcomeFacts:
    """How a submission call ended."""

    attempt_key: str
    state: AttemptState
    message_id: str | None
    raw_status: str | None
    status: Status | None
    error: str | None


@dataclass(frozen=True, slots=True)
class ObservationFacts:
    """A status observation from a poll or a callback."""

    attempt_key: str
    source: str
    raw_status: str
    status: Status


Facts = IntentFacts | OutcomeFacts | ObservationFacts | None


@dataclass(frozen=True, slots=True)
class Step:
    """One step to write: the facts learned and the machine's decision."""

    #: the notice
    notice_id: str
    #: the row version the decision was made on (compare-and-set)
    version: int
    #: the writer's lease token, or None for a writer without a lease (a callback)
    lease_token: str | None
    #: the phase the decision was made from
    old_phase: Phase
    #: the machine's decision
    decision: Decision
    #: hand the lease back (and set the next due time)
    release: bool
    #: what was learned (always kept)
    facts: Facts
    #: event kind: intent, outcome, poll, tick, callback
    kind: str
    #: who writes
    worker: str
    #: when
    now: float
    #: the polls made on the attempt the facts are about
    polls: int | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a compare-and-set write achieved."""

    won: bool
    version: int


class Store:
    """One SQLite database file."""

    def __init__(self, path: str | Path, busy_timeout: float = BUSY_TIMEOUT_SECONDS) -> None:
        self.path = str(path)
        try:
            self.conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=busy_timeout, check_same_thread=False
            )
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` write transaction: committed on success, else rolled back."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _migrate(self) -> None:
        (current,) = self.conn.execute("PRAGMA user_version").fetchone()
        if current == SCHEMA_VERSION:
            return
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path}: schema version {current} is newer than this "
                f"resetctl ({SCHEMA_VERSION}); upgrade resetctl"
            )
        with self.transaction() as conn:
            (current,) = conn.execute("PRAGMA user_version").fetchone()
            if current == 0:
                for statement in _statements(schema_sql()):
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

    def salt(self) -> bytes:
        """This database's secret salt for digests and recipient hashes."""
        (value,) = self.conn.execute("SELECT value FROM meta WHERE key = 'salt'").fetchone()
        return bytes.fromhex(value)

    # -- policies ---------------------------------------------------------------------

    def store_policy(self, policy: Policy, now: float) -> bool:
        """Record a policy version; False when that version exists with other settings.

        Call inside a transaction.
        """
        body = policy.record_json()
        self.conn.execute(
            "INSERT INTO policies (name, version, body, stored_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (name, version) DO NOTHING",
            (policy.name, policy.version, body, now),
        )
        (stored,) = self.conn.execute(
            "SELECT body FROM policies WHERE name = ? AND version = ?",
            (policy.name, policy.version),
        ).fetchone()
        return bool(stored == body)

    def load_policy(self, name: str, version: int) -> Policy:
        """The policy a notice was enqueued under."""
        row = self.conn.execute(
            "SELECT body FROM policies WHERE name = ? AND version = ?", (name, version)
        ).fetchone()
        if row is None:
            raise StoreError(f"policy.{name} version {version} is missing from the database")
        return Policy.from_record(json.loads(row[0]))

    # -- enqueue ----------------------------------------------------------------------

    def insert_notice(self, new: NewNotice) -> tuple[str, str]:
        """Insert a notice, or find the one with its idempotency key.

        Returns (notice_id, request_digest of the stored notice). Call inside a transaction.
        """
        row = self.conn.execute(
            "INSERT INTO notices (id, idempotency_key, request_digest, account_ref, region,"
            " policy_name, policy_version, channels, recipient_hash, created_at, expires_at,"
            " phase, phase_since, due_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            (
                new.notice_id,
                new.idempotency_key,
                new.request_digest,
                new.account_ref,
                new.region,
                new.policy.name,
                new.policy.version,
                ",".join(new.channels),
                new.recipient_hash,
                new.created_at,
                new.expires_at,
                Phase.QUEUED.value,
                new.created_at,
                new.created_at,
            ),
        ).fetchone()
        if row is None:
            existing = self.conn.execute(
                "SELECT id, request_digest FROM notices WHERE idempotency_key = ?",
                (new.idempotency_key,),
            ).fetchone()
            return str(existing[0]), str(existing[1])
        contact = new.contact
        self.conn.execute(
            "INSERT INTO notice_secrets (notice_id, email, phone, reset_url, display_name)"
            " VALUES (?, ?, ?, ?, ?)",
            (new.notice_id, contact.email, contact.phone, contact.reset_url, contact.display_name),
        )
        return new.notice_id, new.request_digest

    # -- sweep ------------------------------------------------------------------------

    def claim_due(self, worker: str, now: float, lease: float, limit: int) -> list[Claim]:
        """Lease up to ``limit`` due notices, oldest due first, in one statement.

        A leased notice's due time becomes its lease end, so a dead worker's notices fall
        due again exactly when their lease passes.
        """
        token = secrets.token_hex(8)
        until = now + lease
        params = {"worker": worker, "token": token, "until": until, "now": now, "limit": limit}
        with self.transaction() as conn:
            rows = conn.execute(CLAIM_SQL, params).fetchall()
        return [
            Claim(notice_id, token, until, previous is not None) for notice_id, previous in rows
        ]

    def load_notice(self, notice_id: str) -> LoadedNotice | None:
        """A notice with its attempts and folded statuses; None when unknown."""
        row = self.conn.execute(
            "SELECT id, phase, expires_at, channels, version, lease_token, lease_owner,"
            " lease_expires_at, region, policy_name, policy_version, created_at, phase_since,"
            " due_at, reason, account_ref FROM notices WHERE id = ?",
            (notice_id,),
        ).fetchone()
        if row is None:
            return None
        attempts = self._attempts(notice_id)
        state = NoticeState(
            notice_id=row[0],
            phase=Phase(row[1]),
            expires_at=row[2],
            channels=tuple(row[3].split(",")),
            attempts=attempts,
        )
        return LoadedNotice(
            state=state,
            version=row[4],
            lease_token=row[5],
            lease_owner=row[6],
            lease_expires_at=row[7],
            region=row[8],
            policy_name=row[9],
            policy_version=row[10],
            created_at=row[11],
            phase_since=row[12],
            due_at=row[13],
            reason=row[14],
            account_ref=row[15],
        )

    def _attempts(self, notice_id: str) -> tuple[Attempt, ...]:
        rows = self.conn.execute(
            "SELECT a.attempt_key, a.channel, a.state, a.started_at, a.last_call_at,"
            " a.submitted_at, a.message_id, a.calls, a.settled, a.polls, a.recoverable,"
            " o.status FROM attempts a LEFT JOIN observations o ON o.attempt_key = a.attempt_key"
            " WHERE a.notice_id = ? ORDER BY a.started_at, a.attempt_key, o.id",
            (notice_id,),
        ).fetchall()
        statuses: dict[str, list[Status]] = {}
        heads: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            heads.setdefault(row[0], row)
            bucket = statuses.setdefault(row[0], [])
            if row[11] is not None:
                bucket.append(Status(row[11]))
        return tuple(
            Attempt(
                channel=head[1],
                key=key,
                state=AttemptState(head[2]),
                started_at=head[3],
                last_call_at=head[4],
                submitted_at=head[5],
                message_id=head[6],
                calls=head[7],
                settled=head[8],
                polls=head[9],
                recoverable=bool(head[10]),
                status=fold_status(statuses[key]),
            )
            for key, head in heads.items()
        )

    def attempt_for_message(self, transport: str, message_id: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of a provider's message, for callbacks."""
        row = self.conn.execute(
            "SELECT notice_id, channel, attempt_key FROM attempts"
            " WHERE transport = ? AND message_id = ?",
            (transport, message_id),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def load_contact(self, notice_id: str) -> Contact | None:
        """The secret half of a notice; None once scrubbed. Only the lease holder reads it."""
        row = self.conn.execute(
            "SELECT email, phone, reset_url, display_name FROM notice_secrets WHERE notice_id = ?",
            (notice_id,),
        ).fetchone()
        return None if row is None else Contact(*row)

    def record_step(self, step: Step) -> StepResult:
        """Write one step in its own transaction: facts always, the decision by CAS.

        ``step.version`` (and ``step.lease_token`` when given) must still match the row,
        or the decision is dropped and a ``lost_race`` event is recorded instead:
        evidence such as an observation or a submission outcome is true either way and is
        kept. An intent is only written by the winner: it is the claim on a channel.
        """
        with self.transaction():
            return self.write_step(step)

    def write_step(self, step: Step) -> StepResult:
        """:meth:`record_step` inside a transaction the caller already holds."""
        notice_id, version, lease_token = step.notice_id, step.version, step.lease_token
        old_phase, decision, facts, now = step.old_phase, step.decision, step.facts, step.now
        release, kind, worker, polls = step.release, step.kind, step.worker, step.polls
        terminal = decision.phase.terminal
        due_at = None if terminal else decision.due_at
        conn = self.conn
        if release or terminal:
            lease_sql = ", lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL"
            lease_sql += ", due_at = :due_at"
        else:
            lease_sql = ""
        token_sql = " AND lease_token = :token" if lease_token is not None else ""
        changed = conn.execute(
            "UPDATE notices SET phase = :phase, reason = :reason,"
            " phase_since = CASE WHEN phase = :phase THEN phase_since ELSE :now END,"
            f" version = version + 1{lease_sql}"
            f" WHERE id = :id AND version = :version{token_sql}",
            {
                "phase": decision.phase.value,
                "reason": decision.reason.value,
                "now": now,
                "due_at": due_at,
                "id": notice_id,
                "version": version,
                "token": lease_token,
            },
        ).rowcount
        won = changed == 1
        attempt_key = self._write_facts(conn, notice_id, facts, won, now)
        if won:
            if terminal:
                conn.execute("DELETE FROM notice_secrets WHERE notice_id = ?", (notice_id,))
            new_phase = decision.phase.value
            event_kind = kind
        else:
            if facts is not None and not isinstance(facts, IntentFacts):
                # Evidence changed the notice's facts: holders of older views must reload.
                conn.execute("UPDATE notices SET version = version + 1 WHERE id = ?", (notice_id,))
            new_phase = old_phase.value
            event_kind = "lost_race"
        status = getattr(facts, "status", None)
        conn.execute(
            "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase,"
            " attempt_key, status, polls, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                notice_id,
                now,
                worker,
                event_kind,
                old_phase.value,
                new_phase,
                attempt_key,
                None if status is None else str(status),
                polls,
                decision.reason.value if won else None,
            ),
        )
        return StepResult(won, version + 1)

    def _write_facts(
        self,
        conn: sqlite3.Connection,
        notice_id: str,
        facts: Facts,
        won: bool,
        now: float,
    ) -> str | None:
        if facts is None:
            return None
        if isinstance(facts, IntentFacts):
            if won:
                conn.execute(
                    "INSERT INTO attempts (attempt_key, notice_id, channel, transport,"
                    " template_version, segments, state, recoverable, started_at,"
                    " last_call_at) VALUES (?, ?, ?, ?, ?, ?, 'intent', ?, ?, ?)"
                    " ON CONFLICT (notice_id, channel) DO UPDATE SET calls = calls + 1,"
                    " last_call_at = excluded.last_call_at, segments = excluded.segments",
                    (
                        facts.attempt_key,
                        notice_id,
                        facts.channel,
                        facts.transport,
                        facts.template_version,
                        facts.segments,
                        int(facts.recoverable),
                        now,
                        now,
                    ),
                )
            return facts.attempt_key
        if isinstance(facts, OutcomeFacts):
            # A later fact never downgrades an earlier one: once submitted or rejected, a
            # stale worker's transient or ambiguous outcome does not undo it.
            conn.execute(
                "UPDATE attempts SET settled = calls,"
                " state = CASE WHEN state IN ('submitted', 'rejected') AND :state NOT IN"
                " ('submitted', 'rejected') THEN state ELSE :state END,"
                " message_id = COALESCE(message_id, :message_id),"
                " submitted_at = CASE WHEN :state IN ('submitted', 'ambiguous')"
                " THEN COALESCE(submitted_at, :now) ELSE submitted_at END,"
                " last_error = :error WHERE attempt_key = :key",
                {
                    "state": facts.state.value,
                    "message_id": facts.message_id,
                    "now": now,
                    "error": facts.error,
                    "key": facts.attempt_key,
                },
            )
            if facts.status is not None and facts.raw_status is not None:
                self._insert_observation(
                    conn, facts.attempt_key, "submit", facts.raw_status, facts.status, now
                )
            return facts.attempt_key
        if facts.source == "poll":
            conn.execute(
                "UPDATE attempts SET polls = polls + 1 WHERE attempt_key = ?",
                (facts.attempt_key,),
            )
        self._insert_observation(
            conn, facts.attempt_key, facts.source, facts.raw_status, facts.status, now
        )
        return facts.attempt_key

    @staticmethod
    def _insert_observation(
        conn: sqlite3.Connection,
        attempt_key: str,
        source: str,
        raw_status: str,
        status: Status,
        now: float,
    ) -> None:
        conn.execute(
            "INSERT INTO observations (attempt_key, source, raw_status, status, observed_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (attempt_key, source, raw_status, status.value, now),
        )

    def record_lease_recovery(self, notice_id: str, worker: str, phase: Phase, now: float) -> None:
        """An event saying this worker took over a lease its holder never released."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase)"
                " VALUES (?, ?, ?, 'lease_recovered', ?, ?)",
                (notice_id, now, worker, phase.value, phase.value),
            )

    def next_due_at(self) -> float | None:
        """The earliest due time of any live notice (leased ones fall due at lease end)."""
        (due,) = self.conn.execute(
            "SELECT due_at FROM notices WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
        ).fetchone() or (None,)
        return None if due is None else float(due)

    def explain_claim(self) -> list[str]:
        """The query plan of the claim statement itself (for tests and diagnostics)."""
        params = {"worker": "", "token": "", "until": 0.0, "now": 0.0, "limit": 1}
        rows = self.conn.execute("EXPLAIN QUERY PLAN " + CLAIM_SQL, params).fetchall()
        return [str(r[-1]) for r in rows]

    # -- inspect ----------------------------------------------------------------------

    def attempt_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """Attempts of a notice with their latest observation (no secrets here)."""
        return self._dicts(
            "SELECT a.channel, a.attempt_key, a.transport, a.state, a.template_version,"
            " a.segments, a.started_at, a.submitted_at, a.message_id, a.calls, a.settled,"
            " a.polls, a.last_error, o.observed_at AS observed_at, o.source AS source,"
            " o.raw_status AS raw_status, o.status AS status"
            " FROM attempts a LEFT JOIN observations o ON o.id = (SELECT MAX(id)"
            " FROM observations WHERE attempt_key = a.attempt_key)"
            " WHERE a.notice_id = ? ORDER BY a.started_at, a.attempt_key",
            (notice_id,),
        )

    def event_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """The notice's transition history, oldest first."""
        return self._dicts(
            "SELECT at, worker, kind, old_phase, new_phase, attempt_key, status, polls, reason"
            " FROM events WHERE notice_id = ? ORDER BY id",
            (notice_id,),
        )

    def all_events(self) -> list[dict[str, Any]]:
        """Every event (demo and tests)."""
        return self._dicts(
            "SELECT notice_id, at, worker, kind, old_phase, new_phase, attempt_key, status,"
            " polls, reason FROM events ORDER BY id",
            (),
        )

    def _dicts(self, sql: str, params: Sequence[object]) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # -- timings export -------------------------------------------------------------

    def terminal_timings(self, since: float, until: float) -> Iterator[dict[str, Any]]:
        """Finished notices created in [since, until), oldest first, with their attempts'
        observation times and raw statuses. No id, account, contact or URL is selected.
        """
        notices = self.conn.execute(
            "SELECT id, region, created_at, expires_at FROM notices"
            " WHERE created_at >= ? AND created_at < ? AND due_at IS NULL"
            " ORDER BY created_at, id",
            (since, until),
        )
        for notice_id, region, created_at, expires_at in notices.fetchall():
            channels: dict[str, dict[str, Any]] = {}
            rows = self.conn.execute(
                "SELECT a.channel, a.transport, a.submitted_at, o.observed_at, o.raw_status"
                " FROM attempts a LEFT JOIN observations o ON o.attempt_key = a.attempt_key"
                " WHERE a.notice_id = ? ORDER BY a.channel, o.observed_at, o.id",
                (notice_id,),
            )
            for channel, transport, submitted_at, observed_at, raw in rows:
                entry = channels.setdefault(
                    channel, {"transport": transport, "submitted_at": submitted_at, "seen": []}
                )
                if observed_at is not None:
                    entry["seen"].append((observed_at, raw))
            yield {
                "region": region,
                "created_at": created_at,
                "expires_at": expires_at,
                "channels": channels,
            }

    # -- outbox -----------------------------------------------------------------------

    def outbox_submit(
        self,
        attempt_key: str,
        notice_id: str,
        channel: str,
        content: dict[str, Any],
        status: str,
        now: float,
    ) -> tuple[str, str]:
        """Store a message once per attempt key; returns (message_id, current status)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
                " submitted_at, updated_at, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (attempt_key) DO NOTHING",
                (
                    "obx_" + secrets.token_hex(8),
                    attempt_key,
                    notice_id,
                    channel,
                    status,
                    now,
                    now,
                    json.dumps(content),
                ),
            )
            message_id, current = conn.execute(
                "SELECT message_id, status FROM outbox WHERE attempt_key = ?", (attempt_key,)
            ).fetchone()
        return str(message_id), str(current)

    def outbox_status(self, message_id: str) -> str | None:
        """The outbox message's current raw status."""
        row = self.conn.execute(
            "SELECT status FROM outbox WHERE message_id = ?", (message_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def outbox_set_status(self, message_id: str, status: str, now: float) -> bool:
        """Script a message's status; False when the message is unknown."""
        with self.transaction() as conn:
            changed = conn.execute(
                "UPDATE outbox SET status = ?, updated_at = ? WHERE message_id = ?",
                (status, now, message_id),
            ).rowcount
        return bool(changed == 1)

    def outbox_messages(self, notice_id: str | None = None) -> list[dict[str, Any]]:
        """Outbox messages, oldest first, without their content."""
        where, params = ("WHERE notice_id = ?", (notice_id,)) if notice_id else ("", ())
        return self._dicts(
            "SELECT message_id, notice_id, channel, attempt_key, status, submitted_at"
            f" FROM outbox {where} ORDER BY submitted_at, message_id",
            params,
        )

    def outbox_message(self, message_id: str) -> dict[str, Any] | None:
        """One outbox message with its rendered content."""
        rows = self._dicts(
            "SELECT message_id, notice_id, channel, attempt_key, status, submitted_at, content"
            " FROM outbox WHERE message_id = ?",
            (message_id,),
        )
        if not rows:
            return None
        row = rows[0]
        row.update(json.loads(row.pop("content")))
        return row
