"""The transition function: DESIGN.md's decision table, both flows, and its invariants."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.machine import (
    ActionKind,
    Attempt,
    AttemptState,
    Decision,
    LookedUp,
    NoticeState,
    Observed,
    OutcomeKind,
    Phase,
    Reason,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
    Tick,
    apply,
    budget,
    decide,
    fold_status,
    transition,
)
from resetctl.policy import Policy, build_policy

T0 = 1_000_000.0
TTL = 600.0
DEFAULT = build_policy("default", {})
EXPIRE = build_policy("default", {"on_poll_budget_spent": "expire"})
SMS_FIRST = build_policy("apac", {"channels": ["sms", "email"]})
EMAIL_ONLY = build_policy("solo", {"channels": ["email"]})


def notice(
    phase: Phase = Phase.QUEUED,
    channels: tuple[str, ...] = ("email", "sms"),
    attempts: tuple[Attempt, ...] = (),
    expires_at: float = T0 + TTL,
) -> NoticeState:
    return NoticeState("ntc_test", phase, expires_at, channels, attempts)


def submitted(
    channel: str = "email",
    status: Status = Status.PENDING,
    polls: int = 0,
    at: float = T0,
    state: AttemptState = AttemptState.SUBMITTED,
    recoverable: bool = True,
) -> Attempt:
    return Attempt(
        channel=channel,
        key=f"ntc_test:{channel}:1",
        state=state,
        started_at=at,
        last_call_at=at,
        submitted_at=at,
        message_id="m-" + channel,
        calls=1,
        settled=1,
        polls=polls,
        status=status,
        recoverable=recoverable,
    )


# One row per case of DESIGN.md's decision table (plus the lifecycle's edges).
DECISION_TABLE = [
    pytest.param(
        notice(),
        DEFAULT,
        T0,
        (Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email"),
        id="queued: submit the primary",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.ACCEPTED),)),
        DEFAULT,
        T0 + 20,
        (Phase.ACCEPTED, ActionKind.NONE, None),
        id="accepted: stop",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.DELIVERED),)),
        DEFAULT,
        T0 + TTL - 1,
        (Phase.ACCEPTED, ActionKind.NONE, None),
        id="delivered with little time left: still accepted",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.FAILED),)),
        DEFAULT,
        T0 + 30,
        (Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms"),
        id="failed with time left: claim the fallback",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(state=AttemptState.REJECTED),)),
        DEFAULT,
        T0 + 1,
        (Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms"),
        id="rejected by the transport: claim the fallback",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=3),)),
        DEFAULT,
        T0 + 105,
        (Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms"),
        id="budget spent, policy escalate: claim the fallback",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.UNKNOWN, polls=3),)),
        EXPIRE,
        T0 + 105,
        (Phase.EXPIRED, ActionKind.NONE, None),
        id="budget spent, policy expire: expired",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.FAILED),)),
        DEFAULT,
        T0 + TTL - DEFAULT.fallback_reserve,
        (Phase.EXPIRED, ActionKind.NONE, None),
        id="failed without the fallback reserve left: expired, no fallback",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),)),
        DEFAULT,
        T0 + TTL,
        (Phase.EXPIRED, ActionKind.NONE, None),
        id="link expired: expired",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.DELIVERED),)),
        DEFAULT,
        T0 + TTL + 1,
        (Phase.ACCEPTED, ActionKind.NONE, None),
        id="delivered, seen after expiry: accepted all the same",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),)),
        DEFAULT,
        T0 + 45,
        (Phase.PRIMARY_PENDING, ActionKind.POLL, "email"),
        id="pending with polls left: poll",
    ),
    pytest.param(
        notice(Phase.QUEUED, expires_at=T0 + 20),
        DEFAULT,
        T0,
        (Phase.EXPIRED, ActionKind.NONE, None),
        id="too little life to send at all: expired, nothing sent",
    ),
    pytest.param(
        notice(
            Phase.FALLBACK_PENDING,
            attempts=(submitted(status=Status.FAILED), submitted("sms", Status.FAILED, at=T0 + 50)),
        ),
        DEFAULT,
        T0 + 60,
        (Phase.FAILED, ActionKind.NONE, None),
        id="fallback failed: failed",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, ("email",), (submitted(status=Status.FAILED),)),
        EMAIL_ONLY,
        T0 + 30,
        (Phase.FAILED, ActionKind.NONE, None),
        id="one channel only, failed: failed",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, ("sms", "email"), (submitted("sms", Status.FAILED),)),
        SMS_FIRST,
        T0 + 30,
        (Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "email"),
        id="SMS first, failed: email fallback",
    ),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, ("sms", "email"), (submitted("sms", polls=3),)),
        SMS_FIRST,
        T0 + 105,
        (Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "email"),
        id="SMS first, budget spent: email fallback",
    ),
    pytest.param(
        notice(Phase.ACCEPTED, attempts=(submitted(status=Status.FAILED),)),
        DEFAULT,
        T0 + 30,
        (Phase.ACCEPTED, ActionKind.NONE, None),
        id="terminal: never moves",
    ),
]


@pytest.mark.parametrize(("state", "policy", "now", "expected"), DECISION_TABLE)
def test_decision_table(
    state: NoticeState,
    policy: Policy,
    now: float,
    expected: tuple[Phase, ActionKind, str | None],
) -> None:
    """Each row of DESIGN.md's decision table gives its phase and side effect."""
    decision = decide(state, policy, now)
    assert (decision.phase, decision.action, decision.channel) == expected
    if decision.action is ActionKind.NONE:
        assert decision.due_at is None


def test_polls_follow_the_schedule_after_submission() -> None:
    """Email status is read 15, 45 and 105 s after submission, then the budget is spent."""
    state = notice(Phase.PRIMARY_PENDING, attempts=(submitted(at=T0 + 7),))
    due = []
    for polls in range(3):
        state = replace(state, attempts=(replace(state.attempts[0], polls=polls),))
        due.append(decide(state, DEFAULT, T0 + 8).due_at)
    assert due == [T0 + 22, T0 + 52, T0 + 112]


def test_poll_that_cannot_fit_before_the_fallback_deadline_escalates_now() -> None:
    """A short-lived link escalates while a fallback still helps, not after a useless wait."""
    # 4-minute link, 3-minute reserve: the fallback must start within 60 s; the 105 s poll
    # could never change anything, so after the 45 s read the budget counts as spent.
    state = notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=2),), expires_at=T0 + 240)
    decision = decide(state, DEFAULT, T0 + 46)
    assert (decision.phase, decision.channel) == (Phase.FALLBACK_PENDING, "sms")
    assert decision.reason is Reason.BUDGET_SPENT_ESCALATE


def test_without_a_possible_fallback_polls_continue_until_expiry() -> None:
    """When no fallback can follow, reads go on: they can still report acceptance."""
    state = notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),), expires_at=T0 + 150)
    decision = decide(state, DEFAULT, T0 + 20)
    assert (decision.action, decision.due_at) == (ActionKind.POLL, T0 + 45)


def test_transient_errors_retry_under_the_same_key_then_give_up() -> None:
    """Transient errors are retried on the retry schedule, then the channel counts as failed."""
    key = "ntc_test:email:1"
    state = notice()
    state = apply(state, SubmissionStarted("email", key, recoverable=True), T0)
    state, decision = transition(
        state, DEFAULT, SubmissionOutcome("email", OutcomeKind.TRANSIENT), T0
    )
    assert (decision.action, decision.due_at, decision.reason) == (
        ActionKind.SUBMIT,
        T0 + DEFAULT.retry_delays[0],
        Reason.RETRY,
    )
    for retry in DEFAULT.retry_delays:
        state = apply(state, SubmissionStarted("email", key, recoverable=True), T0 + retry)
        state, decision = transition(
            state, DEFAULT, SubmissionOutcome("email", OutcomeKind.TRANSIENT), T0 + retry
        )
    assert state.attempt("email") is not None
    assert state.attempts[0].calls == 1 + len(DEFAULT.retry_delays)
    assert (decision.phase, decision.channel) == (Phase.FALLBACK_PENDING, "sms")
    assert decision.reason is Reason.RETRIES_EXHAUSTED


def test_ambiguous_doubt_nothing_can_resolve_is_a_spent_budget_at_once() -> None:
    """An ambiguous submission that no key, lookup or status can resolve (SMTP) is
    never resubmitted, and waits for nothing: the policy's budget choice is made now."""
    key = "ntc_test:sms:1"
    state = notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED),))
    state = apply(state, SubmissionStarted("sms", key, recoverable=False), T0 + 30)
    state, decision = transition(
        state, DEFAULT, SubmissionOutcome("sms", OutcomeKind.AMBIGUOUS), T0 + 30
    )
    assert (decision.phase, decision.reason) == (Phase.EXPIRED, Reason.BUDGET_SPENT_EXPIRE)
    primary = apply(notice(), SubmissionStarted("email", "ntc_test:email:1", False), T0)
    primary, decision = transition(
        primary, DEFAULT, SubmissionOutcome("email", OutcomeKind.AMBIGUOUS), T0 + 1
    )
    assert (decision.phase, decision.action, decision.channel) == (
        Phase.FALLBACK_PENDING,
        ActionKind.SUBMIT,
        "sms",
    )
    assert decision.reason is Reason.BUDGET_SPENT_ESCALATE
    in_doubt = primary.attempt("email")
    assert in_doubt is not None
    assert in_doubt.doubtful


def test_worker_lost_mid_call_is_recovered_by_key_when_the_transport_dedupes() -> None:
    """An intent whose outcome was never recorded is resubmitted only under the same key."""
    started = apply(notice(), SubmissionStarted("email", "ntc_test:email:1", True), T0)
    decision = decide(replace(started, phase=Phase.PRIMARY_PENDING), DEFAULT, T0 + 61)
    assert (decision.action, decision.reason) == (ActionKind.SUBMIT, Reason.RECOVER_BY_KEY)
    unsafe = apply(notice(), SubmissionStarted("email", "ntc_test:email:1", False), T0)
    decision = decide(replace(unsafe, phase=Phase.PRIMARY_PENDING), DEFAULT, T0 + 61)
    assert (decision.action, decision.channel) == (ActionKind.SUBMIT, "sms")
    assert decision.reason is Reason.BUDGET_SPENT_ESCALATE


def test_late_observation_on_a_terminal_notice_is_kept_but_changes_nothing() -> None:
    """A receipt after the end is stored as evidence; the phase stays."""
    state = notice(Phase.EXPIRED, attempts=(submitted(),))
    folded, decision = transition(state, DEFAULT, Observed("email", Status.DELIVERED, True), T0)
    assert decision.phase is Phase.EXPIRED
    assert folded.attempts[0].status is Status.DELIVERED


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([], Status.PENDING),
        ([Status.PENDING, Status.UNKNOWN], Status.UNKNOWN),
        ([Status.DELIVERED, Status.PENDING], Status.DELIVERED),
        ([Status.FAILED, Status.UNKNOWN], Status.FAILED),
        ([Status.ACCEPTED, Status.FAILED], Status.FAILED),
    ],
)
def test_fold_status_keeps_decisive_statuses(statuses: list[Status], expected: Status) -> None:
    """An out-of-order open status never undoes a decisive one."""
    assert fold_status(statuses) is expected


# -- properties ----------------------------------------------------------------------

POLICIES = st.sampled_from([DEFAULT, EXPIRE, SMS_FIRST, EMAIL_ONLY])
OUTCOMES = st.sampled_from(list(OutcomeKind))
STATUSES = st.sampled_from(list(Status))


def _fallback_allowed(state: NoticeState, policy: Policy, now: float) -> bool:
    """The primary failed, or its budget is spent (or can no longer fit)."""
    primary = state.attempt(state.channels[0])
    if primary is None or policy.succeeds(primary.channel, primary.status):
        return False
    if primary.status is Status.FAILED or primary.state is AttemptState.REJECTED:
        return True
    if primary.state is AttemptState.INTENT and not primary.in_doubt:
        return primary.calls > len(policy.retry_delays) or (
            primary.started_at + policy.retry_delays[primary.calls - 1]
            >= state.expires_at - policy.send_reserve
        )
    delays = policy.polls_for(primary.channel)
    if primary.state is not AttemptState.SUBMITTED:
        settle = primary.lookup_settle
        if primary.recoverable or settle is None:
            # Recovery by key was not possible (it would have been resubmitted), or
            # nothing can resolve the doubt: a spent budget at once.
            return True
        failing = primary.lookup_failing_since
        if failing is not None and now >= failing + 2 * settle:
            return True
        read = primary.last_read_at
        look_at = now
        if read is not None and read >= primary.last_call_at:
            look_at = max(now, read + settle, primary.last_call_at + settle)
        return look_at >= state.expires_at - policy.fallback_reserve
    base = primary.submitted_at if primary.submitted_at is not None else primary.started_at
    read = primary.last_read_at
    slots = [base + d for d in delays[primary.polls :] if read is None or base + d > read]
    return not slots or slots[0] >= state.expires_at - policy.fallback_reserve


@settings(max_examples=300, deadline=None)
@given(data=st.data(), policy=POLICIES, ttl=st.floats(10, 1200))
def test_machine_invariants_under_random_inputs(
    data: st.DataObject, policy: Policy, ttl: float
) -> None:
    """Random ticks and duplicate, late, out-of-order observations never break the rules.

    At most one attempt per channel; a terminal phase never changes; nothing is
    submitted at or after expires_at; the fallback only after the primary failed or
    its poll budget was spent.
    """
    channels = tuple(str(c) for c in policy.channels)
    state = NoticeState("ntc_prop", Phase.QUEUED, T0 + ttl, channels)
    now = T0
    terminal: Phase | None = None
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        now += data.draw(st.floats(0, 90), label="wait")
        if data.draw(st.booleans(), label="observe"):
            channel = data.draw(st.sampled_from(channels), label="channel")
            event = Observed(channel, data.draw(STATUSES, label="status"), data.draw(st.booleans()))
            state, decision = transition(state, policy, event, now)
        else:
            state, decision = transition(state, policy, Tick(), now)
        for _ in range(4):  # act on what is due, as a sweep would
            if terminal is not None:
                assert decision.phase is terminal
            if decision.phase.terminal:
                terminal = decision.phase
            if not decision.due(now):
                break
            assert decision.channel is not None
            if decision.action is ActionKind.SUBMIT:
                assert now < state.expires_at
                first_try = state.attempt(decision.channel) is None
                if decision.channel != channels[0] and first_try:
                    assert _fallback_allowed(state, policy, now)
                key = f"ntc_prop:{decision.channel}:1"
                recoverable = data.draw(st.booleans(), label="recoverable")
                state = replace(state, phase=decision.phase)
                state = apply(state, SubmissionStarted(decision.channel, key, recoverable), now)
                kind = data.draw(OUTCOMES, label="outcome")
                status = data.draw(STATUSES) if kind is OutcomeKind.SUBMITTED else None
                outcome = SubmissionOutcome(decision.channel, kind, "m", status)
                state, decision = transition(state, policy, outcome, now)
            else:
                observed = Observed(decision.channel, data.draw(STATUSES), is_poll=True)
                state, decision = transition(state, policy, observed, now)
        assert len({a.channel for a in state.attempts}) == len(state.attempts)
        assert all(a.channel in channels for a in state.attempts)


def test_after_a_crash_recovery_transient_errors_follow_the_retry_schedule() -> None:
    """A recovered call's outcome settles the lost call too: later retries are not immediate."""
    key = "ntc_test:email:1"
    state = apply(notice(), SubmissionStarted("email", key, True), T0)  # worker dies mid-call
    state = apply(state, SubmissionStarted("email", key, True), T0 + 61)  # recovery by key
    state, decision = transition(
        state, DEFAULT, SubmissionOutcome("email", OutcomeKind.TRANSIENT), T0 + 61
    )
    assert not state.attempts[0].in_doubt
    assert decision.reason is Reason.RETRY
    # The recovery used up the first retry; the second is on the schedule (already due).
    assert decision.due_at == max(T0 + 61, T0 + DEFAULT.retry_delays[1])
    state = apply(state, SubmissionStarted("email", key, True), T0 + 61)
    state, decision = transition(
        state, DEFAULT, SubmissionOutcome("email", OutcomeKind.TRANSIENT), T0 + 61
    )
    assert decision.reason is Reason.RETRIES_EXHAUSTED
    assert (decision.phase, decision.channel) == (Phase.FALLBACK_PENDING, "sms")


def _escalated_early() -> NoticeState:
    """A 250 s link: after the 45 s read the 105 s slot is past the fallback deadline, so
    the email escalated with one slot left; the SMS went out at 46 s."""
    email = replace(submitted(polls=2), last_read_at=T0 + 45)
    sms = replace(submitted("sms", at=T0 + 46), last_read_at=None)
    return notice(Phase.FALLBACK_PENDING, attempts=(email, sms), expires_at=T0 + 250)


def test_after_a_fallback_the_primary_keeps_its_remaining_slots_as_evidence() -> None:
    """The primary's next slot (105 s) is read when the fallback has nothing due sooner."""
    state = _escalated_early()
    first = decide(state, DEFAULT, T0 + 47)
    assert (first.action, first.channel, first.due_at) == (ActionKind.POLL, "sms", T0 + 61)
    sms_read = replace(state.attempts[1], polls=2, last_read_at=T0 + 91)
    state = replace(state, attempts=(state.attempts[0], sms_read))
    decision = decide(state, DEFAULT, T0 + 92)
    assert decision.phase is Phase.FALLBACK_PENDING
    assert (decision.action, decision.channel, decision.due_at) == (
        ActionKind.POLL,
        "email",
        T0 + 105,
    )


def test_a_late_primary_success_after_a_fallback_ends_the_notice_without_a_new_message() -> None:
    """A success read on the primary after the fallback ends it accepted; nothing is sent."""
    state = replace(
        _escalated_early(),
        attempts=(_escalated_early().attempts[0], replace(submitted("sms", at=T0 + 46), polls=2)),
    )
    state, decision = transition(
        state, DEFAULT, Observed("email", Status.DELIVERED, True), T0 + 105
    )
    assert (decision.phase, decision.action) == (Phase.ACCEPTED, ActionKind.NONE)
    assert len(state.attempts) == 2


@pytest.mark.parametrize(
    "email",
    [
        pytest.param(replace(submitted(polls=3), last_read_at=T0 + 105), id="no slots left"),
        pytest.param(submitted(status=Status.FAILED, polls=1), id="primary failed"),
        pytest.param(replace(submitted(), message_id=None), id="no message id"),
        pytest.param(replace(submitted(), state=AttemptState.REJECTED), id="primary rejected"),
    ],
)
def test_the_primary_is_not_read_after_a_fallback_without_a_slot_or_a_message(
    email: Attempt,
) -> None:
    """Only a submitted, undecided primary with a slot left is read after the fallback."""
    state = notice(
        Phase.FALLBACK_PENDING, attempts=(email, submitted("sms", at=T0 + 110)), expires_at=T0 + 600
    )
    decision = decide(state, DEFAULT, T0 + 111)
    assert decision.channel == "sms"


# -- facts folded by each event (what the next decision, inspect and replay read) ------

INTENT = Attempt("email", "ntc_test:email:1", AttemptState.INTENT, T0, T0)


def _fold(attempt: Attempt, event: object, now: float) -> Attempt | None:
    state = notice(Phase.PRIMARY_PENDING, attempts=(attempt,))
    folded = apply(state, event, now)  # type: ignore[arg-type]
    assert (folded.notice_id, folded.phase, folded.expires_at) == (
        state.notice_id,
        state.phase,
        state.expires_at,
    )
    return folded.attempt("email")


@pytest.mark.parametrize(
    ("before", "event", "after"),
    [
        pytest.param(
            INTENT,
            SubmissionOutcome("email", OutcomeKind.SUBMITTED, "m1", Status.ACCEPTED),
            replace(
                INTENT,
                state=AttemptState.SUBMITTED,
                settled=1,
                submitted_at=T0 + 2,
                message_id="m1",
                status=Status.ACCEPTED,
            ),
            id="submitted with a status",
        ),
        pytest.param(
            INTENT,
            SubmissionOutcome("email", OutcomeKind.SUBMITTED, "m1"),
            replace(
                INTENT,
                state=AttemptState.SUBMITTED,
                settled=1,
                submitted_at=T0 + 2,
                message_id="m1",
            ),
            id="submitted without a status",
        ),
        pytest.param(
            replace(INTENT, state=AttemptState.AMBIGUOUS, settled=1, submitted_at=T0, calls=2),
            SubmissionOutcome("email", OutcomeKind.SUBMITTED),
            replace(INTENT, state=AttemptState.SUBMITTED, settled=2, submitted_at=T0, calls=2),
            id="a recovery's submission keeps the first submission time",
        ),
        pytest.param(
            INTENT,
            SubmissionOutcome("email", OutcomeKind.AMBIGUOUS),
            replace(INTENT, state=AttemptState.AMBIGUOUS, settled=1, submitted_at=T0 + 2),
            id="ambiguous",
        ),
        pytest.param(
            replace(submitted(), calls=2),
            SubmissionOutcome("email", OutcomeKind.AMBIGUOUS),
            replace(submitted(), calls=2, settled=2),
            id="a stale ambiguous reply never undoes a submission",
        ),
        pytest.param(
            INTENT,
            SubmissionOutcome("email", OutcomeKind.PERMANENT),
            replace(INTENT, state=AttemptState.REJECTED, settled=1, status=Status.FAILED),
            id="permanent",
        ),
        pytest.param(
            replace(INTENT, calls=2, settled=1),
            SubmissionOutcome("email", OutcomeKind.TRANSIENT),
            replace(INTENT, calls=2, settled=2),
            id="transient settles every call",
        ),
        pytest.param(
            replace(
                INTENT,
                settled=1,
                lookups=1,
                first_lookup_at=T0 + 1,
                last_read_at=T0 + 1,
                lookup_settle=30.0,
            ),
            SubmissionStarted("email", "ntc_test:email:1", True),
            replace(
                INTENT,
                settled=1,
                calls=2,
                last_call_at=T0 + 2,
                last_read_at=T0 + 1,
                lookup_settle=30.0,
            ),
            id="a new call forgets the previous call's lookups",
        ),
        pytest.param(
            replace(
                INTENT,
                state=AttemptState.AMBIGUOUS,
                calls=2,
                settled=1,
                lookups=1,
                first_lookup_at=T0,
            ),
            Observed("email", Status.DELIVERED, is_poll=False, message_id="m1"),
            replace(
                INTENT,
                state=AttemptState.SUBMITTED,
                calls=2,
                settled=2,
                submitted_at=T0,
                message_id="m1",
                status=Status.DELIVERED,
            ),
            id="a callback naming the message settles an ambiguous attempt",
        ),
        pytest.param(
            replace(INTENT, state=AttemptState.AMBIGUOUS, settled=1),
            Observed("email", Status.PENDING, is_poll=True),
            replace(INTENT, state=AttemptState.AMBIGUOUS, settled=1, polls=1, last_read_at=T0 + 2),
            id="an observation naming no message proves nothing",
        ),
        pytest.param(
            submitted(),
            Observed("email", Status.DELIVERED, is_poll=False, message_id="other"),
            replace(submitted(), status=Status.DELIVERED),
            id="a callback keeps the submitted message id and spends no poll",
        ),
        pytest.param(
            replace(submitted(), polls=1, last_read_at=T0 + 15),
            Observed("email", Status.PENDING, is_poll=True),
            replace(submitted(), polls=2, last_read_at=T0 + 2),
            id="a poll spends a slot and records the read",
        ),
    ],
)
def test_each_event_folds_exactly_its_facts_into_the_attempt(
    before: Attempt, event: object, after: Attempt
) -> None:
    """Outcomes, new calls and observations change the attempt's facts and nothing else."""
    assert _fold(before, event, T0 + 2) == after


LOOKING = replace(
    INTENT, channel="sms", key="ntc_test:sms:1", state=AttemptState.AMBIGUOUS, settled=1,
    recoverable=False, lookup_settle=30.0,
)  # fmt: skip


@pytest.mark.parametrize(
    ("before", "event", "now", "after"),
    [
        pytest.param(
            replace(LOOKING, state=AttemptState.INTENT, calls=2, lookups=1, first_lookup_at=T0),
            LookedUp("sms", "m1", Status.DELIVERED),
            T0 + 5,
            replace(
                LOOKING,
                state=AttemptState.SUBMITTED,
                calls=2,
                settled=2,
                submitted_at=T0,
                message_id="m1",
                status=Status.DELIVERED,
                last_read_at=T0 + 5,
            ),
            id="found: submitted with the provider's id and status",
        ),
        pytest.param(
            LOOKING,
            LookedUp("sms", "m1"),
            T0 + 5,
            replace(
                LOOKING,
                state=AttemptState.SUBMITTED,
                submitted_at=T0,
                message_id="m1",
                last_read_at=T0 + 5,
            ),
            id="found without a status: pending",
        ),
        pytest.param(
            replace(LOOKING, lookups=1, first_lookup_at=T0 + 1),
            LookedUp("sms", None, failed=True),
            T0 + 5,
            replace(
                LOOKING,
                lookups=1,
                first_lookup_at=T0 + 1,
                last_read_at=T0 + 5,
                lookup_failing_since=T0 + 5,
            ),
            id="a failed read proves nothing, and starts a run of failures",
        ),
        pytest.param(
            replace(LOOKING, last_read_at=T0 + 5, lookup_failing_since=T0 + 5),
            LookedUp("sms", None, failed=True),
            T0 + 35,
            replace(LOOKING, last_read_at=T0 + 35, lookup_failing_since=T0 + 5),
            id="failures go on: the run keeps its start",
        ),
        pytest.param(
            LOOKING,
            LookedUp("sms", None),
            T0 + 5,
            replace(LOOKING, last_read_at=T0 + 5),
            id="not found before the provider could have listed it: proves nothing",
        ),
        pytest.param(
            replace(LOOKING, last_read_at=T0 + 5, lookup_failing_since=T0 + 5),
            LookedUp("sms", None),
            T0 + 30,
            replace(LOOKING, lookups=1, first_lookup_at=T0 + 30, last_read_at=T0 + 30),
            id="first not-found once it could be listed (a failure run ends)",
        ),
        pytest.param(
            replace(LOOKING, lookups=1, first_lookup_at=T0 + 30, last_read_at=T0 + 30),
            LookedUp("sms", None),
            T0 + 59,
            replace(LOOKING, lookups=1, first_lookup_at=T0 + 30, last_read_at=T0 + 59),
            id="second not-found too soon",
        ),
        pytest.param(
            replace(LOOKING, calls=2, lookups=1, first_lookup_at=T0 + 30, last_read_at=T0 + 30),
            LookedUp("sms", None),
            T0 + 60,
            replace(
                LOOKING,
                state=AttemptState.INTENT,
                calls=2,
                settled=2,
                lookups=2,
                first_lookup_at=T0 + 30,
                last_read_at=T0 + 60,
            ),
            id="second not-found a settle time later: nothing was created",
        ),
        pytest.param(
            replace(
                LOOKING,
                lookups=1,
                first_lookup_at=T0 + 30,
                call_mono="b@100.000",
                lookup_mono="b@130.000",
            ),
            LookedUp("sms", None, mono="b@131.000"),
            T0 + 62,
            replace(
                LOOKING,
                lookups=1,
                first_lookup_at=T0 + 30,
                call_mono="b@100.000",
                lookup_mono="b@130.000",
                last_read_at=T0 + 62,
            ),
            id="the wall clock stepped 31 s: the monotonic clock says 1 s, too soon",
        ),
        pytest.param(
            replace(LOOKING, call_mono="b@100.000"),
            LookedUp("sms", None, mono="b@101.000"),
            T0 + 31,
            replace(LOOKING, call_mono="b@100.000", last_read_at=T0 + 31),
            id="a step before the first lookup: not yet listable by the monotonic clock",
        ),
        pytest.param(
            replace(LOOKING, calls=2, lookups=1, first_lookup_at=T0 + 30, lookup_mono="b@130.000"),
            LookedUp("sms", None, mono="c@5.000"),
            T0 + 60,
            replace(
                LOOKING,
                state=AttemptState.INTENT,
                calls=2,
                settled=2,
                lookups=2,
                first_lookup_at=T0 + 30,
                lookup_mono="b@130.000",
                last_read_at=T0 + 60,
            ),
            id="another boot (another host): the wall clock alone counts",
        ),
    ],
)
def test_lookups_fold_into_the_attempt(
    before: Attempt, event: LookedUp, now: float, after: Attempt
) -> None:
    """Found settles the attempt; two not-found a settle time apart make it an intent."""
    state = notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED), before))
    assert apply(state, event, now).attempt("sms") == after


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(INTENT, None, id="first call: no attempt at all"),
        pytest.param(replace(INTENT, calls=2), INTENT, id="recovery of a call in doubt"),
        pytest.param(
            replace(INTENT, calls=2, settled=1), replace(INTENT, settled=1), id="recovery"
        ),
        pytest.param(
            replace(INTENT, calls=3, settled=2), replace(INTENT, calls=2, settled=2), id="retry"
        ),
        pytest.param(
            replace(INTENT, calls=2, settled=2), replace(INTENT, settled=1), id="settled retry"
        ),
    ],
)
def test_a_declined_call_is_undone(before: Attempt, after: Attempt | None) -> None:
    """A call never made is not an attempt: its intent is taken back, other channels kept."""
    primary = submitted("sms", Status.FAILED)
    state = notice(Phase.FALLBACK_PENDING, ("sms", "email"), (primary, before))
    folded = apply(state, SubmissionOutcome("email", OutcomeKind.DECLINED), T0 + 2)
    assert (folded.notice_id, folded.attempt("sms")) == ("ntc_test", primary)
    assert folded.attempt("email") == after


# -- reasons and boundaries of the decision table ------------------------------------


def _ambiguous(**changes: object) -> Attempt:
    base = replace(INTENT, state=AttemptState.AMBIGUOUS, settled=1, submitted_at=T0)
    return replace(base, **changes)  # type: ignore[arg-type]


REASONS = [
    pytest.param(notice(), T0, Decision(
        Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0, Reason.FIRST_SUBMISSION
    ), id="first submission"),
    pytest.param(notice(expires_at=T0 + DEFAULT.send_reserve), T0, Decision(
        Phase.EXPIRED, ActionKind.NONE, None, None, Reason.NO_USEFUL_TIME
    ), id="exactly the send reserve left: nothing sent"),
    pytest.param(notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED),)),
        T0 + 30, Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 30, Reason.FALLBACK_SUBMISSION
    ), id="claimed fallback not yet submitted"),
    pytest.param(notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED),)),
        T0 + TTL - 100, Decision(
        Phase.EXPIRED, ActionKind.NONE, None, None, Reason.FALLBACK_RESERVE_NOT_MET
    ), id="claimed fallback below its reserve: expired"),
    pytest.param(notice(Phase.PRIMARY_PENDING, ("email",), (
        replace(INTENT, calls=3, settled=3),)), T0 + 40, Decision(
        Phase.FAILED, ActionKind.NONE, None, None, Reason.CHANNELS_EXHAUSTED
    ), id="single channel, retries exhausted: failed"),
    pytest.param(notice(Phase.PRIMARY_PENDING, ("email",), (
        replace(INTENT, settled=1),), expires_at=T0 + 40), T0 + 1, Decision(
        Phase.EXPIRED, ActionKind.NONE, None, None, Reason.NO_USEFUL_TIME
    ), id="single channel, the retry would leave exactly the send reserve"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(
        replace(INTENT, settled=1),), expires_at=T0 + 40), T0 + 1, Decision(
        Phase.EXPIRED, ActionKind.NONE, None, None, Reason.FALLBACK_RESERVE_NOT_MET
    ), id="neither the retry nor the fallback fits"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(),)), T0 + 2, Decision(
        Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0 + 10, Reason.RECOVER_BY_KEY
    ), id="ambiguous: resubmitted by key on the retry schedule"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(calls=2),)), T0 + 12,
        Decision(
        Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0 + 30, Reason.RECOVER_BY_KEY
    ), id="ambiguous, recovery call lost: the schedule, not at once"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(replace(INTENT, last_call_at=T0),)),
        T0 + 2, Decision(
        Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0 + 2, Reason.RECOVER_BY_KEY
    ), id="worker died mid-call: resubmitted by key at once"),
    pytest.param(notice(Phase.PRIMARY_PENDING, ("email",), (_ambiguous(),),
        expires_at=T0 + 40), T0 + 2, Decision(
        Phase.EXPIRED, ActionKind.NONE, None, None, Reason.BUDGET_SPENT_EXPIRE
    ), id="ambiguous, a recovery would leave exactly the send reserve: none is sent"),
    pytest.param(
        notice(Phase.PRIMARY_PENDING, ("email",), (_ambiguous(recoverable=False),)),
        T0 + 2,
        Decision(Phase.EXPIRED, ActionKind.NONE, None, None, Reason.BUDGET_SPENT_EXPIRE),
        id="unresolvable, no fallback: a spent budget at once, expired",
    ),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(recoverable=False),),
        expires_at=T0 + 250), T0 + 2, Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 2, Reason.BUDGET_SPENT_ESCALATE
    ), id="unrecoverable: its budget would outlast the fallback deadline: escalate now"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(recoverable=False),),
        expires_at=T0 + 285), T0 + 2, Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 2, Reason.BUDGET_SPENT_ESCALATE
    ), id="unrecoverable: its budget ends exactly at the fallback deadline: escalate now"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(
        recoverable=False, lookup_settle=30.0, lookups=1, first_lookup_at=T0 + 2,
        last_read_at=T0 + 2),), expires_at=T0 + 212), T0 + 3, Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 3, Reason.BUDGET_SPENT_ESCALATE
    ), id="lookup: the next one would fall on the fallback deadline: escalate now"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(_ambiguous(
        recoverable=False, lookup_settle=30.0, lookups=1, first_lookup_at=T0 + 2,
        last_read_at=T0 + 2),), expires_at=T0 + 213), T0 + 3, Decision(
        Phase.PRIMARY_PENDING, ActionKind.LOOKUP, "email", T0 + 32, Reason.RECOVER_BY_LOOKUP
    ), id="lookup: the next one fits before the fallback deadline"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(replace(submitted(), polls=1,
        last_read_at=T0 + 45),)), T0 + 46, Decision(
        Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0 + 105, Reason.POLL_SCHEDULED
    ), id="a late read exactly at a slot's time spends that slot"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),),
        expires_at=T0 + 225), T0 + 16, Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 16, Reason.BUDGET_SPENT_ESCALATE
    ), id="the next read would fall exactly on the fallback deadline: escalate now"),
    pytest.param(notice(Phase.PRIMARY_PENDING, ("email",), (submitted(polls=1),),
        expires_at=T0 + 200), T0 + 16, Decision(
        Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0 + 45, Reason.POLL_SCHEDULED
    ), id="single channel: reads go on past where a fallback deadline would be"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),),
        expires_at=T0 + 200), T0 + 20, Decision(
        Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0 + 45, Reason.POLL_SCHEDULED
    ), id="exactly at the fallback deadline: too late to escalate, reads go on"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "now", "expected"), REASONS)
def test_decisions_carry_their_reason_and_respect_exact_boundaries(
    state: NoticeState, now: float, expected: Decision
) -> None:
    """Each branch gives its own phase, action, time and recorded reason, at its boundary too."""
    policy = EMAIL_ONLY if state.channels == ("email",) else DEFAULT
    assert decide(state, policy, now) == expected


def test_a_retry_that_would_not_fit_moves_on_to_the_fallback_now() -> None:
    """A retry that would leave less than the send reserve gives way to the fallback at once."""
    policy = build_policy("slow", {"retry_delays": [10, 300]})
    attempt = replace(INTENT, calls=2, settled=2)
    state = notice(Phase.PRIMARY_PENDING, attempts=(attempt,), expires_at=T0 + 320)
    assert decide(state, policy, T0 + 20) == Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 20, Reason.RETRIES_EXHAUSTED
    )


def test_a_callback_is_not_a_read_and_spends_no_poll() -> None:
    """A pending callback before a late sweep leaves the due read due, not skipped."""
    state = notice(Phase.PRIMARY_PENDING, attempts=(submitted(),))
    _, decision = transition(state, DEFAULT, Observed("email", Status.PENDING, False), T0 + 16)
    assert (decision.action, decision.due_at) == (ActionKind.POLL, T0 + 15)


# -- after a fallback, the primary's slots -------------------------------------------


def _late_read_state(email: Attempt) -> NoticeState:
    sms = replace(submitted("sms", at=T0 + 46), polls=2, last_read_at=T0 + 91)
    return notice(Phase.FALLBACK_PENDING, attempts=(email, sms), expires_at=T0 + 250)


@pytest.mark.parametrize(
    "last_read", [T0 + 105, T0 + 110], ids=["read at the slot", "read after the slot"]
)
def test_a_primary_slot_already_read_is_not_read_again_after_a_fallback(last_read: float) -> None:
    """A late read that covered the primary's last slot leaves the fallback's own read next."""
    state = _late_read_state(replace(submitted(polls=2), last_read_at=last_read))
    decision = decide(state, DEFAULT, T0 + 111)
    assert (decision.channel, decision.due_at) == ("sms", T0 + 46 + 105)


def test_the_primary_slot_counts_from_its_submission_not_its_first_call() -> None:
    """A primary submitted on a retry is read on slots counted from that submission."""
    email = replace(submitted(polls=2, at=T0 + 10), started_at=T0, last_read_at=T0 + 56)
    decision = decide(_late_read_state(email), DEFAULT, T0 + 92)
    assert decision == Decision(
        Phase.FALLBACK_PENDING, ActionKind.POLL, "email", T0 + 115, Reason.POLL_SCHEDULED
    )


def test_a_primary_read_due_with_the_fallbacks_action_lets_the_fallback_go_first() -> None:
    """On a tie, or when the fallback's action is already due, the fallback's action goes."""
    sms = replace(submitted("sms", at=T0 + 60), polls=1, last_read_at=T0 + 75)
    state = notice(
        Phase.FALLBACK_PENDING,
        attempts=(replace(submitted(polls=2), last_read_at=T0 + 45), sms),
        expires_at=T0 + 250,
    )
    tie = decide(state, DEFAULT, T0 + 76)
    assert (tie.channel, tie.due_at) == ("sms", T0 + 105)
    unsent = notice(
        Phase.FALLBACK_PENDING,
        attempts=(replace(submitted(polls=2), last_read_at=T0 + 45),),
        expires_at=T0 + 600,
    )
    due_now = decide(unsent, DEFAULT, T0 + 120)
    assert (due_now.action, due_now.channel, due_now.due_at) == (
        ActionKind.SUBMIT,
        "sms",
        T0 + 120,
    )


# -- the deadline budget health and inspect show -------------------------------------

BUDGETS = [
    pytest.param(notice(), DEFAULT, T0, TTL, DEFAULT.send_reserve, id="first send due now"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),)), DEFAULT,
        T0 + 20, TTL - 20, 25 + DEFAULT.fallback_reserve,
        id="a read that may still lead to a fallback"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(submitted(polls=1),)), EXPIRE,
        T0 + 20, TTL - 20, 25 + EXPIRE.fallback_reserve,
        id="a read under an expire policy (a failure read still leads to a fallback)"),
    pytest.param(notice(Phase.PRIMARY_PENDING, ("email",), (submitted(polls=1),)), EMAIL_ONLY,
        T0 + 20, TTL - 20, 25.0, id="a read with no fallback"),
    pytest.param(notice(Phase.FALLBACK_PENDING, attempts=(
        submitted(status=Status.FAILED), submitted("sms", at=T0 + 30))), DEFAULT,
        T0 + 31, TTL - 31, 14.0, id="the fallback's read"),
    pytest.param(notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED),)),
        DEFAULT, T0 + 30, TTL - 30, DEFAULT.fallback_reserve, id="the fallback's send"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(replace(INTENT, settled=1),)),
        DEFAULT, T0 + 2, TTL - 2, 8 + DEFAULT.send_reserve, id="a retry later"),
    pytest.param(notice(Phase.PRIMARY_PENDING, attempts=(submitted(status=Status.DELIVERED),)),
        DEFAULT, T0 + 20, TTL - 20, 0.0, id="about to be accepted"),
    pytest.param(notice(expires_at=T0 + 10), DEFAULT, T0, 10.0, math.inf,
        id="about to expire"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "policy", "now", "remaining", "needed"), BUDGETS)
def test_the_budget_is_the_wait_plus_the_reserve_the_next_action_needs(
    state: NoticeState, policy: Policy, now: float, remaining: float, needed: float
) -> None:
    """remaining = life left; needed = wait until due + the reserve that action still needs."""
    found = budget(state, policy, now)
    assert found is not None
    assert (found.decision, found.remaining, found.needed) == (
        decide(state, policy, now),
        remaining,
        needed,
    )
    assert found.margin == remaining - needed
    accepted = found.decision.phase is Phase.ACCEPTED
    assert found.at_risk is (not accepted and remaining - needed <= policy.alert_warning)
    assert budget(replace(state, phase=Phase.EXPIRED), policy, now) is None


def test_a_first_call_starts_an_intent_attempt() -> None:
    """The intent persisted before a first call: one call begun, none settled, nothing known."""
    state = apply(notice(), SubmissionStarted("sms", "ntc_test:sms:1", False, 30.0), T0 + 2)
    assert state.attempts == (
        Attempt(
            "sms",
            "ntc_test:sms:1",
            AttemptState.INTENT,
            T0 + 2,
            T0 + 2,
            recoverable=False,
            lookup_settle=30.0,
        ),
    )


def test_polls_count_from_the_submission_not_the_first_call() -> None:
    """A message submitted on a retry is read 15 s after that submission."""
    email = replace(submitted(at=T0 + 10), started_at=T0)
    decision = decide(notice(Phase.PRIMARY_PENDING, attempts=(email,)), DEFAULT, T0 + 11)
    assert (decision.action, decision.due_at) == (ActionKind.POLL, T0 + 25)


def test_a_submitted_attempt_without_a_submission_time_is_read_from_its_start() -> None:
    """A submitted row with no submitted_at (as schema v1 could leave) polls from started_at."""
    email = replace(submitted(at=T0 + 10), started_at=T0, submitted_at=None)
    decision = decide(notice(Phase.PRIMARY_PENDING, attempts=(email,)), DEFAULT, T0 + 11)
    assert (decision.action, decision.due_at) == (ActionKind.POLL, T0 + 15)
    sms = replace(submitted("sms", at=T0 + 70), polls=1, last_read_at=T0 + 85)
    escalated = notice(
        Phase.FALLBACK_PENDING, attempts=(replace(email, polls=2, last_read_at=T0 + 45), sms)
    )
    later = decide(escalated, DEFAULT, T0 + 86)
    assert (later.channel, later.due_at) == ("email", T0 + 105)
