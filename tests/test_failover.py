"""Provider failover: a channel names several instances in order; a new attempt (or a
retry of one that provably created nothing) goes to the first healthy one; a doubt stays
on its instance unless the policy trades it for reach; instance health is shared by every
process through the database, and one probe call decides when an instance comes back."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep
from providers_http import closed_port_url
from providers_twilio import FakeTwilio
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.failover import InstanceHealth, InstanceState, after_failure, after_success
from resetctl.instances import Failover
from resetctl.machine import ActionKind, AttemptState, Decision, Phase, Reason, Status
from resetctl.machine.routing import route
from resetctl.machine.vocabulary import Attempt
from resetctl.providers import Providers
from resetctl.store import Store
from resetctl.transports import build_transports, close_transports
from resetctl.transports.base import AmbiguousError, Message, ProviderStatus, TransientError

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
T0 = 1_700_000_000.0


def _decision(action: ActionKind) -> Decision:
    return Decision(Phase.PRIMARY_PENDING, action, "sms", T0, Reason.RETRY)


def _attempt(state: AttemptState, *, calls: int = 1, settled: int = 1) -> Attempt:
    return Attempt(
        "sms",
        "ntc:sms:1",
        state,
        T0,
        T0,
        calls=calls,
        settled=settled,
        recoverable=False,
        instance="a",
    )


NOTHING_CREATED = _attempt(AttemptState.INTENT)
DOUBT = _attempt(AttemptState.AMBIGUOUS)
CRASHED = _attempt(AttemptState.INTENT, calls=2, settled=1)
SUBMITTED = _attempt(AttemptState.SUBMITTED)


@pytest.mark.parametrize(
    ("action", "attempt", "healthy", "on_doubt", "expected"),
    [
        # a new attempt: the first healthy instance
        (ActionKind.SUBMIT, None, {"a", "b"}, False, ("a", ActionKind.SUBMIT, False)),
        (ActionKind.SUBMIT, None, {"b"}, False, ("b", ActionKind.SUBMIT, False)),
        # none healthy: the first, where it waits for the cooldown and the probe
        (ActionKind.SUBMIT, None, set(), False, ("a", ActionKind.SUBMIT, False)),
        # nothing was created: another healthy instance than the one that failed it
        (ActionKind.SUBMIT, NOTHING_CREATED, {"a", "b"}, False, ("b", ActionKind.SUBMIT, True)),
        (ActionKind.SUBMIT, NOTHING_CREATED, {"a"}, False, ("a", ActionKind.SUBMIT, False)),
        # reads stay where the message is
        (ActionKind.POLL, SUBMITTED, {"b"}, False, ("a", ActionKind.POLL, False)),
        (ActionKind.POLL, SUBMITTED, {"b"}, True, ("a", ActionKind.POLL, False)),
        # a doubt stays on its instance ...
        (ActionKind.LOOKUP, DOUBT, {"b"}, False, ("a", ActionKind.LOOKUP, False)),
        (ActionKind.SUBMIT, CRASHED, {"b"}, False, ("a", ActionKind.SUBMIT, False)),
        # ... unless the policy trades it for reach, and only while its instance is down
        (ActionKind.LOOKUP, DOUBT, {"b"}, True, ("b", ActionKind.SUBMIT, True)),
        (ActionKind.SUBMIT, CRASHED, {"b"}, True, ("b", ActionKind.SUBMIT, True)),
        (ActionKind.LOOKUP, DOUBT, {"a", "b"}, True, ("a", ActionKind.LOOKUP, False)),
        (ActionKind.LOOKUP, DOUBT, set(), True, ("a", ActionKind.LOOKUP, False)),
    ],
)
def test_route_follows_the_failover_rules(
    action: ActionKind,
    attempt: Attempt | None,
    healthy: set[str],
    on_doubt: bool,
    expected: tuple[str, ActionKind, bool],
) -> None:
    """One row per rule: where each kind of call goes, by health and the policy's trade."""
    found = route(
        _decision(action),
        attempt,
        None if attempt is None else "a",
        ("a", "b"),
        frozenset(healthy),
        failover_on_doubt=on_doubt,
    )
    assert tuple(found) == expected


FAILOVER = Failover(after=3, window=60, cooldown=30)


def test_an_instance_opens_after_consecutive_failures_within_the_window() -> None:
    """Three failures within a minute open it for the cooldown; a success ends a streak."""
    health = InstanceHealth("a")
    for at in (0, 10, 20):
        assert health.state(T0 + at) is InstanceState.CLOSED
        health = after_failure(health, T0 + at, FAILOVER)
    assert health.state(T0 + 20) is InstanceState.OPEN
    assert health.state(T0 + 50) is InstanceState.HALF_OPEN
    assert (health.opened, health.total_failures) == (1, 3)

    streak = after_failure(after_failure(InstanceHealth("a"), T0, FAILOVER), T0 + 1, FAILOVER)
    assert after_failure(after_success(streak, T0 + 2), T0 + 3, FAILOVER).failures == 1


def test_failures_spread_wider_than_the_window_do_not_open_it() -> None:
    """A failure more than a window after the first of a streak starts a new streak."""
    health = InstanceHealth("a")
    for at in (0, 50, 100, 150):
        health = after_failure(health, T0 + at, FAILOVER)
    assert health.state(T0 + 150) is InstanceState.CLOSED
    assert health.failures == 2


def test_a_failed_probe_opens_it_again_and_a_good_one_closes_it() -> None:
    """After the cooldown one call decides: a failure is another cooldown, a success ends it."""
    health = InstanceHealth("a")
    for at in (0, 1, 2):
        health = after_failure(health, T0 + at, FAILOVER)
    again = after_failure(health, T0 + 40, FAILOVER)
    assert again.state(T0 + 41) is InstanceState.OPEN
    assert again.open_until == T0 + 70
    assert again.opened == 2
    assert after_success(health, T0 + 40).state(T0 + 40) is InstanceState.CLOSED


def _two_twilios(a_url: str, b: FakeTwilio, **policy: Any) -> Settings:
    return make_settings(
        transport={"sms": ["twilio_a", "twilio_b"]},
        providers={
            "twilio_a": {"kind": "twilio", "base_url": a_url, "from": SENDER},
            "twilio_b": {"kind": "twilio", "base_url": b.base_url, "from": SENDER},
        },
        failover={"after": 1, "cooldown": "30s"},
        policy={"default": {"channels": ["sms", "email"], **policy}},
    )


def _sweep(store: Store, settings: Settings, clock: FakeClock) -> None:
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)


def _attempt_row(store: Store, notice_id: str | None) -> dict[str, Any]:
    """The notice's SMS attempt."""
    assert notice_id is not None
    (row,) = [r for r in store.attempt_rows(notice_id) if r["channel"] == "sms"]
    return row


def test_the_first_instance_refusing_connections_fails_over_to_the_second(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """Connection refused created nothing: the retry goes to the second instance, and the
    person gets one text, from there."""
    settings = _two_twilios(closed_port_url(), twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())

    _sweep(store, settings, clock)
    assert _attempt_row(store, result.notice_id)["transport"] == "twilio_a"
    clock.advance(10)  # the policy's first retry delay
    _sweep(store, settings, clock)

    assert len(twilio.messages) == 1
    row = _attempt_row(store, result.notice_id)
    assert (row["transport"], row["state"], row["calls"]) == ("twilio_b", "submitted", 2)
    health = store.instance_health()["twilio_a"]
    assert health.total_failures == 1


def test_a_5xx_that_created_nothing_on_the_first_is_sent_once_on_the_second(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """A 500 to a create may have created it: the first instance is asked (two empty
    lookups), and only then is it sent, on the second instance: one text in all."""
    first = FakeTwilio(clock)
    try:
        first.outcomes = ["error"]
        settings = _two_twilios(first.base_url, twilio)
        (result,) = enqueue(store, settings, [reset_request()], clock())
        for step in (0, 10, 20, 30):
            clock.advance(step)
            _sweep(store, settings, clock)
            if twilio.messages:
                break
        assert first.messages == {}
        assert len(first.requests) == 1
        assert len(first.list_queries) >= 2  # the doubt was resolved where it arose
        assert len(twilio.messages) == 1
        row = _attempt_row(store, result.notice_id)
        assert (row["transport"], row["state"]) == ("twilio_b", "submitted")
    finally:
        first.close()
    assert first.violations == []


def _doubt_on_a_dead_first(
    store: Store, clock: FakeClock, twilio: FakeTwilio, **policy: Any
) -> tuple[FakeTwilio, str]:
    """The first instance creates the message, loses the reply, then stops answering."""
    first = FakeTwilio(clock)
    first.outcomes = ["hangup"]
    first.list_outcomes = ["error"] * 50
    settings = _two_twilios(first.base_url, twilio, **policy)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    assert result.notice_id is not None
    for _ in range(8):
        _sweep(store, settings, clock)
        clock.advance(10)
    return first, result.notice_id


def test_a_doubt_is_never_sent_on_another_instance_by_default(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """The first instance may have the text: however long it stays down, the second
    instance is never asked to send the same attempt."""
    first, notice_id = _doubt_on_a_dead_first(store, clock, twilio)
    try:
        assert len(first.messages) == 1
        assert twilio.requests == []
        assert _attempt_row(store, notice_id)["transport"] == "twilio_a"
    finally:
        first.close()


def test_failover_on_doubt_sends_a_doubt_on_the_next_healthy_instance(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """With failover_on_doubt the doubt is sent on the second instance once the first is
    out of use: the person is reached, and may get the first instance's text too."""
    first, notice_id = _doubt_on_a_dead_first(store, clock, twilio, failover_on_doubt=True)
    try:
        assert len(first.messages) == 1  # the one whose reply was lost
        assert len(twilio.messages) == 1  # and the same attempt again, on the second
        row = _attempt_row(store, notice_id)
        assert (row["transport"], row["state"], row["calls"]) == ("twilio_b", "submitted", 2)
    finally:
        first.close()


class _Scripted:
    """A transport whose calls fail transiently until told otherwise; counts its calls."""

    recovers_by_key = True
    call_timeout = 5.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.down = False
        #: the next submit loses its reply (it may have been created)
        self.lose_reply = False
        self.submits: list[str] = []

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        self.submits.append(attempt_key)
        if self.lose_reply:
            self.lose_reply = False
            raise AmbiguousError(f"{self.name}: no reply after sending")
        if self.down:
            raise TransientError(f"{self.name}: connection refused")
        return ProviderStatus(f"{self.name}-{len(self.submits)}", "sent", Status.DELIVERED)

    def status(self, message_id: str) -> ProviderStatus:
        return ProviderStatus(message_id, "sent", Status.DELIVERED)

    def close(self) -> None:
        pass


def test_an_open_instance_gets_no_new_attempt_until_one_probe_brings_it_back(
    store: Store, clock: FakeClock
) -> None:
    """Opened by a failure, the first instance gets nothing during its cooldown (new
    notices go straight to the second); then a single probe call puts it back in use."""
    a, b = _Scripted("a"), _Scripted("b")
    a.down = True
    settings = make_settings(policy={"default": {"channels": ["sms"]}})
    failover = Failover(after=1, window=60, cooldown=30)

    def sweep() -> None:
        providers = Providers(
            {("sms", "a"): a, ("sms", "b"): b},
            {"sms": ("a", "b")},
            store=store,
            failover=failover,
        )
        run_sweep(store, settings, clock, providers)

    enqueue(store, settings, [reset_request(idempotency_key="one")], clock())
    sweep()
    assert len(a.submits) == 1
    enqueue(store, settings, [reset_request(idempotency_key="two")], clock())
    clock.advance(10)
    sweep()  # "one" retries and "two" starts: both on b, a is out of use
    assert len(a.submits) == 1
    assert len(b.submits) == 2

    a.down = False
    clock.advance(30)
    for key in ("three", "four"):
        enqueue(store, settings, [reset_request(idempotency_key=key)], clock())
    sweep()
    # One probe, and the other new notice waited for its answer: back in use, a is the
    # first healthy instance again.
    assert len(a.submits) == 3
    assert len(b.submits) == 2
    enqueue(store, settings, [reset_request(idempotency_key="five")], clock())
    sweep()
    assert len(a.submits) == 4
    assert store.instance_health()["a"].state(clock()) is InstanceState.CLOSED


def test_new_work_queued_on_an_instance_that_opens_goes_to_the_next_at_once(
    store: Store, clock: FakeClock
) -> None:
    """A backlog waiting in a dying instance's lane is not held for its cooldown: once it
    opens, the submissions still queued there go to the next healthy instance."""
    a, b = _Scripted("a"), _Scripted("b")
    a.down = True
    settings = make_settings(policy={"default": {"channels": ["sms"]}})
    providers = Providers(
        {("sms", "a"): a, ("sms", "b"): b},
        {"sms": ("a", "b")},
        store=store,
        failover=Failover(after=1, window=60, cooldown=300),
    )
    requests = [reset_request(idempotency_key=f"backlog-{n}") for n in range(5)]
    results = enqueue(store, settings, requests, clock())

    run_sweep(store, settings, clock, providers, concurrency=1)

    assert len(a.submits) == 1  # the call that failed; nothing more waited for a
    assert len(b.submits) == 4
    phases = {r.notice_id: store.load_notice(r.notice_id or "") for r in results}
    accepted = [n for n, loaded in phases.items() if loaded and loaded.state.phase == "accepted"]
    assert len(accepted) == 4


def test_an_instance_taken_out_of_transport_still_reads_its_messages_in_flight(
    store: Store, clock: FakeClock
) -> None:
    """A deploy that moves a channel to another instance keeps reading the messages the
    old one holds (while its table is configured), and sends new work to the new one."""
    providers = {
        "box_a": {"kind": "outbox", "sms_status": "pending"},
        "box_b": {"kind": "outbox", "sms_status": "pending"},
    }
    policy = {"default": {"channels": ["sms"]}}
    before = make_settings(transport={"sms": ["box_a"]}, providers=providers, policy=policy)
    after = make_settings(transport={"sms": ["box_b"]}, providers=providers, policy=policy)
    (first,) = enqueue(store, before, [reset_request()], clock())
    _sweep(store, before, clock)
    (second,) = enqueue(store, after, [reset_request()], clock())
    clock.advance(15)
    _sweep(store, after, clock)

    old, new = _attempt_row(store, first.notice_id), _attempt_row(store, second.notice_id)
    assert (old["transport"], old["polls"]) == ("box_a", 1)
    assert (new["transport"], new["state"]) == ("box_b", "submitted")


def test_work_bound_to_an_open_instance_is_handed_back_not_waited_for(
    store: Store, clock: FakeClock
) -> None:
    """A doubt whose instance is out of use does not hold the sweep for the cooldown: it
    is handed back due when the instance returns, and other work goes on meanwhile."""
    a, b = _Scripted("a"), _Scripted("b")
    a.lose_reply = True
    settings = make_settings(policy={"default": {"channels": ["sms"]}})
    failover = Failover(after=1, window=60, cooldown=300)

    def sweep() -> None:
        providers = Providers(
            {("sms", "a"): a, ("sms", "b"): b}, {"sms": ("a", "b")}, store=store, failover=failover
        )
        run_sweep(store, settings, clock, providers)

    (doubt,) = enqueue(store, settings, [reset_request()], clock())
    sweep()  # the reply is lost: a doubt on a, and a opens
    opened_until = store.instance_health()["a"].open_until
    clock.advance(10)  # the doubt's resubmission (under a's key) is due
    (other,) = enqueue(store, settings, [reset_request()], clock())
    before = clock()
    sweep()

    assert clock() - before < 5  # it did not sleep out the cooldown
    assert (len(a.submits), len(b.submits)) == (1, 1)
    assert _attempt_row(store, other.notice_id)["transport"] == "b"
    held = store.load_notice(doubt.notice_id or "")
    assert held is not None
    assert held.due_at == opened_until
    assert _attempt_row(store, doubt.notice_id)["transport"] == "a"
