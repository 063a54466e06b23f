"""Folding what a call brought back into its notice: each result through the machine,
as the facts the store writes. One thread (the sweep's) runs these; nothing here calls
a provider or the database."""

from __future__ import annotations

from resetctl import calls, machine
from resetctl.calls import CallResult
from resetctl.machine import (
    AttemptState,
    ChannelSkipped,
    Decision,
    LookedUp,
    Observed,
    OutcomeKind,
    Reason,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
)
from resetctl.store import (
    DeclinedFacts,
    IntentFacts,
    LookupFacts,
    ObservationFacts,
    OutcomeFacts,
    SkippedFacts,
    Step,
    StepKind,
)
from resetctl.summary import SweepSummary
from resetctl.telemetry import LOGGER
from resetctl.transports.base import PermanentError, ThrottledError, Transport, TransportError
from resetctl.work import Held, Job, NotCalled, Pending, SendProgress


def tick_of(held: Held, decision: Decision, now: float) -> Pending:
    """A decision recorded with nothing called (and the lease handed back)."""
    return Pending(held, held.state, decision, None, StepKind.TICK, decision.channel, now)


def deferred_of(held: Held, decision: Decision, until: float, now: float) -> Pending:
    """A due action whose provider instance is out of use until ``until``: recorded due
    then, the lease handed back, so the sweep goes on with other work meanwhile (the
    machine decides again when it is claimed next)."""
    later = Decision(
        decision.phase, decision.action, decision.channel, max(until, now), decision.reason
    )
    return tick_of(held, later, now)


def skipped_of(held: Held, channel: str, why: Reason, now: float) -> Pending:
    """A channel ruled out just before its first submission: the notice goes on by the
    channels left, from the phase it is in (the next round decides its submission), or
    ends when none is left."""
    event = ChannelSkipped(channel, why)
    state, decision = machine.transition(held.state, held.policy, event, now)
    if not decision.phase.terminal:
        state = machine.apply(held.state, event, now)
        decision = Decision(
            state.phase, decision.action, decision.channel, decision.due_at, decision.reason
        )
    facts = SkippedFacts(channel, why, state.channels)
    return Pending(held, state, decision, facts, StepKind.SKIPPED, channel, now)


def intent_of(job: Job, transport: Transport, now: float, mono: str | None) -> Pending:
    """A submission's intent, as committed before its call: what was rendered, and what
    a lookup will need to recognise it."""
    held, policy = job.held, job.held.policy
    assert job.rendered is not None
    settle = calls.lookup_settle(transport)
    instance = job.instance or transport.name
    started = SubmissionStarted(
        job.channel, job.key, transport.recovers_by_key, settle, mono, instance
    )
    facts = IntentFacts(
        job.key,
        job.channel,
        instance,
        policy.template_version,
        job.rendered.segments,
        transport.recovers_by_key,
        settle,
        job.rendered.locale,
        calls.fingerprint(transport, job.rendered.message),
        mono,
        sms_encoding(job),
    )
    state = machine.apply(held.state, started, now)
    return Pending(held, state, job.decision, facts, StepKind.INTENT, job.channel, now, job.waited)


def sms_encoding(job: Job) -> str | None:
    """The encoding of the SMS a submission sends (None for email)."""
    message = job.rendered.message if job.rendered is not None else None
    return None if message is None or message.sms is None else message.sms.encoding.value


def deadline_of(held: Held, decision: Decision) -> float:
    """When the notice's next useful action stops being useful: what lanes order by."""
    return machine.action_deadline(held.state, held.policy, decision)


def step_of(pending: Pending, worker: str) -> Step:
    """The store's record of a step: its facts, and its decision as a compare-and-set."""
    held, decision, channel = pending.held, pending.decision, pending.channel
    attempt = pending.state.attempt(channel) if channel else None
    keep_lease = decision.due(pending.now) and pending.kind is not StepKind.TICK
    return Step(
        notice_id=held.state.notice_id,
        version=held.version,
        lease_token=held.claim.lease_token,
        old_phase=held.state.phase,
        decision=decision,
        release=not keep_lease,
        facts=pending.facts,
        kind=pending.kind,
        worker=worker,
        now=pending.now,
        polls=attempt.polls if attempt else None,
        channel=channel,
        lane_wait=pending.lane_wait,
    )


def message_id_of(job: Job) -> str:
    """The provider id of the message a poll reads."""
    attempt = job.held.state.attempt(job.channel)
    assert attempt is not None
    assert attempt.message_id is not None
    return attempt.message_id


def fold_submit(
    job: Job,
    result: CallResult,
    summary: SweepSummary,
    progress: SendProgress | None,
    submitted_notices: set[str],
) -> Pending:
    """A submission's outcome folded into its notice, as the transport classified it."""
    held, channel, key = job.held, job.channel, job.key
    assert job.rendered is not None
    reply = result.reply
    error: str | None = job.rendered.error
    kind = OutcomeKind.PERMANENT
    exc = result.error
    if job.rendered.message is not None:
        if exc is None:
            kind = OutcomeKind.SUBMITTED
            summary.submitted += 1
            submitted_notices.add(held.state.notice_id)
        elif isinstance(exc, NotCalled):
            kind, error = OutcomeKind.DECLINED, f"declined: not called ({exc})"
            summary.declined += 1
        elif isinstance(exc, ThrottledError):
            # Refused unread: nothing was created, and it is not an attempt.
            kind, error = OutcomeKind.DECLINED, "declined: the provider throttled it"
            if progress is not None:
                progress.throttled.add(held.state.notice_id)
        elif isinstance(exc, TransportError):
            kind = OutcomeKind(exc.kind)
            # A plugin's message might quote what it was given: never let it out.
            error = f"{exc.kind}: {calls.redact(str(exc), job.contact)}"
        else:  # a transport bug may have sent it
            kind = OutcomeKind.AMBIGUOUS
            error = f"ambiguous: unexpected {type(exc).__name__}"
    if progress is not None:
        progress.calls[held.state.notice_id] = kind
    if error is not None and kind is not OutcomeKind.DECLINED:
        summary.errors += 1
        notice_id = held.state.notice_id
        LOGGER.warning("notice %s: %s submission failed (%s)", notice_id, channel, error)
    now = result.ended_at
    outcome = SubmissionOutcome(
        channel,
        kind,
        message_id=reply.message_id if reply else None,
        status=reply.status if reply else None,
    )
    state, decision = machine.transition(held.state, held.policy, outcome, now)
    if kind is OutcomeKind.DECLINED:
        return Pending(
            held,
            state,
            decision,
            DeclinedFacts(key, sms_encoding(job)),
            StepKind.DECLINED,
            channel,
            now,
        )
    facts = OutcomeFacts(
        key,
        _ATTEMPT_STATE[kind],
        reply.message_id if reply else None,
        reply.raw_status if reply else None,
        reply.status if reply else None,
        error,
    )
    return Pending(held, state, decision, facts, StepKind.OUTCOME, channel, now)


def fold_poll(
    job: Job, result: CallResult, transport: Transport | None, summary: SweepSummary
) -> Pending:
    """A status read folded into its notice, as of the moment it was read."""
    held, channel = job.held, job.channel
    attempt = held.state.attempt(channel)
    assert attempt is not None
    reply = result.reply
    if result.statuses is not None:
        reply = result.statuses.get(message_id_of(job))
    exc = result.error
    if exc is None and reply is None:  # what a single read of an unknown message says
        exc = PermanentError(f"{job.instance or 'the transport'} has no such message")
    if exc is not None:
        kind = exc.kind if isinstance(exc, TransportError) else type(exc).__name__
        raw, status = f"error:{kind}", Status.UNKNOWN
        summary.errors += 1
    else:
        assert reply is not None
        raw, status = reply.raw_status, reply.status
    summary.polled += 1
    now = result.ended_at
    observed = Observed(channel, status, is_poll=True)
    state, decision = machine.transition(held.state, held.policy, observed, now)
    facts = ObservationFacts(attempt.key, "poll", raw, status)
    return Pending(held, state, decision, facts, StepKind.POLL, channel, now, job.waited)


def fold_lookup(job: Job, result: CallResult, summary: SweepSummary, mono: str | None) -> Pending:
    """A lookup's answer folded into its notice: found, not found, or a failed read
    that proves nothing."""
    held, channel = job.held, job.channel
    attempt = held.state.attempt(channel)
    assert attempt is not None
    found = result.reply
    failed = result.error is not None
    if failed:
        exc = result.error
        detail = (
            calls.redact(str(exc), job.contact)
            if isinstance(exc, TransportError)
            else type(exc).__name__
        )
        LOGGER.warning("notice %s: %s lookup failed (%s)", held.state.notice_id, channel, detail)
        summary.errors += 1
        found = None
    summary.looked_up += 1
    now = result.ended_at
    event = LookedUp(
        channel,
        found.message_id if found else None,
        found.status if found else None,
        failed=failed,
        mono=mono,
    )
    state, decision = machine.transition(held.state, held.policy, event, now)
    after = state.attempt(channel)
    assert after is not None
    facts = LookupFacts(
        attempt.key,
        found.message_id if found else None,
        found.raw_status if found else None,
        found.status if found else None,
        after,
        failed=failed,
    )
    return Pending(held, state, decision, facts, StepKind.LOOKUP, channel, now, job.waited)


_ATTEMPT_STATE = {
    OutcomeKind.SUBMITTED: AttemptState.SUBMITTED,
    OutcomeKind.TRANSIENT: AttemptState.INTENT,
    OutcomeKind.AMBIGUOUS: AttemptState.AMBIGUOUS,
    OutcomeKind.PERMANENT: AttemptState.REJECTED,
}


def read_alone(jobs: list[Job], result: CallResult) -> list[Job]:
    """The polls of a failed batch read, each to be read on its own."""
    error = result.error
    kind = error.kind if isinstance(error, TransportError) else type(error).__name__
    LOGGER.warning(
        "%s status read of %d messages failed (%s); reading them one by one",
        jobs[0].channel,
        len(jobs),
        kind,
    )
    for job in jobs:
        job.alone, job.batched = True, False
    return jobs
