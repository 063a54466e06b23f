"""The machine's words: phases, attempt states, normalized statuses, outcomes, actions,
reasons, the facts it folds (attempts, a notice's state) and its inputs and decisions."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from resetctl.frozen import fast_init


class Phase(enum.StrEnum):
    """Where a notice is in its lifecycle (DESIGN.md)."""

    #: enqueued; nothing submitted yet
    QUEUED = "queued"
    #: the primary channel has an attempt whose outcome is still open
    PRIMARY_PENDING = "primary_pending"
    #: the fallback was claimed (compare-and-set, committed before its submission)
    FALLBACK_PENDING = "fallback_pending"
    #: a transport classified a message as accepted; terminal
    ACCEPTED = "accepted"
    #: every channel failed; terminal
    FAILED = "failed"
    #: the link died, or too little lifetime was left for the next useful action; terminal
    EXPIRED = "expired"
    #: the application said it no longer helps (the reset was used, a newer notice
    #: replaced it, or it was withdrawn); terminal
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True once the notice never moves again."""
        return self in _TERMINAL


_TERMINAL = frozenset({Phase.ACCEPTED, Phase.FAILED, Phase.EXPIRED, Phase.CANCELLED})
#: The terminal phases in declaration order (the store's SQL lists them from here).
TERMINAL_PHASES = tuple(p for p in Phase if p in _TERMINAL)
LIVE_PHASES = (Phase.QUEUED, Phase.PRIMARY_PENDING, Phase.FALLBACK_PENDING)


class AttemptState(enum.StrEnum):
    """What is known about one submission on one channel."""

    #: persisted before the transport call; the call may not have happened yet
    INTENT = "intent"
    #: the transport took the message and gave it an id
    SUBMITTED = "submitted"
    #: the transport may have taken it; never resent blindly
    AMBIGUOUS = "ambiguous"
    #: the transport refused it for good
    REJECTED = "rejected"


class Status(enum.StrEnum):
    """The normalized status vocabulary the machine reads."""

    #: the provider has it but has not said how it ended
    PENDING = "pending"
    #: the transport took it (never "a person read it")
    ACCEPTED = "accepted"
    #: the provider reports delivery to the recipient's server or handset
    DELIVERED = "delivered"
    #: the provider reports it will not arrive
    FAILED = "failed"
    #: the provider said something this transport cannot classify
    UNKNOWN = "unknown"

    @property
    def success(self) -> bool:
        """True for the statuses a policy may count as success. Whether one ends a notice
        is the policy's choice per channel (``Policy.succeeds``): an SMS that is only
        ``accepted`` (handed to a carrier) does not, by default."""
        return self in _SUCCESS

    @property
    def decisive(self) -> bool:
        """True for statuses the machine acts on (success or failure)."""
        return self in _DECISIVE


#: Members by value, for the store's row decoding (a dict lookup, where ``Status(value)``
#: goes through the enum's call machinery; a sweep decodes several per notice).
PHASES: dict[str, Phase] = {str(p): p for p in Phase}
STATUSES: dict[str, Status] = {str(s): s for s in Status}
_SUCCESS = frozenset({Status.ACCEPTED, Status.DELIVERED})
_DECISIVE = frozenset({Status.ACCEPTED, Status.DELIVERED, Status.FAILED})


def fold_status(statuses: Iterable[Status]) -> Status:
    """The latest normalized status of an attempt, from its observations in order.

    A decisive status (success or failure) is never undone by a later open one: an
    out-of-order ``pending`` after ``delivered`` is evidence, not news.
    """
    folded = Status.PENDING
    for status in statuses:
        if status.decisive or not folded.decisive:
            folded = status
    return folded


#: Attempt states by value (see PHASES).
ATTEMPT_STATES: dict[str, AttemptState] = {str(a): a for a in AttemptState}


class OutcomeKind(enum.StrEnum):
    """How a submission call ended, as the transport classified it."""

    #: the transport took the message (its first observation comes with it)
    SUBMITTED = "submitted"
    #: nothing was accepted; safe to retry under the same attempt key
    TRANSIENT = "transient"
    #: it may have been accepted; recover by key or lookup, never resend blindly
    AMBIGUOUS = "ambiguous"
    #: refused for good; the channel has failed
    PERMANENT = "permanent"
    #: the call was not made (the lease or the link ran short first): not an attempt,
    #: so it spends no retry
    DECLINED = "declined"


class ActionKind(enum.StrEnum):
    """The side effect the machine asks for."""

    #: submit on `channel` under its stable attempt key
    SUBMIT = "submit"
    #: read the provider's status of `channel`'s message
    POLL = "poll"
    #: ask the provider whether an ambiguous submission on `channel` created a message
    LOOKUP = "lookup"
    #: terminal: nothing ever again
    NONE = "none"


class Reason(enum.StrEnum):
    """Why the machine chose its decision; recorded on events, shown by inspect."""

    #: the primary has not been tried yet
    FIRST_SUBMISSION = "first_submission"
    #: a transient error; the same attempt key is tried again
    RETRY = "retry"
    #: an earlier call's outcome is unknown; the transport dedupes by key, so resubmit
    RECOVER_BY_KEY = "recover_by_key"
    #: an earlier call's outcome is unknown; look the message up at the provider
    RECOVER_BY_LOOKUP = "recover_by_lookup"
    #: two lookups a settle time apart found nothing: nothing was created, send again
    NOT_CREATED = "not_created"
    #: the next scheduled status read
    POLL_SCHEDULED = "poll_scheduled"
    #: a transport reported a success status
    ACCEPTED = "accepted"
    #: the fallback was claimed and is submitted now
    FALLBACK_SUBMISSION = "fallback_submission"
    #: the primary failed; the fallback is claimed
    PRIMARY_FAILED = "primary_failed"
    #: the primary's polls are spent with no answer; the policy escalates
    BUDGET_SPENT_ESCALATE = "budget_spent_escalate"
    #: the polls are spent with no answer; the policy (or the lack of a fallback) expires it
    BUDGET_SPENT_EXPIRE = "budget_spent_expire"
    #: a fallback would start with less than the fallback reserve left
    FALLBACK_RESERVE_NOT_MET = "fallback_reserve_not_met"
    #: a submission would start with less than the send reserve left
    NO_USEFUL_TIME = "no_useful_time"
    #: now ≥ expires_at
    LINK_EXPIRED = "link_expired"
    #: the last channel failed
    CHANNELS_EXHAUSTED = "channels_exhausted"
    #: transient errors outlasted the retry schedule
    RETRIES_EXHAUSTED = "retries_exhausted"
    #: the notice is terminal and never moves again
    TERMINAL = "terminal"
    #: cancelled: the person used the reset (the application saw the password change)
    COMPLETED = "completed"
    #: cancelled: a newer notice for the same account and region replaced it
    SUPERSEDED = "superseded"
    #: cancelled: the application or on-call withdrew it
    WITHDRAWN = "withdrawn"
    #: a channel was skipped: the policy requires consent to it and the enqueue gave none
    NO_CONSENT = "no_consent"
    #: a channel was skipped or the notice refused: the number's country is not one the
    #: policy allows (``sms.allowed_countries``)
    DESTINATION_COUNTRY = "destination_country"
    #: ... the number's type is not one the policy allows (``sms.number_types``)
    DESTINATION_TYPE = "destination_type"
    #: refused at enqueue: the recipient had ``limits.per_recipient`` notices in the window
    RATE_LIMITED = "rate_limited"
    #: an SMS was skipped: its destination country had ``limits.sms_per_country_per_hour``
    #: SMS in the last hour (the SMS-pumping signal)
    COUNTRY_CAP = "country_cap"
    #: every channel was ruled out (consent, destination) and the policy says fail
    NO_CHANNEL = "no_channel"
    #: cancelled by resetctl itself: the notice was enqueued under ``[rollout] mode =
    #: "shadow"``, and everything but the provider call ran (nothing was sent)
    SHADOW = "shadow"


#: Why a channel may be skipped (recorded on a ``skipped`` event), or a request refused.
SKIP_REASONS = (
    Reason.NO_CONSENT,
    Reason.DESTINATION_COUNTRY,
    Reason.DESTINATION_TYPE,
    Reason.COUNTRY_CAP,
)
REFUSAL_REASONS = (
    Reason.NO_CONSENT,
    Reason.DESTINATION_COUNTRY,
    Reason.DESTINATION_TYPE,
    Reason.RATE_LIMITED,
    Reason.NO_CHANNEL,
)

#: The reasons a notice may be cancelled for.
CANCEL_REASONS = (Reason.COMPLETED, Reason.SUPERSEDED, Reason.WITHDRAWN)


#: The reasons a notice expires because its time ran out (not its poll budget): what
#: health counts as "expired for lack of time" and replay as an expiry.
OUT_OF_TIME = frozenset(
    {Reason.NO_USEFUL_TIME, Reason.FALLBACK_RESERVE_NOT_MET, Reason.LINK_EXPIRED}
)


@fast_init
@dataclass(frozen=True, slots=True)
class Attempt:
    """The facts about one channel's single attempt."""

    #: the channel this attempt submits on
    channel: str
    #: `<notice_id>:<channel>:1`, passed to the transport on every call
    key: str
    #: what is known about the submission
    state: AttemptState
    #: when the first call was begun
    started_at: float
    #: when the latest call was begun
    last_call_at: float
    #: when the transport took it (or when an ambiguous call ended)
    submitted_at: float | None = None
    #: the provider's id, once known
    message_id: str | None = None
    #: submission calls begun
    calls: int = 1
    #: submission calls settled by a recorded outcome (an outcome settles all earlier calls)
    settled: int = 0
    #: status reads made
    polls: int = 0
    #: the latest normalized status, folded from the observations
    status: Status = Status.PENDING
    #: True when the transport dedupes by attempt key, so a resubmission is safe
    recoverable: bool = True
    #: when the latest status read was made (slots already past collapse into one read)
    last_read_at: float | None = None
    #: seconds between two not-found lookups; None when the transport cannot look up
    lookup_settle: float | None = None
    #: not-found lookups since the latest call
    lookups: int = 0
    #: when the first of those lookups was made
    first_lookup_at: float | None = None
    #: the host's monotonic reading when the latest call began (``boot@seconds``), so a
    #: wall-clock step cannot shorten the wait before a lookup may prove anything
    call_mono: str | None = None
    #: the monotonic reading of the first not-found lookup (``boot@seconds``)
    lookup_mono: str | None = None
    #: when lookups began failing (the read itself) with no answer since; None otherwise
    lookup_failing_since: float | None = None
    #: the provider instance its latest call went to (reads and lookups go there too)
    instance: str | None = None

    @property
    def in_doubt(self) -> bool:
        """A call was begun whose outcome was never recorded (its worker died)."""
        return self.calls > self.settled

    @property
    def doubtful(self) -> bool:
        """The call may have reached the provider and nothing has proved either way: a
        lost reply (ambiguous), a crash after the intent (in doubt), or a lost race.

        The one definition the machine and the store share. A doubt ends only when a
        lookup finds the message, a callback names it, or two not-found lookups
        ``lookup_settle`` apart, both made once the provider could have listed it,
        prove that nothing was created (``state`` is then ``intent`` with every call
        settled)."""
        return self.state is AttemptState.AMBIGUOUS or self.calls > self.settled


@fast_init
@dataclass(frozen=True, slots=True)
class NoticeState:
    """What the machine sees of a notice: timing, phase, channel order, attempts."""

    #: the notice's id (not a secret; it sorts by creation time)
    notice_id: str
    #: current phase
    phase: Phase
    #: absolute link expiry, seconds since the epoch
    expires_at: float
    #: delivery order for this notice (policy order, limited to the contacts it has)
    channels: tuple[str, ...]
    #: at most one per channel
    attempts: tuple[Attempt, ...] = ()

    def attempt(self, channel: str) -> Attempt | None:
        """The attempt on ``channel``, if one was begun."""
        for attempt in self.attempts:
            if attempt.channel == channel:
                return attempt
        return None

    def with_attempt(self, attempt: Attempt) -> NoticeState:
        """A copy with ``attempt`` added or replacing the one on its channel."""
        others = tuple(a for a in self.attempts if a.channel != attempt.channel)
        return NoticeState(
            self.notice_id, self.phase, self.expires_at, self.channels, (*others, attempt)
        )

    def without_attempt(self, channel: str) -> NoticeState:
        """A copy with no attempt on ``channel`` (a first call that was never made)."""
        others = tuple(a for a in self.attempts if a.channel != channel)
        return NoticeState(self.notice_id, self.phase, self.expires_at, self.channels, others)


@dataclass(frozen=True, slots=True)
class Tick:
    """A sweep looks at the notice; nothing new is known."""


@fast_init
@dataclass(frozen=True, slots=True)
class SubmissionStarted:
    """The intent to call the transport, persisted before the call."""

    #: the channel being submitted
    channel: str
    #: the stable attempt key
    attempt_key: str
    #: whether that transport dedupes by key
    recoverable: bool
    #: the transport's lookup settle time, when it can look up what it sent
    lookup_settle: float | None = None
    #: the host's monotonic reading at the call (``boot@seconds``; see ``Attempt``)
    mono: str | None = None
    #: the provider instance the call goes to
    instance: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class SubmissionOutcome:
    """How a submission call ended."""

    #: the channel that was submitted
    channel: str
    #: the transport's classification
    kind: OutcomeKind
    #: the provider's message id (SUBMITTED only)
    message_id: str | None = None
    #: the first status the transport reported with its acceptance
    status: Status | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Observed:
    """A status observation of a channel's message, from a poll or a callback."""

    #: the channel whose attempt this is about
    channel: str
    #: the normalized status
    status: Status
    #: True when this was a status read that spends the poll budget
    is_poll: bool
    #: the provider's id, when the report names it (a callback for an attempt whose
    #: submission reply was lost proves the message exists)
    message_id: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class LookedUp:
    """The provider was asked whether an ambiguous submission created a message."""

    #: the channel whose attempt this is about
    channel: str
    #: the provider's id when it found the message; None when it has no such message
    message_id: str | None
    #: the found message's normalized status
    status: Status | None = None
    #: the read itself failed: it proves nothing either way
    failed: bool = False
    #: the host's monotonic reading at the lookup (``boot@seconds``; see ``Attempt``)
    mono: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Cancelled:
    """The application (or on-call) says the notice no longer helps; or, with ``SHADOW``,
    resetctl ends a shadow notice at its would-send."""

    #: one of CANCEL_REASONS, or Reason.SHADOW (resetctl's own, never a caller's)
    why: Reason


@fast_init
@dataclass(frozen=True, slots=True)
class ChannelSkipped:
    """A rule rules a channel out just before its first submission (its destination
    country's SMS cap is full): the notice goes on without it, never having tried it."""

    #: the channel ruled out
    channel: str
    #: one of SKIP_REASONS
    why: Reason


Event = (
    Tick | SubmissionStarted | SubmissionOutcome | Observed | LookedUp | Cancelled | ChannelSkipped
)


@fast_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The next phase, the side effect to perform, and when.

    A SUBMIT decision's phase is the one recorded with the submission's intent:
    ``primary_pending`` or, for the fallback, ``fallback_pending`` (the claim).
    """

    #: the phase to record
    phase: Phase
    #: the side effect
    action: ActionKind
    #: the channel the action concerns
    channel: str | None
    #: when to perform it (None once terminal)
    due_at: float | None
    #: why
    reason: Reason

    def due(self, now: float) -> bool:
        """True when the action should be performed at ``now``."""
        return self.action is not ActionKind.NONE and self.due_at is not None and self.due_at <= now


def attempt_key(notice_id: str, channel: str) -> str:
    """The stable key of a notice's attempt on a channel (one attempt per channel)."""
    return f"{notice_id}:{channel}:1"
