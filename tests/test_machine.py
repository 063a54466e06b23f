"""The transition function: DESIGN.md's decision table, both flows, and its invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.config import Policy, build_policy
from resetctl.machine import (
    ActionKind,
    Attempt,
    AttemptState,
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
    decide,
    fold_status,
    transition,
)

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


def test_ambiguous_without_recovery_waits_out_the_budget_and_never_resends() -> None:
    """An ambiguous submission on a transport without idempotency is never resubmitted."""
    key = "ntc_test:sms:1"
    state = notice(Phase.FALLBACK_PENDING, attempts=(submitted(status=Status.FAILED),))
    state = apply(state, SubmissionStarted("sms", key, recoverable=False), T0 + 30)
    state, decision = transition(
        state, DEFAULT, SubmissionOutcome("sms", OutcomeKind.AMBIGUOUS), T0 + 30
    )
    assert decision.action is ActionKind.RECHECK
    assert decision.due_at == T0 + 30 + DEFAULT.polls_for("sms")[-1]
    for now in (T0 + 31, T0 + 100, decision.due_at):
        later = decide(state, DEFAULT, now)
        assert later.action is not ActionKind.SUBMIT
    final = decide(state, DEFAULT, T0 + 30 + DEFAULT.polls_for("sms")[-1])
    assert final.phase is Phase.EXPIRED


def test_worker_lost_mid_call_is_recovered_by_key_when_the_transport_dedupes() -> None:
    """An intent whose outcome was never recorded is resubmitted only under the same key."""
    started = apply(notice(), SubmissionStarted("email", "ntc_test:email:1", True), T0)
    decision = decide(replace(started, phase=Phase.PRIMARY_PENDING), DEFAULT, T0 + 61)
    assert (decision.action, decision.reason) == (ActionKind.SUBMIT, Reason.RECOVER_BY_KEY)
    unsafe = apply(notice(), SubmissionStarted("email", "ntc_test:email:1", False), T0)
    decision = decide(replace(unsafe, phase=Phase.PRIMARY_PENDING), DEFAULT, T0 + 61)
    assert decision.action is ActionKind.RECHECK


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
        end = primary.last_call_at + delays[-1]
        return now >= end or end >= state.expires_at - policy.fallback_reserve
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
