"""Folding one input into a notice's facts: a call begun, its outcome, a status read or
callback, a lookup's answer. When a doubt ends is decided here."""

from __future__ import annotations

from resetctl.machine.vocabulary import (
    Attempt,
    AttemptState,
    Cancelled,
    ChannelSkipped,
    Event,
    LookedUp,
    NoticeState,
    OutcomeKind,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
    Tick,
    fold_status,
)


def apply(state: NoticeState, event: Event, now: float) -> NoticeState:
    """Fold ``event``'s facts into ``state``. Facts are kept even on a terminal notice."""
    if isinstance(event, Tick | Cancelled):
        return state
    if isinstance(event, ChannelSkipped):
        if state.attempt(event.channel) is not None:
            return state  # a channel already tried is not skipped: its attempt stands
        left = tuple(c for c in state.channels if c != event.channel)
        return NoticeState(state.notice_id, state.phase, state.expires_at, left, state.attempts)
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
                instance=event.instance,
            )
        else:
            # A new call: lookups answer for the latest call only, and the attempt is
            # bound to the instance that makes it (what it dedupes by and can look up).
            started = _evolve(
                current,
                calls=current.calls + 1,
                last_call_at=now,
                lookups=0,
                first_lookup_at=0.0,
                call_mono=event.mono or "",
                lookup_mono="",
                lookup_failing_since=0.0,
                bound=None
                if event.instance is None
                else (event.instance, event.recoverable, event.lookup_settle),
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
    bound: tuple[str | None, bool, float | None] | None = None,
) -> Attempt:
    """A copy with the given facts changed (None keeps a fact; ``0.0`` clears
    ``first_lookup_at`` and ``lookup_failing_since``, ``""`` clears a monotonic reading):
    dataclasses.replace, but without its per-call field introspection, which dominated
    replay's profile. ``bound`` sets (instance, recoverable, lookup_settle) together."""
    instance, recoverable, settle = (
        (attempt.instance, attempt.recoverable, attempt.lookup_settle) if bound is None else bound
    )
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
        recoverable,
        attempt.last_read_at if last_read_at is None else last_read_at,
        settle,
        attempt.lookups if lookups is None else lookups,
        first_lookup_at,
        attempt.call_mono if call_mono is None else (call_mono or None),
        attempt.lookup_mono if lookup_mono is None else (lookup_mono or None),
        lookup_failing_since,
        instance,
    )
