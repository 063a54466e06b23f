"""What the store reads and writes, as frozen records: the same on every backend."""

from __future__ import annotations

import enum
import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resetctl.frozen import fast_init
from resetctl.machine import (
    PHASES,
    TERMINAL_PHASES,
    Attempt,
    AttemptState,
    Decision,
    NoticeState,
    Phase,
    Reason,
    Status,
)
from resetctl.policy import Policy


class StepKind(enum.StrEnum):
    """What a recorded step was (the ``kind`` of its event)."""

    #: a decision recorded with nothing called; hands the lease back when nothing is due
    TICK = "tick"
    #: a submission's intent, committed before its call
    INTENT = "intent"
    #: how a submission call ended
    OUTCOME = "outcome"
    #: a submission whose intent was undone because its call was not made
    DECLINED = "declined"
    #: a status read
    POLL = "poll"
    #: a lookup of a doubtful submission
    LOOKUP = "lookup"
    #: a provider's status callback
    CALLBACK = "callback"
    #: a compare-and-set this worker lost
    LOST_RACE = "lost_race"
    #: a claim that took over a lease its holder never handed back
    LEASE_RECOVERED = "lease_recovered"
    #: the application or on-call cancelled the notice (or a newer one superseded it)
    CANCEL = "cancel"
    #: a policy rule ruled a channel out (consent, destination, its country's SMS cap)
    SKIPPED = "skipped"
    #: a shadow notice's would-send: rendered and checked, never called; it ends
    #: ``cancelled`` (``shadow``) and its channel is the one it would have gone by
    SHADOW = "shadow"


@fast_init
@dataclass(frozen=True, slots=True)
class Claim:
    """A notice this worker now leases."""

    notice_id: str
    lease_token: str
    lease_expires_at: float
    #: the previous lease holder never released it (its worker died or stalled)
    recovered: bool
    #: the notice's row as the claim wrote it, with its attempts as read just after
    #: (None: not loaded)
    loaded: LoadedNotice | None = None


@fast_init
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
    #: the channels the person agreed to, as the enqueue gave them (None: not given)
    consent: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Contact:
    """The secret half of a notice. Never logged, never rendered into output."""

    email: str | None
    phone: str | None
    reset_url: str
    display_name: str | None

    def __repr__(self) -> str:
        return "Contact(<redacted>)"


@fast_init
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
    #: the channels the person agreed to, as given (None: the request said nothing)
    consent: tuple[str, ...] | None = None
    #: the channels the policy ruled out, with why (recorded as ``skipped`` events)
    skipped: tuple[tuple[str, Reason], ...] = ()


@fast_init
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
    #: what a lookup needs to recognise the message (JSON: sender, body digest, the
    #: provider's metadata), from what this call sends; never the body itself
    sent: str | None = None
    #: the host's monotonic reading at the call (``machine.Attempt.call_mono``)
    call_mono: str | None = None
    #: an SMS's encoding (``gsm7``, ``ucs2``): counted with its segments, never stored
    encoding: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class DeclinedFacts:
    """A call that was not made after its intent was written: the intent is undone."""

    attempt_key: str
    #: the SMS encoding its intent counted (the count is undone with the intent)
    encoding: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class LookupFacts:
    """What a lookup of an ambiguous submission found (evidence), or that it found nothing."""

    attempt_key: str
    #: the provider's id and status when found; None when the provider has no such message
    message_id: str | None
    raw_status: str | None
    status: Status | None
    #: the attempt as the machine folded the lookup into it: the store writes its doubt
    #: bookkeeping as it is (``machine.Attempt.doubtful``), deciding nothing itself
    after: Attempt
    #: the lookup read failed: nothing is learned
    failed: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class OutcomeFacts:
    """How a submission call ended."""

    attempt_key: str
    state: AttemptState
    message_id: str | None
    raw_status: str | None
    status: Status | None
    error: str | None


@fast_init
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


@fast_init
@dataclass(frozen=True, slots=True)
class SkippedFacts:
    """A channel ruled out before its first submission; the notice's channels become
    ``channels``."""

    channel: str
    why: Reason
    channels: tuple[str, ...]
    #: no attempt exists (the event names none)
    attempt_key: None = None


Facts = (
    IntentFacts
    | OutcomeFacts
    | ObservationFacts
    | LookupFacts
    | DeclinedFacts
    | SkippedFacts
    | None
)


@fast_init
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
    #: seconds the step's call waited in its transport's lane before it started
    lane_wait: float | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class StepResult:
    """What a compare-and-set write achieved."""

    won: bool
    version: int


#: An outbox message held back for the next write transaction: message_id, attempt_key,
#: notice_id, channel, status, submitted_at, updated_at, content (JSON).
OutboxRow = tuple[str, str, str, str, str, float, float, str]


#: The notices columns loaded_notice reads: the state's four, then LoadedNotice's fields
#: in their order.
NOTICE_COLUMNS = (
    "id, phase, expires_at, channels, version, lease_token, lease_owner, lease_expires_at,"
    " region, policy_name, policy_version, created_at, phase_since, due_at, reason,"
    " account_ref, recipient_hash, locale, consent"
)


#: The terminal phases as an SQL list, ``('accepted', …)``, from the machine's own set.
TERMINAL_SQL = "(" + ", ".join(f"'{phase}'" for phase in TERMINAL_PHASES) + ")"


#: ``ntc_`` and 24 hex digits: 11 of the wall-clock millisecond, 13 random (52 bits).
NOTICE_ID_LENGTH = 28


def new_notice_id() -> str:
    """A fresh notice id that sorts by creation time.

    Notices made close in time get neighbouring ids, so what a claimed batch touches by
    notice id (secrets, attempts, outbox messages, and the notice-id indexes of events and
    observations) shares pages: a round's commit writes a few pages per table instead of
    one per notice. The time is this host's wall clock (not a sweep's injected clock), so
    ids from several hosts sort only roughly; nothing depends on their order.
    (Ids made before schema version 4 are ``ntc_`` and 16 random hex digits.)
    """
    return f"ntc_{time.time_ns() // 1_000_000:011x}{secrets.randbits(52):013x}"


def outbox_message_id(attempt_key: str) -> str:
    """The outbox's id for the message submitted under ``attempt_key`` (one per key).

    It begins with its notice id's time digits, so a batch's messages sit together in
    the outbox's primary key; keys of older notices keep the ids they always had, so a
    resubmission across an upgrade is still the same message.
    """
    digest = hashlib.sha256(attempt_key.encode()).hexdigest()[:16]
    notice_id = attempt_key.partition(":")[0]
    if len(notice_id) == NOTICE_ID_LENGTH and notice_id.startswith("ntc_"):
        return f"obx_{notice_id[4:15]}{digest}"
    return "obx_" + digest


def event_row(step: Step, written: tuple[str, str | None] | None) -> tuple[object, ...]:
    """The event a step records: its kind and the row's phase and reason as written when
    it won, ``lost_race`` when it did not."""
    facts = step.facts
    status = getattr(facts, "status", None)
    phase, reason = written if written is not None else (step.old_phase.value, None)
    if isinstance(facts, SkippedFacts) and written is not None:
        reason = facts.why.value  # what ruled the channel out; the row keeps the decision's
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
        None if step.lane_wait is None else round(step.lane_wait, 3),
    )


def loaded_notice(row: Sequence[Any], attempts: tuple[Attempt, ...]) -> LoadedNotice:
    """A notices row (NOTICE_COLUMNS, in order) and its attempts, as the machine sees it."""
    channels = tuple(row[3].split(",")) if row[3] else ()  # none: every one ruled out
    state = NoticeState(row[0], PHASES[row[1]], row[2], channels, attempts)
    # The rest of NOTICE_COLUMNS are LoadedNotice's own fields, in its order.
    return LoadedNotice(state, *row[4:19])
