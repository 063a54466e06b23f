"""DESIGN.md's decision table: from a notice's facts, its policy and ``now``, the next
phase, the side effect and when."""

from __future__ import annotations

from collections.abc import Callable

from resetctl.machine.facts import apply
from resetctl.machine.vocabulary import (
    ActionKind,
    Attempt,
    AttemptState,
    Cancelled,
    ChannelSkipped,
    Decision,
    Event,
    NoticeState,
    Phase,
    Reason,
    Status,
)
from resetctl.policy import OnBudgetSpent, Policy


def transition(
    state: NoticeState, policy: Policy, event: Event, now: float
) -> tuple[NoticeState, Decision]:
    """Fold ``event`` into ``state`` and decide what happens next.

    The returned state carries the decision's phase, as the caller will record it. A
    cancel ends a live notice whatever its facts say; a terminal one stays as it is.
    """
    folded = apply(state, event, now)
    if isinstance(event, Cancelled) and not folded.phase.terminal:
        decision = _end(Phase.CANCELLED, event.why)
    elif isinstance(event, ChannelSkipped) and not folded.channels and not folded.phase.terminal:
        decision = _end(Phase.FAILED, event.why)
    else:
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
    if not state.channels:  # every channel was ruled out
        return _end(Phase.FAILED, Reason.NO_CHANNEL)

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
