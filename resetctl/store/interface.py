"""The store's one interface: what enqueue, sweep, observe, ops, replay and the outbox
may ask of the database, whichever backend holds it.

``Store(db)`` opens the backend ``db`` names: a file path is SQLite, a ``postgresql://``
URI (libpq syntax) is PostgreSQL. :func:`resetctl.store.open_store` does the same and is
what typed code calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from resetctl.config import Policy
from resetctl.machine import Phase
from resetctl.store.records import (
    Claim,
    Contact,
    LoadedNotice,
    NewNotice,
    Step,
    StepResult,
)

#: URI schemes that name a PostgreSQL database (libpq's own spellings).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(db: str | Path) -> bool:
    """True when ``db`` is a PostgreSQL connection URI rather than a file path."""
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


class Store(ABC):
    """A resetctl database. Every write to a notice row is a compare-and-set on its row
    version (and lease token); this interface decides nothing about what happens next.
    """

    #: "sqlite" or "postgresql"
    backend: str
    #: what the store was opened from (a file path, or a URI without its password)
    path: str

    def __new__(cls, db: str | Path, *args: Any, **kwargs: Any) -> Store:
        if cls is Store:  # open the backend the setting names
            if is_postgres(db):
                from resetctl.store.postgres import PostgresStore

                cls = PostgresStore
            else:
                from resetctl.store.sqlite import SqliteStore

                cls = SqliteStore
        return super().__new__(cls)

    def __init__(self) -> None:
        #: called with a step's kind after its writes, before its commit (crash tests)
        self.before_commit: Callable[[str], None] | None = None
        #: keep the outbox's rendered messages after their notice ends ([outbox]
        #: keep_content, for development); by default they are scrubbed with the notice
        self.keep_outbox_content = False
        #: outbox messages join the next write transaction (a sweep's round outcomes)
        self.defer_outbox = False
        self._deferred_outbox: list[tuple[str, str, str, str, str, float, float, str]] = []

    def decision_clock(self, host: Callable[[], float]) -> Callable[[], float]:
        """The clock every decision about this database's notices is made on (expiry,
        useful time left, poll slots, settle times, leases): ``host`` for a file only
        this host writes; the database's own clock where several hosts share it."""
        return host

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def salt(self) -> bytes:
        """This database's secret salt for digests and recipient hashes."""

    @abstractmethod
    def store_policy(self, policy: Policy, now: float) -> bool:
        """Record a policy version; False when that version exists with other
        settings."""

    @abstractmethod
    def load_policy(self, name: str, version: int) -> Policy:
        """The policy a notice was enqueued under."""

    @abstractmethod
    def insert_notices(self, news: Sequence[NewNotice]) -> list[tuple[str, str]]:
        """Insert notices, or find the ones their idempotency keys already name:
        (notice_id, request_digest) of each stored notice, in order."""

    @abstractmethod
    def claim_due(self, worker: str, now: float, lease: float, limit: int) -> list[Claim]:
        """Lease up to ``limit`` due notices, oldest due first, in one statement."""

    @abstractmethod
    def claim_notices(
        self, worker: str, notice_ids: Sequence[str], now: float, lease: float
    ) -> list[Claim]:
        """Lease the chosen notices that are live, due and not leased (``enqueue
        --send`` makes their first submission itself)."""

    @abstractmethod
    def load_notice(self, notice_id: str) -> LoadedNotice | None:
        """A notice with its attempts and folded statuses; None when unknown."""

    @abstractmethod
    def load_notices(self, notice_ids: Sequence[str]) -> dict[str, LoadedNotice]:
        """Several notices with their attempts, in two queries (a claimed batch)."""

    @abstractmethod
    def load_contacts(self, notice_ids: Sequence[str]) -> dict[str, Contact]:
        """The secret halves of several notices (scrubbed ones are absent). Only the
        lease holder reads them."""

    @abstractmethod
    def load_fingerprints(self, attempt_keys: Sequence[str]) -> dict[str, dict[str, str]]:
        """What each attempt's lookup must match, as recorded with its intent."""

    @abstractmethod
    def attempt_for_message(self, transport: str, message_id: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of a provider's message, for callbacks."""

    @abstractmethod
    def attempt_by_key(self, transport: str, attempt_key: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of an attempt by its key, for callbacks
        that carry it (an ambiguous attempt has no provider id yet)."""

    @abstractmethod
    def observation_seen(self, dedupe: str) -> bool:
        """True when a callback with this identity was stored already. Call inside
        the write transaction that would store it (the unique index backs it up)."""

    @abstractmethod
    def load_contact(self, notice_id: str) -> Contact | None:
        """The secret half of a notice; None once scrubbed. Only the lease holder
        reads it."""

    @abstractmethod
    def record_step(self, step: Step) -> StepResult:
        """Write one step in its own transaction: facts always, the decision by CAS."""

    @abstractmethod
    def write_step(self, step: Step) -> StepResult:
        """:meth:`record_step` inside a transaction the caller already holds."""

    @abstractmethod
    def write_steps(self, steps: Sequence[Step]) -> list[StepResult]:
        """Write a round's steps inside the caller's transaction, in a few set-based
        statements: one compare-and-set UPDATE for every notice (each row's own
        version and lease token; RETURNING says which won), then the facts, scrubs
        and events of the whole round together. Facts are kept whether or not their
        step won."""

    @abstractmethod
    def record_lease_recovery(self, notice_id: str, worker: str, phase: Phase, now: float) -> None:
        """An event saying this worker took over a lease its holder never released."""

    @abstractmethod
    def next_due_at(self) -> float | None:
        """The earliest due time of any live notice (leased ones fall due at lease
        end)."""

    @abstractmethod
    def attempt_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """Attempts of a notice with their latest observation (no secrets here)."""

    @abstractmethod
    def event_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """The notice's transition history, oldest first."""

    @abstractmethod
    def all_events(self) -> list[dict[str, Any]]:
        """Every event (demo and tests)."""

    @abstractmethod
    def live_notices(self) -> list[LoadedNotice]:
        """Every live notice with its attempts (for `alerts`), in two queries."""

    @abstractmethod
    def record_would_page(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record once per notice that an observe-mode alert would have paged for
        it."""

    @abstractmethod
    def record_alert_once(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record that `alerts` reported a notice nobody can help any more; False
        when it was reported before (such a notice is reported once, not on every
        run)."""

    @abstractmethod
    def meta_value(self, key: str) -> str | None:
        """A value of the meta table (watermarks, last sweep)."""

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""

    @abstractmethod
    def ended_since(self, after_event: int, after_time: float) -> tuple[list[dict[str, Any]], int]:
        """Notices that ended without success (expired or failed) in events after
        the event id ``after_event`` (or, when purge took every newer event away and
        ids start again, after ``after_time``), oldest first, and the newest event
        id."""

    @abstractmethod
    def live_summary(self) -> tuple[int, float | None]:
        """(count, earliest created_at) of live notices."""

    @abstractmethod
    def known_policies(self) -> list[tuple[str, int]]:
        """(name, version) of every policy record stored."""

    @abstractmethod
    def phase_counts(self) -> dict[str, int]:
        """Notices stored, by phase."""

    @abstractmethod
    def live_counts(self) -> list[tuple[str, str, int, int]]:
        """(phase, policy, policy_version, count) of live notices: the queue depth."""

    @abstractmethod
    def live_policy_counts(self) -> list[tuple[Policy, int]]:
        """The stored policy of every (name, version) live notices were enqueued under,
        with how many live notices use it (through the index over live notices)."""

    @abstractmethod
    def oldest_due_at(self, now: float) -> float | None:
        """The due time of the longest-waiting notice that is due now (sweep lag)."""

    @abstractmethod
    def event_counts(self, since: float) -> list[dict[str, Any]]:
        """Events since ``since`` by every bounded dimension, live rows plus purged
        days."""

    @abstractmethod
    def attempt_outcomes(self, since: float) -> list[tuple[str, str, int]]:
        """(channel, outcome, count) of attempts begun since ``since``: the latest
        normalized status, or the submission's own end when nothing was observed.
        Purged days count from their daily aggregates."""

    @abstractmethod
    def expired_without_outcome(self, since: float) -> int:
        """Notices that expired since ``since`` with no channel ever answering
        decisively (purged days from their daily aggregates)."""

    @abstractmethod
    def late_primary_after_fallback(self, since: float) -> int:
        """Notices whose primary reported success after their fallback was submitted
        (purged days from their daily aggregates)."""

    @abstractmethod
    def record_sweep(self, finished_at: float, duration: float) -> None:
        """Remember the last sweep's end and duration (for metrics)."""

    @abstractmethod
    def last_sweep(self) -> tuple[float, float] | None:
        """(finished_at, duration) of the last recorded sweep."""

    @abstractmethod
    def purge_batch(self, cutoff: float, limit: int) -> int:
        """Delete up to ``limit`` notices that finished before ``cutoff``, with
        their attempts, observations, events and outbox messages, in one short
        transaction, first folding their events into daily_counts. Returns how many
        were deleted."""

    @abstractmethod
    def row_counts(self) -> dict[str, int]:
        """Rows in each table that grows with traffic."""

    @abstractmethod
    def terminal_timings(self, since: float, until: float) -> Iterator[dict[str, Any]]:
        """Finished notices created in [since, until), oldest first, with their
        attempts' observation times and raw statuses. No id, account, contact or URL
        is selected."""

    @abstractmethod
    def outbox_submit(
        self,
        attempt_key: str,
        notice_id: str,
        channel: str,
        content: dict[str, Any],
        status: str,
        now: float,
    ) -> tuple[str, str]:
        """Store a message once per attempt key; returns (message_id, current
        status)."""

    @abstractmethod
    def outbox_status(self, message_id: str) -> str | None:
        """The outbox message's current raw status."""

    @abstractmethod
    def outbox_statuses(self, message_ids: Sequence[str]) -> dict[str, str]:
        """The current raw status of each known outbox message, by id (one query)."""

    @abstractmethod
    def outbox_set_status(self, message_id: str, status: str, now: float) -> bool:
        """Script a message's status; False when the message is unknown."""

    @abstractmethod
    def outbox_messages(self, notice_id: str | None = None) -> list[dict[str, Any]]:
        """Outbox messages, oldest first, without their content."""

    @abstractmethod
    def outbox_message(self, message_id: str) -> dict[str, Any] | None:
        """One outbox message with its rendered content."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction: committed on success, else rolled back. Outbox messages
        deferred by ``defer_outbox`` are written first, so they commit with the outcomes
        that record them."""

    @abstractmethod
    def explain_claim(self) -> list[str]:
        """The query plan of the claim statement itself (tests and diagnostics)."""

    @abstractmethod
    def storage(self) -> dict[str, Any]:
        """Measured bytes by table (with its indexes) and row counts: ``bytes`` are
        the pages allocated, ``encoded`` the records' own bytes in them."""
