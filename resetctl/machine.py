"""The one transition function and the phase vocabulary.

``transition(state, policy, event, now)`` folds one new input (a tick, a submission
outcome, a poll result or a callback) into a notice's facts and decides the next phase,
the side effect to perform and when. It reads no clock, database, network, environment
or log: ``sweep``, callback ingestion and ``replay`` all call it, and none of them holds a
copy of these rules.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from resetctl.config import OnBudgetSpent, Policy
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

    @property
    def terminal(self) -> bool:
        """True once the notice never moves again."""
        return self in _TERMINAL


_TERMINAL = frozenset({Phase.ACCEPTED, Phase.FAILED, Phase.EXPIRED})
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


Event = Tick | SubmissionStarted | SubmissionOutcome | Observed | LookedUp


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


def apply(state: NoticeState, event: Event, now: float) -> NoticeState:
    """Fold ``event``'s facts into ``state``. Facts are kept even on a terminal notice."""
    if isinstance(event, Tick):
        return state
    if isinstance(event, SubmissionStarted):
        current = state.attempt(event.channel)
        if current is None:
            started = Attempt(
                channel=event.channel,
                key=event.attempt_key,
                state=AttemptState.INTENT,
                started_at=now,
                last_call_at=now,
                recoverable=event.recoverable,
                lookup_settle=event.lookup_settle,
                call_mono=event.mono,
            )
        else:
            # A new call: lookups answer for the latest call only.
            started = _evolve(
                current,
                calls=current.calls + 1,
                last_call_at=now,
                lookups=0,
                first_lookup_at=0.0,
                call_mono=event.mono or "",
                lookup_mono="",
                lookup_failing_since=0.0,
            )
        return state.with_attempt(started)
    current = state.attempt(event.channel)
    if current is None:
        return state
    if isinstance(event, SubmissionOutcome):
        if event.kind is OutcomeKind.DECLINED:
            return _decline(state, current)
        return state.with_attempt(_settle(current, event, now))
    if isinstance(event, LookedUp):
        return state.with_attempt(_looked_up(current, event, now))
    if event.message_id is not None and current.state in _UNSETTLED:
        current = _evolve(
            current,
            state=AttemptState.SUBMITTED,
            settled=current.calls,
            submitted_at=current.submitted_at or current.last_call_at,
            message_id=current.message_id or event.message_id,
            lookups=0,
            first_lookup_at=0.0,
            lookup_mono="",
            lookup_failing_since=0.0,
        )
    observed = _evolve(
        current,
        polls=current.polls + (1 if event.is_poll else 0),
        status=fold_status((current.status, event.status)),
        last_read_at=now if event.is_poll else None,
    )
    return state.with_attempt(observed)


_UNSETTLED = frozenset({AttemptState.INTENT, AttemptState.AMBIGUOUS})
_SETTLED = frozenset({AttemptState.SUBMITTED, AttemptState.REJECTED})


def _settle(current: Attempt, event: SubmissionOutcome, now: float) -> Attempt:
    """The outcome under this key settles every call made with it, including one whose
    worker died before recording it: the transport answered for the key."""
    if event.kind is OutcomeKind.SUBMITTED:
        statuses = (current.status, event.status) if event.status else (current.status,)
        return _evolve(
            current,
            settled=current.calls,
            state=AttemptState.SUBMITTED,
            submitted_at=current.submitted_at or now,
            message_id=event.message_id or current.message_id,
            status=fold_status(statuses),
        )
    if event.kind is OutcomeKind.AMBIGUOUS:
        if current.state in _SETTLED:
            # A stale worker's late reply never undoes what a lookup or callback proved.
            return _evolve(current, settled=current.calls)
        return _evolve(
            current, settled=current.calls, state=AttemptState.AMBIGUOUS, submitted_at=now
        )
    if event.kind is OutcomeKind.PERMANENT:
        return _evolve(
            current, settled=current.calls, state=AttemptState.REJECTED, status=Status.FAILED
        )
    return _evolve(current, settled=current.calls)


def _decline(state: NoticeState, current: Attempt) -> NoticeState:
    """Undo the intent of a call that was never made: it is not an attempt."""
    if current.calls <= 1 and current.state is AttemptState.INTENT and current.settled == 0:
        return state.without_attempt(current.channel)
    calls = current.calls - 1
    return state.with_attempt(_evolve(current, calls=calls, settled=min(current.settled, calls)))


def _looked_up(current: Attempt, event: LookedUp, now: float) -> Attempt:
    """Fold a lookup's answer (see ``Attempt.doubtful``).

    Found settles the attempt as submitted. A not-found answer counts only once the
    provider could have listed the message (``lookup_settle`` after the latest call);
    a second one at least the settle time after the first proves nothing was created.
    Both intervals are measured on the wall clock and, on the same boot, on the host's
    monotonic clock too, so a clock step cannot shorten them. A failed read proves
    nothing and starts (or continues) a run of failures.
    """
    settle = current.lookup_settle
    if settle is None:
        return current
    if event.failed:
        # Proves nothing, but it was a read: the next one waits the settle time.
        since = current.lookup_failing_since
        return _evolve(current, last_read_at=now, lookup_failing_since=since or now)
    if event.message_id is not None:
        status = fold_status((current.status, event.status or Status.PENDING))
        return _evolve(
            current,
            state=AttemptState.SUBMITTED,
            settled=current.calls,
            submitted_at=current.submitted_at or current.last_call_at,
            message_id=event.message_id,
            status=status,
            last_read_at=now,
            lookups=0,
            first_lookup_at=0.0,
            lookup_mono="",
            lookup_failing_since=0.0,
        )
    if not current.doubtful:
        return _evolve(current, last_read_at=now)  # already settled: nothing to prove
    if elapsed(current.last_call_at, current.call_mono, now, event.mono) < settle:
        # Too soon after the call for the provider's list to show it: proves nothing.
        return _evolve(current, last_read_at=now, lookup_failing_since=0.0)
    first = current.first_lookup_at
    if current.lookups == 0 or first is None:
        return _evolve(
            current,
            lookups=1,
            first_lookup_at=now,
            lookup_mono=event.mono or "",
            last_read_at=now,
            lookup_failing_since=0.0,
        )
    if elapsed(first, current.lookup_mono, now, event.mono) < settle:
        # Too soon after the first to prove anything.
        return _evolve(current, last_read_at=now, lookup_failing_since=0.0)
    # Nothing was created: the attempt is an intent whose calls all settled, which the
    # retry rules treat like a transient failure (the same key may be sent again).
    return _evolve(
        current,
        state=AttemptState.INTENT,
        settled=current.calls,
        lookups=current.lookups + 1,
        last_read_at=now,
        lookup_failing_since=0.0,
    )


def monotonic_reading(boot: str, seconds: float) -> str:
    """A host's monotonic clock reading as the machine stores it: ``boot@seconds``."""
    return f"{boot}@{seconds:.3f}"


def elapsed(since: float, since_mono: str | None, now: float, mono: str | None) -> float:
    """Seconds from ``since`` to ``now``: the wall-clock difference, or less when both
    moments carry monotonic readings from the same boot that say less (a clock stepped
    forward in between). A step back only ever makes a wait longer."""
    wall = now - since
    if since_mono and mono:
        boot, _, at = since_mono.rpartition("@")
        boot_now, _, at_now = mono.rpartition("@")
        if boot and boot == boot_now:
            try:
                return min(wall, float(at_now) - float(at))
            except ValueError:
                return wall
    return wall


def _evolve(
    attempt: Attempt,
    *,
    state: AttemptState | None = None,
    last_call_at: float | None = None,
    submitted_at: float | None = None,
    message_id: str | None = None,
    calls: int | None = None,
    settled: int | None = None,
    polls: int | None = None,
    status: Status | None = None,
    last_read_at: float | None = None,
    lookups: int | None = None,
    first_lookup_at: float | None = None,
    call_mono: str | None = None,
    lookup_mono: str | None = None,
    lookup_failing_since: float | None = None,
) -> Attempt:
    """A copy with the given facts changed (None keeps a fact; ``0.0`` clears
    ``first_lookup_at`` and ``lookup_failing_since``, ``""`` clears a monotonic reading):
    dataclasses.replace, but without its per-call field introspection, which dominated
    replay's profile."""
    if first_lookup_at is None:
        first_lookup_at = attempt.first_lookup_at
    elif first_lookup_at == 0.0:
        first_lookup_at = None
    if lookup_failing_since is None:
        lookup_failing_since = attempt.lookup_failing_since
    elif lookup_failing_since == 0.0:
        lookup_failing_since = None
    return Attempt(
        attempt.channel,
        attempt.key,
        attempt.state if state is None else state,
        attempt.started_at,
        attempt.last_call_at if last_call_at is None else last_call_at,
        attempt.submitted_at if submitted_at is None else submitted_at,
        attempt.message_id if message_id is None else message_id,
        attempt.calls if calls is None else calls,
        attempt.settled if settled is None else settled,
        attempt.polls if polls is None else polls,
        attempt.status if status is None else status,
        attempt.recoverable,
        attempt.last_read_at if last_read_at is None else last_read_at,
        attempt.lookup_settle,
        attempt.lookups if lookups is None else lookups,
        first_lookup_at,
        attempt.call_mono if call_mono is None else (call_mono or None),
        attempt.lookup_mono if lookup_mono is None else (lookup_mono or None),
        lookup_failing_since,
    )


def transition(
    state: NoticeState, policy: Policy, event: Event, now: float
) -> tuple[NoticeState, Decision]:
    """Fold ``event`` into ``state`` and decide what happens next.

    The returned state carries the decision's phase, as the caller will record it.
    """
    folded = apply(state, event, now)
    decision = decide(folded, policy, now)
    if decision.phase is folded.phase:
        return folded, decision
    phased = NoticeState(
        folded.notice_id, decision.phase, folded.expires_at, folded.channels, folded.attempts
    )
    return phased, decision


def decide(state: NoticeState, policy: Policy, now: float) -> Decision:
    """DESIGN.md's decision table over the notice's current facts."""
    decision = _decide(state, policy, now)
    if state.phase is Phase.FALLBACK_PENDING:
        return _read_primary_too(state, policy, decision, now)
    return decision


def _decide(state: NoticeState, policy: Policy, now: float) -> Decision:
    if state.phase.terminal:
        return Decision(state.phase, ActionKind.NONE, None, None, Reason.TERMINAL)
    if any(policy.succeeds(a.channel, a.status) for a in state.attempts):
        # Whichever channel it was (a late primary receipt after the fallback claim
        # included), and however little time is left, a status that counts as success on
        # that channel was seen.
        return _end(Phase.ACCEPTED, Reason.ACCEPTED)
    if now >= state.expires_at:
        return _end(Phase.EXPIRED, Reason.LINK_EXPIRED)

    on_fallback = state.phase is Phase.FALLBACK_PENDING
    slot = 1 if on_fallback else 0
    channel = state.channels[slot]
    fallback = state.channels[1] if not on_fallback and len(state.channels) > 1 else None
    phase = Phase.FALLBACK_PENDING if on_fallback else Phase.PRIMARY_PENDING
    reserve = policy.fallback_reserve if on_fallback else policy.send_reserve
    remaining = state.expires_at - now
    attempt = state.attempt(channel)

    def give_up(reason: Reason) -> Decision:
        """The channel in use is done: claim the fallback, or the channels are exhausted."""
        if fallback is not None:
            return _claim_fallback(fallback, policy, remaining, now, reason)
        return _end(Phase.FAILED, Reason.CHANNELS_EXHAUSTED)

    def budget_spent() -> Decision:
        if policy.on_poll_budget_spent is OnBudgetSpent.EXPIRE or fallback is None:
            return _end(Phase.EXPIRED, Reason.BUDGET_SPENT_EXPIRE)
        return give_up(Reason.BUDGET_SPENT_ESCALATE)

    if attempt is None:
        if remaining <= reserve:
            short = Reason.FALLBACK_RESERVE_NOT_MET if on_fallback else Reason.NO_USEFUL_TIME
            return _end(Phase.EXPIRED, short)
        why = Reason.FALLBACK_SUBMISSION if on_fallback else Reason.FIRST_SUBMISSION
        return Decision(phase, ActionKind.SUBMIT, channel, now, why)

    # Evidence first: a status observed for the message settles it whatever the
    # submission's own outcome said (a callback can outrun a lost response).
    if attempt.status is Status.FAILED or attempt.state is AttemptState.REJECTED:
        return give_up(Reason.PRIMARY_FAILED)
    if attempt.state is AttemptState.SUBMITTED:
        return _next_poll(state, policy, attempt, phase, fallback, budget_spent, now)

    retries_used = attempt.calls - 1
    if attempt.doubtful:
        # The message may exist. Resubmitting is safe only under a key the transport
        # dedupes by; a transport that can find what it sent looks it up until the doubt
        # is resolved; a doubt nothing can resolve is a spent poll budget at once, and
        # the policy chooses, as for an unanswered message (the doubt stays recorded).
        if attempt.recoverable:
            due: float | None = None
            if attempt.in_doubt and attempt.state is AttemptState.INTENT:
                due = now  # the worker died mid-call
            elif retries_used < len(policy.retry_delays):
                due = max(now, attempt.started_at + policy.retry_delays[retries_used])
            if due is not None and state.expires_at - due > reserve:
                return Decision(phase, ActionKind.SUBMIT, channel, due, Reason.RECOVER_BY_KEY)
            return budget_spent()
        look_at = _next_lookup(attempt, now)
        if look_at is None or look_at >= _read_deadline(state, policy, fallback, now):
            return budget_spent()
        return Decision(phase, ActionKind.LOOKUP, channel, look_at, Reason.RECOVER_BY_LOOKUP)
    # An intent after transient errors (or after lookups proved nothing was created):
    # nothing was accepted, so retrying (or moving on to the fallback) can never send twice.
    if retries_used >= len(policy.retry_delays):
        return give_up(Reason.RETRIES_EXHAUSTED)
    retry_at = max(now, attempt.started_at + policy.retry_delays[retries_used])
    if state.expires_at - retry_at <= reserve:
        if fallback is not None:
            return give_up(Reason.RETRIES_EXHAUSTED)
        return _end(Phase.EXPIRED, Reason.NO_USEFUL_TIME)
    why = Reason.NOT_CREATED if attempt.lookups >= 2 else Reason.RETRY
    return Decision(phase, ActionKind.SUBMIT, channel, retry_at, why)


def _next_lookup(attempt: Attempt, now: float) -> float | None:
    """When to look a doubtful attempt up next; None when no lookup can resolve it (the
    transport cannot look up, or its lookups have kept failing for two settle times).

    The first lookup goes at once (it may find the message); each later one a settle
    time after the previous read, and no earlier than the provider could have listed
    the message, so that a not-found answer counts.
    """
    settle = attempt.lookup_settle
    if settle is None:
        return None
    failing = attempt.lookup_failing_since
    if failing is not None and now >= failing + 2 * settle:
        return None
    read = attempt.last_read_at
    if read is None or read < attempt.last_call_at:
        return now
    return max(now, read + settle, attempt.last_call_at + settle)


def _end(phase: Phase, reason: Reason) -> Decision:
    return Decision(phase, ActionKind.NONE, None, None, reason)


def _claim_fallback(
    fallback: str, policy: Policy, remaining: float, now: float, reason: Reason
) -> Decision:
    if remaining <= policy.fallback_reserve:
        return _end(Phase.EXPIRED, Reason.FALLBACK_RESERVE_NOT_MET)
    return Decision(Phase.FALLBACK_PENDING, ActionKind.SUBMIT, fallback, now, reason)


def _read_deadline(state: NoticeState, policy: Policy, fallback: str | None, now: float) -> float:
    """The last moment worth waiting for a status read or a budget's end.

    While an escalation is still possible, that is the moment the fallback stops being
    worth sending: a later answer could no longer change anything, so the budget counts
    as spent now. Once no fallback can follow, reads stay useful until the link dies
    (they can still tell that the message was accepted).
    """
    if fallback is not None and policy.on_poll_budget_spent is OnBudgetSpent.ESCALATE:
        fallback_deadline = state.expires_at - policy.fallback_reserve
        if now < fallback_deadline:
            return fallback_deadline
    return state.expires_at


def _next_poll(
    state: NoticeState,
    policy: Policy,
    attempt: Attempt,
    phase: Phase,
    fallback: str | None,
    budget_spent: Callable[[], Decision],
    now: float,
) -> Decision:
    delays = policy.polls_for(attempt.channel)
    if attempt.polls >= len(delays):
        return budget_spent()
    submitted = attempt.submitted_at if attempt.submitted_at is not None else attempt.started_at
    # A late sweep reads once: slots that passed before the latest read are spent.
    last_read = attempt.last_read_at
    poll_at = None
    for delay in delays[attempt.polls :]:
        if last_read is None or submitted + delay > last_read:
            poll_at = submitted + delay
            break
    if poll_at is None:
        return budget_spent()
    if poll_at >= _read_deadline(state, policy, fallback, now):
        # The schedule cannot fit in this notice's lifetime: waiting for a read that
        # can no longer change anything only burns link time.
        return budget_spent()
    return Decision(phase, ActionKind.POLL, attempt.channel, poll_at, Reason.POLL_SCHEDULED)


def _read_primary_too(
    state: NoticeState, policy: Policy, decision: Decision, now: float
) -> Decision:
    """After an escalation the primary keeps its remaining poll slots, as evidence only.

    A success it reports later still ends the notice (success on any channel does), so it
    never sends a second message or reopens anything; what it adds is the observation
    "fallback followed by a late primary success", which health counts and export-timings
    carries to replay. The fallback's own action goes first whenever it is due as soon.
    """
    if decision.phase.terminal or decision.due_at is None or decision.due_at <= now:
        return decision
    primary = state.attempt(state.channels[0])
    if (
        primary is None
        or primary.state is not AttemptState.SUBMITTED
        or primary.message_id is None
        or primary.status.decisive
    ):
        return decision
    delays = policy.polls_for(primary.channel)
    submitted = primary.submitted_at if primary.submitted_at is not None else primary.started_at
    last_read = primary.last_read_at
    for delay in delays[primary.polls :]:
        slot = submitted + delay
        if last_read is None or slot > last_read:
            if slot < decision.due_at and slot < state.expires_at:
                return Decision(
                    decision.phase, ActionKind.POLL, primary.channel, slot, Reason.POLL_SCHEDULED
                )
            break
    return decision


@dataclass(frozen=True, slots=True)
class Budget:
    """How a live notice's remaining lifetime compares with what its next action needs:
    the one answer to "what next, by when, is it still possible, is it at risk" that
    ``inspect``, ``alerts``, ``health`` and the metrics read."""

    #: the decision the machine would take now
    decision: Decision
    #: seconds of link lifetime left
    remaining: float
    #: seconds of lifetime the next action needs from now: the wait until it is due, plus
    #: the reserve it must still find (the send or fallback reserve, or none for a read
    #: that can no longer lead to a fallback); infinite when the next sweep ends the
    #: notice without success
    needed: float
    #: the next action can still change the outcome: a submission, or a read that can
    #: still lead to a fallback
    helps: bool = True
    #: the policy's warning margin (``alert_warning``)
    warning: float = 0.0
    #: the channel a fallback would use, if the notice has one
    fallback: str | None = None
    #: the last moment a fallback still finds its reserve (None without a fallback)
    fallback_deadline: float | None = None
    #: a fallback can still be started (claimed) before its deadline
    fallback_possible: bool = False
    #: when the budget was worked out (the ``now`` it was asked at)
    at: float = 0.0

    @property
    def margin(self) -> float:
        """Seconds to spare: remaining less needed."""
        return self.remaining - self.needed

    @property
    def at_risk(self) -> bool:
        """True when the margin is within the policy's warning (or gone): the notice
        may not be delivered before its link dies. ``alerts`` lists exactly these."""
        return self.decision.phase is not Phase.ACCEPTED and self.margin <= self.warning

    @property
    def actionable(self) -> bool:
        """True when someone acting now (restarting a sweeper) can still save it."""
        return self.helps and self.margin > 0

    @property
    def level(self) -> str:
        """``critical`` while a useful action is overdue (the sweeper is not taking it)
        and can still land; ``warning`` when at risk otherwise; ``ok``."""
        if not self.at_risk:
            return "ok"
        overdue = self.decision.due_at is not None and self.decision.due_at <= self.at
        return "critical" if self.actionable and overdue else "warning"


def budget(state: NoticeState, policy: Policy, now: float) -> Budget | None:
    """The deadline budget of a live notice (None once it is terminal)."""
    if state.phase.terminal:
        return None
    decision = decide(state, policy, now)
    remaining = state.expires_at - now
    fallback = state.channels[1] if len(state.channels) > 1 else None
    deadline = state.expires_at - policy.fallback_reserve if fallback else None
    possible = bool(
        fallback is not None
        and deadline is not None
        and state.phase is not Phase.FALLBACK_PENDING
        and state.attempt(fallback) is None
        and now < deadline
    )

    def answer(needed: float, helps: bool) -> Budget:
        return Budget(
            decision, remaining, needed, helps, policy.alert_warning, fallback, deadline,
            possible, now,
        )  # fmt: skip

    if decision.phase.terminal:
        # The next sweep will end it: nothing it still needs can happen in time.
        needed = math.inf if decision.phase is not Phase.ACCEPTED else 0.0
        return answer(needed, helps=False)
    assert decision.due_at is not None
    wait = max(0.0, decision.due_at - now)
    on_fallback = decision.phase is Phase.FALLBACK_PENDING
    if decision.action is ActionKind.SUBMIT:
        reserve = policy.fallback_reserve if on_fallback else policy.send_reserve
        helps = True
    elif not on_fallback and fallback is not None:
        # A read can still turn up a failure (or a spent budget), and so a fallback,
        # but only while the fallback reserve is left when it lands.
        reserve, helps = policy.fallback_reserve, True
    else:
        # Nothing can follow the read: it can only tell what already happened.
        reserve, helps = 0.0, False
    return answer(wait + reserve, helps)
