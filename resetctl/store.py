"""All SQL: schema and migrations, claims, compare-and-set writes, events, the outbox.

Connections are autocommit; every write runs inside an explicit ``BEGIN IMMEDIATE`` that
is never held across a transport call. Every write to a notice row is a compare-and-set
on its row version (and lease token, for a sweep) that checks exactly one row changed;
losing one is normal and recorded as a ``lost_race`` event. This module decides nothing
about what happens next: that is the machine's job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from resetctl.privacy import create_private, warn_if_shared
from resetctl.tick import NEXT_DUE_SQL, RECORD_SWEEP_SQL, SCHEMA_VERSION, sweep_record

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

#: A round's compare-and-sets in one statement: each row of the JSON array names a notice,
#: the version and lease token its decision was made on, and what to write. Only rows
#: whose version (and token, when given) still match change; RETURNING names them. A
#: terminal notice never moves again, whatever a writer decided.
STEP_CAS_SQL = (
    "UPDATE notices SET"
    " phase = CASE WHEN notices.phase IN ('accepted', 'failed', 'expired')"
    " THEN notices.phase ELSE j.phase END,"
    " reason = CASE WHEN notices.phase IN ('accepted', 'failed', 'expired')"
    " THEN notices.reason ELSE j.reason END,"
    " phase_since = CASE WHEN notices.phase = j.phase OR notices.phase IN"
    " ('accepted', 'failed', 'expired') THEN notices.phase_since ELSE j.now END,"
    " version = notices.version + 1,"
    " lease_owner = CASE WHEN j.release THEN NULL ELSE notices.lease_owner END,"
    " lease_token = CASE WHEN j.release THEN NULL ELSE notices.lease_token END,"
    " lease_expires_at = CASE WHEN j.release THEN NULL ELSE notices.lease_expires_at END,"
    " due_at = CASE WHEN notices.phase IN ('accepted', 'failed', 'expired') THEN NULL"
    " WHEN j.release THEN j.due_at ELSE notices.due_at END"
    " FROM (SELECT value ->> 'id' AS id, value ->> 'version' AS version,"
    " value ->> 'token' AS token, value ->> 'phase' AS phase, value ->> 'reason' AS reason,"
    " value ->> 'now' AS now, value ->> 'release' AS release, value ->> 'due_at' AS due_at"
    " FROM json_each(?)) AS j"
    " WHERE notices.id = j.id AND notices.version = j.version"
    " AND (j.token IS NULL OR notices.lease_token = j.token)"
    " RETURNING notices.id, notices.phase, notices.reason"
)

#: The claim of chosen notices (``enqueue --send``): the same update, limited to ids that
#: are live, due and not under a live lease.
CLAIM_IDS_SQL = CLAIM_SQL.replace(
    "WHERE due_at <= :now ORDER BY due_at LIMIT :limit",
    "WHERE id IN (SELECT value FROM json_each(:ids)) AND due_at <= :now LIMIT :limit",
)
#: Kinds of daily_counts rows that are not events: per-notice figures `health` reads over
#: a window, folded in by `purge` so a window over purged days still adds up.
DERIVED_ATTEMPT = "health:attempt"
DERIVED_EXPIRED_WITHOUT_OUTCOME = "health:expired_without_outcome"
DERIVED_LATE_PRIMARY = "health:late_primary_after_fallback"

#: An attempt's outcome for `health`: the latest normalized status, or the submission's
#: own end when nothing was observed.
_ATTEMPT_OUTCOME = (
    "CASE a.state WHEN 'rejected' THEN 'failed'"
    " WHEN 'ambiguous' THEN 'ambiguous' WHEN 'intent' THEN 'unsent' ELSE"
    " COALESCE((SELECT o.status FROM observations o WHERE o.attempt_key ="
    " a.attempt_key ORDER BY o.id DESC LIMIT 1), 'pending') END"
)
#: Expired notices (alias n) on which no channel ever answered decisively.
_EXPIRED_WITHOUT_OUTCOME = (
    "n.phase = 'expired'"
    " AND NOT EXISTS (SELECT 1 FROM attempts a JOIN observations o"
    " ON o.attempt_key = a.attempt_key WHERE a.notice_id = n.id"
    " AND o.status IN ('accepted', 'delivered', 'failed'))"
    " AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.notice_id = n.id"
    " AND a.state = 'rejected')"
)
#: Fallback attempts (alias f) followed by a success on the primary (alias p).
_LATE_PRIMARY_FROM = (
    " FROM attempts f"
    " JOIN notices n ON n.id = f.notice_id"
    " JOIN attempts p ON p.notice_id = f.notice_id AND p.channel <> f.channel"
    " JOIN observations o ON o.attempt_key = p.attempt_key"
    " WHERE f.started_at > p.started_at"
    " AND o.status IN ('accepted', 'delivered') AND o.observed_at > f.started_at"
)
#: Where a derived daily_counts row is folded in; counts add up on conflict.
_FOLD_INTO_DAILY = (
    "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status,"
    " reason, policy, policy_version, template_version, count) "
)
_FOLD_CONFLICT = " ON CONFLICT DO UPDATE SET count = count + excluded.count"

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
}


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
    recipient_hash: str | None
    #: the reader's locale as given at enqueue (canonical BCP 47), if any
    locale: str | None = None


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
    #: the reader's locale (canonical BCP 47), if given
    locale: str | None = None


@dataclass(frozen=True, slots=True)
class IntentFacts:
    """A submission about to be attempted, with what was rendered for it."""

    attempt_key: str
    channel: str
    transport: str
    template_version: str
    segments: int | None
    recoverable: bool
    #: the transport's lookup settle time, when it can look up what it sent
    lookup_settle: float | None = None
    #: the template locale directory rendered, or None for the version's default copy
    locale: str | None = None


@dataclass(frozen=True, slots=True)
class DeclinedFacts:
    """A call that was not made after its intent was written: the intent is undone."""

    attempt_key: str


@dataclass(frozen=True, slots=True)
class LookupFacts:
    """What a lookup of an ambiguous submission found (evidence), or that it found nothing."""

    attempt_key: str
    #: the provider's id and status when found; None when the provider has no such message
    message_id: str | None
    raw_status: str | None
    status: Status | None
    #: not-found lookups and when the first was made, as the machine folded them
    lookups: int
    first_lookup_at: float | None
    #: the attempt's state after the lookup (intent once two lookups found nothing)
    state: AttemptState
    #: the lookup read failed: nothing is learned
    failed: bool = False


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
    #: the provider's id carried by a callback (it may name an attempt whose reply was lost)
    message_id: str | None = None
    #: a callback's identity (provider id and status, or the provider's idempotency token)
    dedupe: str | None = None


Facts = IntentFacts | OutcomeFacts | ObservationFacts | LookupFacts | DeclinedFacts | None


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
    #: the channel the facts are about
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a compare-and-set write achieved."""

    won: bool
    version: int


_NOTICE_COLUMNS = (
    "id, phase, expires_at, channels, version, lease_token, lease_owner, lease_expires_at,"
    " region, policy_name, policy_version, created_at, phase_since, due_at, reason,"
    " account_ref, recipient_hash, locale"
)


def outbox_message_id(attempt_key: str) -> str:
    """The outbox's id for the message submitted under ``attempt_key`` (one per key)."""
    return "obx_" + hashlib.sha256(attempt_key.encode()).hexdigest()[:16]


def _event_row(step: Step, written: tuple[str, str | None] | None) -> tuple[object, ...]:
    """The event a step records: its kind and the row's phase and reason as written when
    it won, ``lost_race`` when it did not."""
    facts = step.facts
    status = getattr(facts, "status", None)
    phase, reason = written if written is not None else (step.old_phase.value, None)
    return (
        step.notice_id,
        step.now,
        step.worker,
        step.kind if written is not None else "lost_race",
        step.old_phase.value,
        phase,
        None if facts is None else facts.attempt_key,
        step.channel,
        None if status is None else str(status),
        step.polls,
        reason,
    )


def _loaded(row: Sequence[Any], attempts: tuple[Attempt, ...]) -> LoadedNotice:
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
        recipient_hash=row[16],
        locale=row[17],
    )


class Store:
    """One SQLite database file.

    By default a missing file is created, private to its owner (0600; SQLite gives the
    -wal and -shm files the database's mode). With ``must_exist`` (commands that only
    read) a missing file, or one that holds no resetctl schema, is a StoreError and
    nothing is created.
    """

    def __init__(
        self,
        path: str | Path,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        *,
        must_exist: bool = False,
    ) -> None:
        self.path = str(path)
        #: called with a step's kind after its writes, before its commit (crash tests)
        self.before_commit: Callable[[str], None] | None = None
        #: keep the outbox's rendered messages after their notice ends ([outbox]
        #: keep_content, for development); by default they are scrubbed with the notice
        self.keep_outbox_content = False
        #: outbox messages join the next write transaction (a sweep's round outcomes)
        self.defer_outbox = False
        self._deferred_outbox: list[tuple[str, str, str, str, str, float, float, str]] = []
        in_memory = self.path == ":memory:" or self.path.startswith("file:")
        target = self.path
        try:
            if must_exist and not in_memory:
                if not Path(self.path).is_file():
                    raise StoreError(f"database {self.path}: no such file (nothing created)")
                # mode=rw: SQLite itself never creates the file, even in a race.
                target = Path(self.path).resolve().as_uri() + "?mode=rw"
            elif not in_memory:
                create_private(Path(self.path))
        except OSError as exc:
            raise StoreError(f"database {self.path}: cannot create ({exc.strerror})") from None
        try:
            self.conn = sqlite3.connect(
                target,
                isolation_level=None,
                timeout=busy_timeout,
                check_same_thread=False,
                uri=target != self.path,
            )
            if must_exist and self._schema_version() == 0 and not self._has_tables():
                self.conn.close()
                raise StoreError(f"database {self.path}: not a resetctl database (no schema)")
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None
        if not in_memory:
            warn_if_shared(Path(self.path))

    def _schema_version(self) -> int:
        (version,) = self.conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _has_tables(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` write transaction: committed on success, else rolled back.

        Outbox messages submitted while ``defer_outbox`` is on are written first, so they
        commit with the outcomes that record them (see :meth:`outbox_submit`).
        """
        deferred, self._deferred_outbox = self._deferred_outbox, []
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if deferred:
                self.conn.executemany(
                    "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
                    " submitted_at, updated_at, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (attempt_key) DO NOTHING",
                    deferred,
                )
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            self._deferred_outbox[:0] = deferred
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
        # Compared as policies, not text: a record stored by an older resetctl lacks keys
        # added since, which take their defaults and change nothing.
        return bool(stored == body or Policy.from_record(json.loads(stored)) == policy)

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
            " phase, phase_since, due_at, locale)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
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
                new.locale,
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
        return self._claim(CLAIM_SQL, worker, now, lease, limit, {})

    def claim_notices(
        self, worker: str, notice_ids: Sequence[str], now: float, lease: float
    ) -> list[Claim]:
        """Lease the chosen notices that are live, due and not leased (``enqueue --send``
        makes their first submission itself)."""
        if not notice_ids:
            return []
        ids = {"ids": json.dumps(list(notice_ids))}
        return self._claim(CLAIM_IDS_SQL, worker, now, lease, len(notice_ids), ids)

    def _claim(
        self,
        sql: str,
        worker: str,
        now: float,
        lease: float,
        limit: int,
        extra: Mapping[str, object],
    ) -> list[Claim]:
        token = secrets.token_hex(8)
        until = now + lease
        params = {"worker": worker, "token": token, "until": until, "now": now, "limit": limit}
        with self.transaction() as conn:
            rows = conn.execute(sql, {**params, **extra}).fetchall()
        return [
            Claim(notice_id, token, until, previous is not None) for notice_id, previous in rows
        ]

    def load_notice(self, notice_id: str) -> LoadedNotice | None:
        """A notice with its attempts and folded statuses; None when unknown."""
        row = self.conn.execute(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE id = ?", (notice_id,)
        ).fetchone()
        if row is None:
            return None
        attempts = self._attempts_where("a.notice_id = ?", (notice_id,))
        return _loaded(row, attempts.get(notice_id, ()))

    def load_notices(self, notice_ids: Sequence[str]) -> dict[str, LoadedNotice]:
        """Several notices with their attempts, in two queries (a claimed batch)."""
        chosen = json.dumps(list(notice_ids))
        rows = self.conn.execute(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE id IN (SELECT value FROM json_each(?))",
            (chosen,),
        ).fetchall()
        attempts = self._attempts_where(
            "a.notice_id IN (SELECT value FROM json_each(?))", (chosen,)
        )
        return {row[0]: _loaded(row, attempts.get(row[0], ())) for row in rows}

    def load_contacts(self, notice_ids: Sequence[str]) -> dict[str, Contact]:
        """The secret halves of several notices (scrubbed ones are absent). Only the lease
        holder reads them."""
        rows = self.conn.execute(
            "SELECT notice_id, email, phone, reset_url, display_name FROM notice_secrets"
            " WHERE notice_id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(notice_ids)),),
        )
        return {row[0]: Contact(*row[1:]) for row in rows}

    def _attempts_where(
        self, where: str, params: Sequence[object]
    ) -> dict[str, tuple[Attempt, ...]]:
        rows = self.conn.execute(
            "SELECT a.attempt_key, a.channel, a.state, a.started_at, a.last_call_at,"
            " a.submitted_at, a.message_id, a.calls, a.settled, a.polls, a.recoverable,"
            " o.status, a.notice_id, a.last_read_at, a.lookup_settle, a.lookups,"
            " a.first_lookup_at FROM attempts a"
            " LEFT JOIN observations o ON o.attempt_key = a.attempt_key"
            f" WHERE {where} ORDER BY a.notice_id, a.started_at, a.attempt_key, o.id",
            params,
        ).fetchall()
        statuses: dict[str, list[Status]] = {}
        heads: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            heads.setdefault(row[0], row)
            bucket = statuses.setdefault(row[0], [])
            if row[11] is not None:
                bucket.append(Status(row[11]))
        by_notice: dict[str, list[Attempt]] = {}
        for key, head in heads.items():
            by_notice.setdefault(head[12], []).append(
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
                    last_read_at=head[13],
                    lookup_settle=head[14],
                    lookups=head[15],
                    first_lookup_at=head[16],
                )
            )
        return {notice: tuple(found) for notice, found in by_notice.items()}

    def attempt_for_message(self, transport: str, message_id: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of a provider's message, for callbacks."""
        row = self.conn.execute(
            "SELECT notice_id, channel, attempt_key FROM attempts"
            " WHERE transport = ? AND message_id = ?",
            (transport, message_id),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def attempt_by_key(self, transport: str, attempt_key: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of an attempt by its key, for callbacks that
        carry it (an ambiguous attempt has no provider id yet)."""
        row = self.conn.execute(
            "SELECT notice_id, channel, attempt_key FROM attempts"
            " WHERE attempt_key = ? AND transport = ?",
            (attempt_key, transport),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def observation_seen(self, dedupe: str) -> bool:
        """True when a callback with this identity was stored already. Call inside the
        write transaction that would store it (the unique index backs it up)."""
        row = self.conn.execute("SELECT 1 FROM observations WHERE dedupe = ?", (dedupe,)).fetchone()
        return row is not None

    def load_contact(self, notice_id: str) -> Contact | None:
        """The secret half of a notice; None once scrubbed. Only the lease holder reads it."""
        return self.load_contacts([notice_id]).get(notice_id)

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
        (result,) = self.write_steps([step])
        return result

    def write_steps(self, steps: Sequence[Step]) -> list[StepResult]:
        """Write a round's steps inside the caller's transaction, in a few set-based
        statements: one compare-and-set UPDATE for every notice (each row's own version
        and lease token; RETURNING says which won), then the facts, scrubs and events of
        the whole round together. Facts are kept whether or not their step won."""
        if not steps:
            return []
        conn = self.conn
        rows = [
            {
                "id": step.notice_id,
                "version": step.version,
                "token": step.lease_token,
                "phase": step.decision.phase.value,
                "reason": step.decision.reason.value,
                "now": step.now,
                "release": int(step.release or step.decision.phase.terminal),
                "due_at": None if step.decision.phase.terminal else step.decision.due_at,
            }
            for step in steps
        ]
        # What each winning row now says (the terminal guard may have kept its phase).
        written = {
            row[0]: (str(row[1]), row[2])
            for row in conn.execute(STEP_CAS_SQL, (json.dumps(rows),)).fetchall()
        }
        won = set(written)
        results = [StepResult(step.notice_id in won, step.version + 1) for step in steps]
        self._write_all_facts(steps, won)
        finished = [s.notice_id for s in steps if s.notice_id in won and s.decision.phase.terminal]
        if finished:
            chosen = json.dumps(finished)
            conn.execute(
                "DELETE FROM notice_secrets WHERE notice_id IN (SELECT value FROM json_each(?))",
                (chosen,),
            )
            if not self.keep_outbox_content:
                # The outbox holds rendered messages (address, link): scrubbed too.
                conn.execute(
                    "UPDATE outbox SET content = '{\"scrubbed\": true}'"
                    " WHERE notice_id IN (SELECT value FROM json_each(?))",
                    (chosen,),
                )
        # Evidence changed the facts of a notice whose step lost: holders of older views
        # must reload, and a notice nobody holds is due at once, so whoever holds it next
        # acts on the evidence now rather than when its parked decision falls due. A live
        # lease keeps its due time (its end): its holder's next write loses its
        # compare-and-set, reloads and decides again.
        conn.executemany(
            "UPDATE notices SET version = version + 1, due_at = CASE"
            " WHEN due_at > :now AND (lease_expires_at IS NULL"
            " OR lease_expires_at <= :now) THEN :now ELSE due_at END WHERE id = :id",
            [
                {"now": s.now, "id": s.notice_id}
                for s in steps
                if s.notice_id not in won
                and s.facts is not None
                and not isinstance(s.facts, IntentFacts | DeclinedFacts)
            ],
        )
        conn.executemany(
            "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase,"
            " attempt_key, channel, status, polls, reason)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_event_row(s, written.get(s.notice_id)) for s in steps],
        )
        if self.before_commit is not None:
            for kind in dict.fromkeys(s.kind for s in steps):
                self.before_commit(kind)
        return results

    def _write_all_facts(self, steps: Sequence[Step], won: set[str]) -> None:
        """Every step's facts, grouped by kind so each kind is one executemany."""
        conn = self.conn
        intents = [s for s in steps if isinstance(s.facts, IntentFacts) and s.notice_id in won]
        conn.executemany(
            "INSERT INTO attempts (attempt_key, notice_id, channel, transport,"
            " template_version, segments, state, recoverable, started_at,"
            " last_call_at, lookup_settle, locale)"
            " VALUES (?, ?, ?, ?, ?, ?, 'intent', ?, ?, ?, ?, ?)"
            " ON CONFLICT (notice_id, channel) DO UPDATE SET calls = calls + 1,"
            " last_call_at = excluded.last_call_at, segments = excluded.segments,"
            " lookups = 0, first_lookup_at = NULL, locale = excluded.locale",
            [
                (
                    f.attempt_key,
                    s.notice_id,
                    f.channel,
                    f.transport,
                    f.template_version,
                    f.segments,
                    int(f.recoverable),
                    s.now,
                    s.now,
                    f.lookup_settle,
                    f.locale,
                )
                for s in intents
                if isinstance(f := s.facts, IntentFacts)
            ],
        )
        outcomes = [(s, s.facts) for s in steps if isinstance(s.facts, OutcomeFacts)]
        # A later fact never downgrades an earlier one: once submitted or rejected, a
        # stale worker's transient or ambiguous outcome does not undo it.
        conn.executemany(
            "UPDATE attempts SET settled = calls,"
            " state = CASE WHEN state IN ('submitted', 'rejected') AND :state NOT IN"
            " ('submitted', 'rejected') THEN state ELSE :state END,"
            " message_id = COALESCE(message_id, :message_id),"
            " submitted_at = CASE WHEN :state IN ('submitted', 'ambiguous')"
            " THEN COALESCE(submitted_at, :now) ELSE submitted_at END,"
            " last_error = :error WHERE attempt_key = :key",
            [
                {
                    "state": f.state.value,
                    "message_id": f.message_id,
                    "now": s.now,
                    "error": f.error,
                    "key": f.attempt_key,
                }
                for s, f in outcomes
            ],
        )
        observations: list[tuple[str, str, str, str, float, str | None]] = [
            (f.attempt_key, "submit", f.raw_status, f.status.value, s.now, None)
            for s, f in outcomes
            if f.status is not None and f.raw_status is not None
        ]
        for s in steps:
            facts = s.facts
            if isinstance(facts, DeclinedFacts):
                self._write_declined(facts)
            elif isinstance(facts, LookupFacts):
                self._write_lookup(conn, facts, s.notice_id in won, s.now)
            elif isinstance(facts, ObservationFacts):
                if facts.message_id is not None:
                    self._found(conn, facts.attempt_key, facts.message_id)
                observations.append(
                    (
                        facts.attempt_key,
                        facts.source,
                        facts.raw_status,
                        facts.status.value,
                        s.now,
                        facts.dedupe,
                    )
                )
        conn.executemany(
            "UPDATE attempts SET polls = polls + 1, last_read_at = ? WHERE attempt_key = ?",
            [
                (s.now, f.attempt_key)
                for s in steps
                if isinstance(f := s.facts, ObservationFacts) and f.source == "poll"
            ],
        )
        conn.executemany(
            "INSERT INTO observations (attempt_key, source, raw_status, status, observed_at,"
            " dedupe) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (dedupe) WHERE dedupe IS NOT NULL DO NOTHING",
            observations,
        )

    def _write_declined(self, facts: DeclinedFacts) -> None:
        """The call was never made: undo its intent (a first call leaves no attempt)."""
        self.conn.execute(
            "UPDATE attempts SET calls = calls - 1, settled = MIN(settled, calls - 1)"
            " WHERE attempt_key = ?",
            (facts.attempt_key,),
        )
        self.conn.execute(
            "DELETE FROM attempts WHERE attempt_key = ? AND calls = 0", (facts.attempt_key,)
        )

    @staticmethod
    def _found(conn: sqlite3.Connection, attempt_key: str, message_id: str) -> None:
        """The provider has the message (a lookup or a callback said so): an ambiguous or
        in-doubt attempt is submitted, with the provider's id."""
        conn.execute(
            "UPDATE attempts SET message_id = COALESCE(message_id, :message_id),"
            " state = CASE WHEN state IN ('intent', 'ambiguous') THEN 'submitted' ELSE state END,"
            " settled = calls, submitted_at = COALESCE(submitted_at, last_call_at),"
            " lookups = 0, first_lookup_at = NULL WHERE attempt_key = :key",
            {"message_id": message_id, "key": attempt_key},
        )

    def _write_lookup(
        self, conn: sqlite3.Connection, facts: LookupFacts, won: bool, now: float
    ) -> None:
        if facts.failed:
            # A read was made: the next lookup waits the settle time.
            conn.execute(
                "UPDATE attempts SET last_read_at = ? WHERE attempt_key = ?",
                (now, facts.attempt_key),
            )
            return
        if facts.message_id is not None:
            # Evidence: kept whoever holds the notice.
            self._found(conn, facts.attempt_key, facts.message_id)
            conn.execute(
                "UPDATE attempts SET last_read_at = ? WHERE attempt_key = ?",
                (now, facts.attempt_key),
            )
            if facts.status is not None and facts.raw_status is not None:
                self._insert_observation(
                    conn, facts.attempt_key, "lookup", facts.raw_status, facts.status, now
                )
        elif won:
            # "Not found" counts only for the holder that asked: a lost one is asked again.
            conn.execute(
                "UPDATE attempts SET lookups = ?, first_lookup_at = ?, last_read_at = ?,"
                " state = ?, settled = CASE WHEN ? = 'intent' THEN calls ELSE settled END"
                " WHERE attempt_key = ?",
                (
                    facts.lookups,
                    facts.first_lookup_at,
                    now,
                    facts.state.value,
                    facts.state.value,
                    facts.attempt_key,
                ),
            )

    @staticmethod
    def _insert_observation(
        conn: sqlite3.Connection,
        attempt_key: str,
        source: str,
        raw_status: str,
        status: Status,
        now: float,
        dedupe: str | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO observations (attempt_key, source, raw_status, status, observed_at,"
            " dedupe) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (dedupe) WHERE dedupe IS NOT NULL DO NOTHING",
            (attempt_key, source, raw_status, status.value, now, dedupe),
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
        (due,) = self.conn.execute(NEXT_DUE_SQL).fetchone() or (None,)
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
            " a.locale, a.segments, a.started_at, a.submitted_at, a.message_id, a.calls,"
            " a.settled, a.polls, a.lookups, a.last_error, o.observed_at AS observed_at,"
            " o.source AS source,"
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

    def _dicts(
        self, sql: str, params: Sequence[object] | dict[str, object]
    ) -> list[dict[str, Any]]:
        """Rows of a read-only query (inspect, ops, export) as dicts, by sqlite-utils.

        Imported here, not at module level: it costs about 50 ms on top of the command
        line's own imports, which reads can afford and a sweep's start-up cannot.
        """
        from sqlite_utils import Database

        return list(Database(self.conn).query(sql, params))

    # -- operations -------------------------------------------------------------------

    def live_notices(self) -> list[LoadedNotice]:
        """Every live notice with its attempts (for `alerts`), in two queries."""
        rows = self.conn.execute(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE due_at IS NOT NULL ORDER BY due_at"
        ).fetchall()
        attempts = self._attempts_where(
            "a.notice_id IN (SELECT id FROM notices WHERE due_at IS NOT NULL)", ()
        )
        return [_loaded(row, attempts.get(row[0], ())) for row in rows]

    def record_would_page(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record once per notice that an observe-mode alert would have paged for it."""
        return self._record_alert_event("would_page", notice_id, phase, reason, now)

    def record_alert_once(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record that `alerts` reported a notice nobody can help any more; False when it
        was reported before (such a notice is reported once, not on every run)."""
        return self._record_alert_event("alert_reported", notice_id, phase, reason, now)

    def _record_alert_event(
        self, kind: str, notice_id: str, phase: Phase, reason: str, now: float
    ) -> bool:
        """An `alerts` event of ``kind`` for the notice, unless it has one already."""
        with self.transaction() as conn:
            changed = conn.execute(
                "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase, reason)"
                " SELECT :id, :now, 'alerts', :kind, :phase, :phase, :reason WHERE NOT EXISTS"
                " (SELECT 1 FROM events WHERE notice_id = :id AND kind = :kind)",
                {"id": notice_id, "now": now, "kind": kind, "phase": phase.value, "reason": reason},
            ).rowcount
        return bool(changed)

    def meta_value(self, key: str) -> str | None:
        """A value of the meta table (watermarks, last sweep)."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def ended_since(self, after_event: int, after_time: float) -> tuple[list[dict[str, Any]], int]:
        """Notices that ended without success (expired or failed) in events after the
        event id ``after_event`` (or, when purge took every newer event away and ids
        start again, after ``after_time``), oldest first, and the newest event id.

        Event ids follow commit order (writes are serialized), so a watermark on them
        never skips a step that committed late.
        """
        (newest,) = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()
        by_time = int(newest) < after_event
        where = "e.at > :time" if by_time else "e.id > :event"
        rows = self._dicts(
            "SELECT e.notice_id, n.region, e.new_phase AS phase, e.reason, e.at AS ended_at,"
            " n.policy_name AS policy, n.policy_version FROM events e"
            " JOIN notices n ON n.id = e.notice_id"
            f" WHERE {where} AND e.id <= :newest AND e.new_phase IN ('expired', 'failed')"
            " AND e.old_phase <> e.new_phase AND e.kind <> 'lost_race' ORDER BY e.id",
            {"time": after_time, "event": after_event, "newest": newest},
        )
        return rows, int(newest)

    def live_summary(self) -> tuple[int, float | None]:
        """(count, earliest created_at) of live notices."""
        count, first = self.conn.execute(
            "SELECT COUNT(*), MIN(created_at) FROM notices WHERE due_at IS NOT NULL"
        ).fetchone()
        return int(count), None if first is None else float(first)

    def known_policies(self) -> list[tuple[str, int]]:
        """(name, version) of every policy record stored."""
        rows = self.conn.execute("SELECT name, version FROM policies ORDER BY 1, 2")
        return [(str(n), int(v)) for n, v in rows]

    def phase_counts(self) -> dict[str, int]:
        """Notices stored, by phase."""
        rows = self.conn.execute("SELECT phase, COUNT(*) FROM notices GROUP BY phase")
        return {str(phase): int(count) for phase, count in rows}

    def live_counts(self) -> list[tuple[str, str, int, int]]:
        """(phase, policy, policy_version, count) of live notices: the queue depth."""
        rows = self.conn.execute(
            "SELECT phase, policy_name, policy_version, COUNT(*) FROM notices"
            " WHERE due_at IS NOT NULL GROUP BY 1, 2, 3"
        )
        return [(str(p), str(n), int(v), int(c)) for p, n, v, c in rows]

    def oldest_due_at(self, now: float) -> float | None:
        """The due time of the longest-waiting notice that is due now (sweep lag)."""
        (due,) = self.conn.execute(
            "SELECT MIN(due_at) FROM notices WHERE due_at IS NOT NULL AND due_at <= ?", (now,)
        ).fetchone()
        return None if due is None else float(due)

    def event_counts(self, since: float) -> list[dict[str, Any]]:
        """Events since ``since`` by every bounded dimension, live rows plus purged days."""
        return self._dicts(
            "SELECT kind, old_phase, new_phase, channel, status, reason, policy,"
            " policy_version, template_version, SUM(count) AS count FROM ("
            " SELECT e.kind, e.old_phase, e.new_phase, COALESCE(e.channel, '') AS channel,"
            " COALESCE(e.status, '') AS status, COALESCE(e.reason, '') AS reason,"
            " n.policy_name AS policy, n.policy_version AS policy_version,"
            " COALESCE(a.template_version, '') AS template_version, COUNT(*) AS count"
            " FROM events e JOIN notices n ON n.id = e.notice_id"
            " LEFT JOIN attempts a ON a.attempt_key = e.attempt_key"
            " WHERE e.at >= :since GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9"
            " UNION ALL SELECT kind, old_phase, new_phase, channel, status, reason, policy,"
            " policy_version, template_version, count FROM daily_counts"
            " WHERE day >= date(:since, 'unixepoch') AND kind NOT LIKE 'health:%')"
            " GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9",
            {"since": since},
        )

    def _derived_since(self, kind: str, since: float) -> list[tuple[str, str, int]]:
        """(channel, status, count) of a derived kind on purged days from ``since``'s."""
        rows = self.conn.execute(
            "SELECT channel, status, SUM(count) FROM daily_counts WHERE kind = ?"
            " AND day >= date(?, 'unixepoch') GROUP BY 1, 2",
            (kind, since),
        )
        return [(str(c), str(s), int(n)) for c, s, n in rows]

    def attempt_outcomes(self, since: float) -> list[tuple[str, str, int]]:
        """(channel, outcome, count) of attempts begun since ``since``: the latest
        normalized status, or the submission's own end when nothing was observed.
        Purged days count from their daily aggregates."""
        rows = self.conn.execute(
            f"SELECT a.channel, {_ATTEMPT_OUTCOME}, COUNT(*)"
            " FROM attempts a WHERE a.started_at >= ? GROUP BY 1, 2",
            (since,),
        )
        counts: dict[tuple[str, str], int] = {}
        for channel, outcome, count in [
            *rows,
            *self._derived_since(DERIVED_ATTEMPT, since),
        ]:
            key = (str(channel), str(outcome))
            counts[key] = counts.get(key, 0) + int(count)
        return [(c, o, n) for (c, o), n in counts.items()]

    def expired_without_outcome(self, since: float) -> int:
        """Notices that expired since ``since`` with no channel ever answering decisively
        (purged days from their daily aggregates)."""
        (count,) = self.conn.execute(
            "SELECT COUNT(*) FROM notices n WHERE n.phase_since >= ?"
            f" AND {_EXPIRED_WITHOUT_OUTCOME}",
            (since,),
        ).fetchone()
        purged = self._derived_since(DERIVED_EXPIRED_WITHOUT_OUTCOME, since)
        return int(count) + sum(n for _, _, n in purged)

    def late_primary_after_fallback(self, since: float) -> int:
        """Notices whose primary reported success after their fallback was submitted
        (purged days from their daily aggregates)."""
        (count,) = self.conn.execute(
            f"SELECT COUNT(DISTINCT f.notice_id) {_LATE_PRIMARY_FROM} AND f.started_at >= ?",
            (since,),
        ).fetchone()
        purged = self._derived_since(DERIVED_LATE_PRIMARY, since)
        return int(count) + sum(n for _, _, n in purged)

    def record_sweep(self, finished_at: float, duration: float) -> None:
        """Remember the last sweep's end and duration (for metrics)."""
        with self.transaction() as conn:
            conn.executemany(RECORD_SWEEP_SQL, sweep_record(finished_at, duration))

    def last_sweep(self) -> tuple[float, float] | None:
        """(finished_at, duration) of the last recorded sweep."""
        rows = dict(
            self.conn.execute(
                "SELECT key, value FROM meta WHERE key IN ('last_sweep_at', 'last_sweep_duration')"
            ).fetchall()
        )
        if len(rows) < 2:
            return None
        return float(rows["last_sweep_at"]), float(rows["last_sweep_duration"])

    def purge_batch(self, cutoff: float, limit: int) -> int:
        """Delete up to ``limit`` notices that finished before ``cutoff``, with their
        attempts, observations, events and outbox messages, in one short transaction,
        first folding their events into daily_counts. Returns how many were deleted."""
        with self.transaction() as conn:
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM notices WHERE due_at IS NULL AND phase_since < ?"
                    " ORDER BY phase_since LIMIT ?",
                    (cutoff, limit),
                )
            ]
            if not ids:
                return 0
            chosen = json.dumps(ids)
            conn.execute(
                "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status,"
                " reason, policy, policy_version, template_version, count)"
                " SELECT date(e.at, 'unixepoch'), e.kind, e.old_phase, e.new_phase,"
                " COALESCE(e.channel, ''), COALESCE(e.status, ''), COALESCE(e.reason, ''),"
                " n.policy_name, n.policy_version, COALESCE(a.template_version, ''), COUNT(*)"
                " FROM events e JOIN notices n ON n.id = e.notice_id"
                " LEFT JOIN attempts a ON a.attempt_key = e.attempt_key"
                " WHERE e.notice_id IN (SELECT value FROM json_each(?))"
                " GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10"
                " ON CONFLICT DO UPDATE SET count = count + excluded.count",
                (chosen,),
            )
            self._fold_derived(conn, chosen)
            selected = "(SELECT value FROM json_each(?))"
            conn.execute(
                "DELETE FROM observations WHERE attempt_key IN (SELECT attempt_key FROM"
                f" attempts WHERE notice_id IN {selected})",
                (chosen,),
            )
            for table, column in (
                ("attempts", "notice_id"),
                ("events", "notice_id"),
                ("outbox", "notice_id"),
                ("notice_secrets", "notice_id"),
            ):
                conn.execute(f"DELETE FROM {table} WHERE {column} IN {selected}", (chosen,))
            # Only still-finished rows: nothing live is ever removed.
            deleted = conn.execute(
                f"DELETE FROM notices WHERE id IN {selected} AND due_at IS NULL", (chosen,)
            ).rowcount
        return int(deleted)

    @staticmethod
    def _fold_derived(conn: sqlite3.Connection, chosen: str) -> None:
        """Fold the per-notice figures `health` reads into daily_counts before the rows
        go: attempts by outcome (by start day), expired without outcome (by end day),
        late primary after fallback (by the fallback's day)."""
        selected = "(SELECT value FROM json_each(:chosen))"
        conn.execute(
            _FOLD_INTO_DAILY + "SELECT date(a.started_at, 'unixepoch'), :kind, '', '',"
            f" a.channel, {_ATTEMPT_OUTCOME}, '', n.policy_name, n.policy_version,"
            " a.template_version, COUNT(*) FROM attempts a JOIN notices n ON n.id = a.notice_id"
            f" WHERE a.notice_id IN {selected} GROUP BY 1, 5, 6, 8, 9, 10" + _FOLD_CONFLICT,
            {"chosen": chosen, "kind": DERIVED_ATTEMPT},
        )
        conn.execute(
            _FOLD_INTO_DAILY + "SELECT date(n.phase_since, 'unixepoch'), :kind, '', '', '',"
            " '', '', n.policy_name, n.policy_version, '', COUNT(*) FROM notices n"
            f" WHERE n.id IN {selected} AND {_EXPIRED_WITHOUT_OUTCOME}"
            " GROUP BY 1, 8, 9" + _FOLD_CONFLICT,
            {"chosen": chosen, "kind": DERIVED_EXPIRED_WITHOUT_OUTCOME},
        )
        conn.execute(
            _FOLD_INTO_DAILY + "SELECT date(started_at, 'unixepoch'), :kind, '', '', '', '',"
            " '', policy_name, policy_version, '', COUNT(*) FROM (SELECT DISTINCT f.notice_id,"
            f" f.started_at, n.policy_name, n.policy_version {_LATE_PRIMARY_FROM}"
            f" AND f.notice_id IN {selected}) WHERE true GROUP BY 1, 8, 9" + _FOLD_CONFLICT,
            {"chosen": chosen, "kind": DERIVED_LATE_PRIMARY},
        )

    def storage(self) -> dict[str, Any]:
        """Measured bytes by table (with its indexes) and row counts, from dbstat:
        ``bytes`` are the pages allocated, ``encoded`` the records' own bytes in them."""
        measured = self.conn.execute(
            "SELECT COALESCE(m.tbl_name, s.name), SUM(s.pgsize), SUM(s.payload) FROM dbstat s"
            " LEFT JOIN sqlite_master m ON m.name = s.name GROUP BY 1"
        ).fetchall()
        sizes = {name: allocated for name, allocated, _ in measured}
        encoded = {name: payload for name, _, payload in measured}
        counts = {
            table: self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("notices", "attempts", "observations", "events", "outbox")
        }
        first = self.conn.execute("SELECT MIN(at), MAX(at) FROM events").fetchone()
        (page_size,) = self.conn.execute("PRAGMA page_size").fetchone()
        (pages,) = self.conn.execute("PRAGMA page_count").fetchone()
        return {
            "bytes": {str(k): int(v) for k, v in sizes.items()},
            "encoded": {str(k): int(v or 0) for k, v in encoded.items()},
            "rows": counts,
            "events_span": (first[0], first[1]),
            "file_bytes": int(page_size) * int(pages),
        }

    # -- timings export -------------------------------------------------------------

    def terminal_timings(self, since: float, until: float) -> Iterator[dict[str, Any]]:
        """Finished notices created in [since, until), oldest first, with their policy
        record's key and, per attempt, every read's time, source and raw status (a poll
        that saw nothing new included: it bounds when a status changed). No id, account,
        contact or URL is selected.
        """
        notices = self.conn.execute(
            "SELECT id, region, created_at, expires_at, policy_name, policy_version"
            " FROM notices WHERE created_at >= ? AND created_at < ? AND due_at IS NULL"
            " ORDER BY created_at, id",
            (since, until),
        )
        for notice_id, region, created_at, expires_at, name, version in notices.fetchall():
            channels: dict[str, dict[str, Any]] = {}
            rows = self.conn.execute(
                "SELECT a.channel, a.transport, a.submitted_at, a.last_read_at, o.observed_at,"
                " o.raw_status, o.source FROM attempts a LEFT JOIN observations o"
                " ON o.attempt_key = a.attempt_key"
                " WHERE a.notice_id = ? ORDER BY a.channel, o.observed_at, o.id",
                (notice_id,),
            )
            for channel, transport, submitted_at, last_read_at, observed_at, raw, source in rows:
                entry = channels.setdefault(
                    channel,
                    {
                        "transport": transport,
                        "submitted_at": submitted_at,
                        "last_read_at": last_read_at,
                        "seen": [],
                    },
                )
                if observed_at is not None:
                    entry["seen"].append((observed_at, raw, source))
            yield {
                "region": region,
                "created_at": created_at,
                "expires_at": expires_at,
                "policy": (name, version),
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
        """Store a message once per attempt key; returns (message_id, current status).

        The message id follows from the attempt key, so a resubmission under the same key
        is the same message whether or not the first one was ever stored. With
        ``defer_outbox`` on (a sweep's rounds), the message joins the next write
        transaction (the round's outcomes) instead of committing on its own, and a
        resubmission of a stored message reports the status it was submitted with (the
        next status read tells the current one): a crash before that commit is an attempt
        in doubt that recovery resubmits under the same key, as with any provider.
        """
        message_id = outbox_message_id(attempt_key)
        row = (
            message_id,
            attempt_key,
            notice_id,
            channel,
            status,
            now,
            now,
            json.dumps(content),
        )
        if self.defer_outbox:
            self._deferred_outbox.append(row)
            return message_id, status
        with self.transaction() as conn:
            stored = conn.execute(
                "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
                " submitted_at, updated_at, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (attempt_key) DO NOTHING RETURNING status",
                row,
            ).fetchone()
            if stored is None:  # this key was submitted before: the same message
                stored = conn.execute(
                    "SELECT status FROM outbox WHERE attempt_key = ?", (attempt_key,)
                ).fetchone()
        return message_id, str(stored[0])

    def outbox_status(self, message_id: str) -> str | None:
        """The outbox message's current raw status."""
        for pending in self._deferred_outbox:
            if pending[0] == message_id:
                return str(pending[4])
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
