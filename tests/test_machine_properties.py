"""The machine's promises under any ordering of provider answers, callbacks, ambiguous
outcomes, crashed calls and lookups (Hypothesis drives a model provider and sweep)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from conftest import T0, make_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.machine import (
    ActionKind,
    Decision,
    LookedUp,
    NoticeState,
    Observed,
    OutcomeKind,
    Phase,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
    Tick,
    apply,
    attempt_key,
    decide,
    transition,
)
from resetctl.policy import Policy

SETTLE = 30.0
POLICIES = [
    make_settings().default_policy,
    make_settings(policy={"default": {"channels": ["sms", "email"]}}).default_policy,
    make_settings(policy={"default": {"on_poll_budget_spent": "expire"}}).default_policy,
    make_settings(policy={"default": {"channels": ["sms"]}}).default_policy,
]
#: How a submission call ends at the provider: (created?, what the caller learns).
CALLS = st.sampled_from(
    [
        (True, OutcomeKind.SUBMITTED),
        (True, OutcomeKind.AMBIGUOUS),  # created, then 504 or a dropped connection
        (False, OutcomeKind.AMBIGUOUS),  # a 5xx that created nothing
        (False, OutcomeKind.TRANSIENT),  # refused before the request was written, 429
        (False, OutcomeKind.PERMANENT),
        (False, OutcomeKind.DECLINED),  # the lease ran short: never called
        (True, None),  # created, and the worker died before recording anything
        (False, None),  # the worker died before the request was written
    ]
)
ORDER = {
    Phase.QUEUED: 0,
    Phase.PRIMARY_PENDING: 1,
    Phase.FALLBACK_PENDING: 2,
    Phase.ACCEPTED: 3,
    Phase.FAILED: 3,
    Phase.EXPIRED: 3,
}


@dataclass
class Provider:
    """A provider without idempotency keys whose message list lags by up to ``lag``."""

    lag: float
    #: attempt key -> (message id, created at)
    created: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    status: dict[str, Status] = field(default_factory=dict)

    def create(self, key: str, now: float) -> str:
        message_id = f"M{sum(len(v) for v in self.created.values())}"
        self.created.setdefault(key, []).append((message_id, now))
        self.status[message_id] = Status.PENDING
        return message_id

    def lookup(self, key: str, now: float) -> str | None:
        for message_id, at in self.created.get(key, []):
            if now >= at + self.lag:
                return message_id
        return None


@dataclass
class Run:
    policy: Policy
    state: NoticeState
    provider: Provider
    now: float = T0
    terminal: Phase | None = None
    phases: list[Phase] = field(default_factory=list)

    def step(self, event: object) -> Decision:
        self.state, decision = transition(self.state, self.policy, event, self.now)  # type: ignore[arg-type]
        self.check(decision)
        return decision

    def check(self, decision: Decision) -> None:
        """A terminal notice never moves; phases only move forward (one escalation)."""
        if self.terminal is not None:
            assert decision.phase is self.terminal
        if decision.phase.terminal:
            self.terminal = decision.phase
        if self.phases:
            assert ORDER[decision.phase] >= ORDER[self.phases[-1]]
        self.phases.append(decision.phase)
        self.state = replace(self.state, phase=decision.phase)


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    policy=st.sampled_from(POLICIES),
    ttl=st.floats(120, 1200),
    lag=st.floats(0, SETTLE - 0.001),
)
def test_any_ordering_sends_once_per_key_and_never_moves_a_terminal_notice(
    data: st.DataObject, policy: Policy, ttl: float, lag: float
) -> None:
    """At most one message per attempt key; terminal is final; failures acted on at once."""
    channels = tuple(str(c) for c in policy.channels)
    run = Run(policy, NoticeState("ntc_p", Phase.QUEUED, T0 + ttl, channels), Provider(lag))
    decision = run.step(Tick())
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        run.now += data.draw(st.sampled_from([0.0, 0.5, 1.0, 5.0, 15.0, 31.0, 60.0]), label="wait")
        choice = data.draw(st.sampled_from(["act", "act", "act", "callback", "status"]))
        if choice == "callback" and run.provider.created:
            key = data.draw(st.sampled_from(sorted(run.provider.created)), label="cb key")
            message_id, _ = run.provider.created[key][0]
            status = data.draw(st.sampled_from(list(Status)), label="cb status")
            channel = key.split(":")[1]
            decision = run.step(Observed(channel, status, is_poll=False, message_id=message_id))
            if status is Status.FAILED:
                _acted_on_failure(run, channel, decision)
            continue
        if choice == "status" and run.provider.status:
            message_id = data.draw(st.sampled_from(sorted(run.provider.status)), label="msg")
            run.provider.status[message_id] = data.draw(st.sampled_from(list(Status)))
            continue
        decision = decide(run.state, policy, run.now)
        run.check(decision)
        if not decision.due(run.now):
            continue
        assert decision.channel is not None
        channel = decision.channel
        key = attempt_key("ntc_p", channel)
        if decision.action is ActionKind.SUBMIT:
            assert run.now < run.state.expires_at
            run.state = apply(run.state, SubmissionStarted(channel, key, False, SETTLE), run.now)
            created, kind = data.draw(CALLS, label="call")
            message_id = run.provider.create(key, run.now) if created else None
            if kind is None:
                continue  # the worker died: the attempt stays in doubt
            reply = message_id if kind is OutcomeKind.SUBMITTED else None
            decision = run.step(SubmissionOutcome(channel, kind, reply, Status.PENDING))
        elif decision.action is ActionKind.LOOKUP:
            if data.draw(st.booleans(), label="lookup read fails"):
                decision = run.step(LookedUp(channel, None, failed=True))
            else:
                found = run.provider.lookup(key, run.now)
                status = run.provider.status.get(found) if found else None
                decision = run.step(LookedUp(channel, found, status))
        elif decision.action is ActionKind.POLL:
            attempt = run.state.attempt(channel)
            assert attempt is not None
            assert attempt.message_id is not None
            status = run.provider.status[attempt.message_id]
            decision = run.step(Observed(channel, status, is_poll=True))
            if status is Status.FAILED:
                _acted_on_failure(run, channel, decision)
        for key, messages in run.provider.created.items():
            assert len(messages) <= 1, (key, messages)
    assert len({a.channel for a in run.state.attempts}) == len(run.state.attempts)


def _acted_on_failure(run: Run, channel: str, decision: Decision) -> None:
    """A known `failed` on the channel in use is acted on within the round: the next
    channel is claimed now, or the notice ends (no waiting for a budget)."""
    before = run.phases[-2] if len(run.phases) > 1 else Phase.QUEUED
    if before.terminal:
        return
    in_use = run.state.channels[1 if before is Phase.FALLBACK_PENDING else 0]
    if channel != in_use:
        return  # e.g. a late primary failure after the fallback was claimed
    assert decision.phase.terminal or decision.due(run.now), decision
