"""The delivery promise at its edges: what counts as success per channel, ambiguity
recovered by lookup, callbacks matched by attempt, late outcomes acted on, the first
message sent at once, and --max-runtime as a bound."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, Status
from resetctl.observe import record_callback
from resetctl.replay import Candidate, Simulation, SimulationOptions, read_traces
from resetctl.report import notice_report
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports
from resetctl.transports.base import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    TransientError,
)
from resetctl.work import SweepOptions

SMS_FIRST = {"default": {"channels": ["sms", "email"]}}


@dataclass
class FakeProvider:
    """A provider without idempotency keys that can look up what it sent.

    ``script`` says how each submit call ends: "ok" (created, reply received),
    "lost" (created, then the reply is lost: ambiguous), "504-nothing" (ambiguous, but
    nothing was created), "refused" (permanent). Statuses are scripted per message id.
    """

    clock: FakeClock
    script: list[str] = field(default_factory=list)
    name: str = "fakeprovider"
    recovers_by_key: bool = False
    lookup_settle: float = 30.0
    call_timeout: float = 0.0
    initial: str = "pending"
    created: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    lookups: list[tuple[str, float]] = field(default_factory=list)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        self.calls[attempt_key] += 1
        how = self.script.pop(0) if self.script else "ok"
        if how == "refused":
            raise PermanentError("refused")
        if how == "504-nothing":
            raise AmbiguousError("HTTP 504")
        message_id = f"M{len(self.created):04d}"
        self.created[message_id] = (attempt_key, self.clock(), message.recipient)
        self.statuses[message_id] = self.initial
        if how == "lost":
            raise AmbiguousError("connection dropped after the request was written")
        return ProviderStatus(message_id, self.initial, Status(self.initial))

    def status(self, message_id: str) -> ProviderStatus:
        raw = self.statuses[message_id]
        return ProviderStatus(message_id, raw, Status(raw))

    def fingerprint(self, message: Message) -> dict[str, str]:
        return {"from": "fake"}

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        assert sent == {"from": "fake"}  # what was recorded with the intent
        self.lookups.append((attempt_key, self.clock()))
        for message_id, (key, at, _) in self.created.items():
            if key == attempt_key and at >= since:
                return self.status(message_id)
        return None

    def close(self) -> None:
        pass

    def sent_to(self, attempt_key: str) -> int:
        """How many messages the person got under this attempt key."""
        return sum(1 for key, _, _ in self.created.values() if key == attempt_key)


def _transports(settings: Settings, store: Store, clock: FakeClock, **swap: Any) -> dict[str, Any]:
    built: dict[str, Any] = dict(build_transports(settings, store, clock))
    built.update(swap)
    return built


def _notice(store: Store, clock: FakeClock, settings: Settings, **fields: Any) -> str:
    (result,) = enqueue(store, settings, [reset_request(**fields)], clock())
    return result.notice_id


def _phase(store: Store, notice_id: str) -> tuple[str, str | None]:
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    return loaded.state.phase.value, loaded.reason


# -- success is per channel -----------------------------------------------------------


def test_an_sms_only_sent_keeps_being_polled_and_undelivered_escalates_to_email(
    store: Store, clock: FakeClock
) -> None:
    """Twilio `sent` is a hand-off to a carrier: the email fallback still goes out."""
    settings = make_settings(policy=SMS_FIRST, outbox={"email_status": "accepted"})
    provider = FakeProvider(clock, initial="accepted")
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)

    run_sweep(store, settings, clock, transports)
    assert _phase(store, notice_id)[0] == "primary_pending"
    clock.advance(15)
    run_sweep(store, settings, clock, transports)
    assert _phase(store, notice_id)[0] == "primary_pending"  # still only "sent"
    (message_id,) = provider.created
    provider.statuses[message_id] = "failed"  # the carrier's `undelivered`
    clock.advance(30)
    run_sweep(store, settings, clock, transports)

    assert _phase(store, notice_id) == ("accepted", "accepted")
    channels = [m["channel"] for m in store.outbox_messages(notice_id)]
    assert channels == ["email"]


def test_a_region_without_receipts_can_count_sent_as_success(
    store: Store, clock: FakeClock
) -> None:
    """sms.success = ["accepted", "delivered"] ends the notice on the carrier hand-off."""
    policy = {"default": {"channels": ["sms", "email"], "sms": {"success": ["accepted"]}}}
    settings = make_settings(policy=policy)
    provider = FakeProvider(clock, initial="accepted")
    notice_id = _notice(store, clock, settings)

    run_sweep(store, settings, clock, _transports(settings, store, clock, sms=provider))

    assert _phase(store, notice_id) == ("accepted", "accepted")
    assert store.outbox_messages(notice_id) == []


def test_sms_success_must_name_known_statuses() -> None:
    """A success list with a status that can never mean success is refused, key named."""
    from resetctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"policy\.default\.sms\.success"):
        make_settings(policy={"default": {"sms": {"success": ["pending"]}}})


def test_replay_escalates_an_sms_first_trace_that_was_sent_then_undelivered() -> None:
    """Replay reads success per channel too: `sent` then `undelivered` sends the email."""
    settings = make_settings(policy=SMS_FIRST)
    trace = {
        "trace_id": "t",
        "region": "default",
        "arrived_at": 0,
        "ttl": 600,
        "transport": {"sms": "twilio"},
        "sms": [[3, "sent"], [40, "undelivered"]],
        "email": [[5, "delivered"]],
    }
    ends: list[tuple[str, dict[str, int]]] = []
    simulation = Simulation(
        Candidate("current", settings.policies),
        SimulationOptions(sweep_interval=60, max_runtime=55),
        lambda _trace, state, sent: ends.append((state.phase.value, dict(sent))),
    )
    for parsed in read_traces([json.dumps(trace)], Counter()):
        simulation.arrive(parsed)
    simulation.finish()
    assert ends == [("accepted", {"sms": 1, "email": 1})]


# -- ambiguity recovered by lookup ----------------------------------------------------


def test_a_lost_reply_is_found_by_lookup_and_never_resent(store: Store, clock: FakeClock) -> None:
    """Created, then the reply lost: the lookup finds it and polling goes on; one text."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["lost"])
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)

    summary = run_sweep(store, settings, clock, transports)
    assert summary.looked_up == 1
    (message_id,) = provider.created
    provider.statuses[message_id] = "delivered"
    clock.advance(15)
    run_sweep(store, settings, clock, transports)

    key = f"{notice_id}:sms:1"
    assert provider.calls[key] == 1
    assert provider.sent_to(key) == 1
    assert _phase(store, notice_id) == ("accepted", "accepted")
    (attempt,) = store.attempt_rows(notice_id)
    assert (attempt["state"], attempt["message_id"]) == ("submitted", message_id)


def test_nothing_found_twice_a_settle_apart_sends_again_under_the_same_key(
    store: Store, clock: FakeClock
) -> None:
    """A 504 that created nothing: two empty lookups 30 s apart, then one resend."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["504-nothing", "ok"], initial="delivered")
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)
    key = f"{notice_id}:sms:1"

    run_sweep(store, settings, clock, transports)  # call, ambiguous, a lookup at once
    assert provider.calls[key] == 1
    assert len(provider.lookups) == 1  # too soon after the call to count as not found
    clock.advance(10)
    run_sweep(store, settings, clock, transports)
    assert len(provider.lookups) == 1
    clock.advance(20)
    run_sweep(store, settings, clock, transports)  # the first not-found that counts
    assert len(provider.lookups) == 2
    assert provider.calls[key] == 1
    clock.advance(29)
    run_sweep(store, settings, clock, transports)  # too soon for the second
    assert len(provider.lookups) == 2
    clock.advance(1)
    run_sweep(store, settings, clock, transports)  # the second, then the resend

    assert [at - provider.lookups[0][1] for _, at in provider.lookups] == [0.0, 30.0, 60.0]
    assert provider.calls[key] == 2
    assert provider.sent_to(key) == 1
    assert _phase(store, notice_id) == ("accepted", "accepted")
    reasons = [e["reason"] for e in store.event_rows(notice_id) if e["kind"] == "intent"]
    assert reasons == ["first_submission", "not_created"]


def test_an_ambiguous_send_is_never_resent_while_a_lookup_may_still_find_it(
    store: Store, clock: FakeClock
) -> None:
    """However often sweeps run before the settle time, one call and no resend."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["lost"])
    provider.lookup = lambda *_: None  # type: ignore[method-assign]  # the list lags
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)

    for _ in range(29):
        run_sweep(store, settings, clock, transports)
        clock.advance(1)

    assert provider.calls[f"{notice_id}:sms:1"] == 1


def test_a_failed_lookup_proves_nothing(store: Store, clock: FakeClock) -> None:
    """A lookup whose read fails counts as neither found nor not found; lookups that
    keep failing for two settle times are a spent budget: the fallback goes, the
    SMS is never resent."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["504-nothing"])

    def broken(*_: object) -> None:
        raise TransientError("HTTP 503")

    provider.lookup = broken  # type: ignore[method-assign, assignment]
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)
    for _ in range(3):
        run_sweep(store, settings, clock, transports)
        clock.advance(31)
    # One read per sweep, a settle time apart: a failing provider is not hammered.
    assert len([e for e in store.event_rows(notice_id) if e["kind"] == "lookup"]) == 2

    assert provider.calls[f"{notice_id}:sms:1"] == 1
    sms, email = store.attempt_rows(notice_id)
    assert (sms["state"], sms["lookups"]) == ("ambiguous", 0)
    assert email["channel"] == "email"
    assert email["started_at"] - sms["started_at"] == 62.0  # not at the fallback deadline
    intents = [e["reason"] for e in store.event_rows(notice_id) if e["kind"] == "intent"]
    assert intents == ["first_submission", "budget_spent_escalate"]


# -- callbacks ------------------------------------------------------------------------


def test_a_callback_for_an_ambiguous_attempt_is_matched_by_its_key(
    store: Store, clock: FakeClock
) -> None:
    """The reply was lost; the callback names the attempt: recorded, no email fallback."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["lost"])
    provider.lookup = lambda *_: None  # type: ignore[method-assign]
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)
    run_sweep(store, settings, clock, transports)
    (message_id,) = provider.created
    key = f"{notice_id}:sms:1"

    result = record_callback(
        store, "fakeprovider", message_id, "delivered", Status.DELIVERED, clock(), attempt_key=key
    )

    assert (result.notice_id, result.new_phase) == (notice_id, "accepted")
    (attempt,) = store.attempt_rows(notice_id)
    assert (attempt["state"], attempt["message_id"]) == ("submitted", message_id)
    clock.advance(300)
    run_sweep(store, settings, clock, transports)
    assert store.outbox_messages(notice_id) == []


def test_a_replayed_callback_is_stored_once(store: Store, clock: FakeClock) -> None:
    """The same MessageSid and status, or the same idempotency token, is a no-op."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock)
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)
    run_sweep(store, settings, clock, transports)
    (message_id,) = provider.created

    first = record_callback(store, "fakeprovider", message_id, "sent", Status.ACCEPTED, clock())
    again = record_callback(store, "fakeprovider", message_id, "sent", Status.ACCEPTED, clock())
    token = record_callback(
        store, "fakeprovider", message_id, "x", Status.PENDING, clock(), dedupe="tok-1"
    )
    retried = record_callback(
        store, "fakeprovider", message_id, "x", Status.PENDING, clock(), dedupe="tok-1"
    )

    assert (first.duplicate, again.duplicate, token.duplicate, retried.duplicate) == (
        False,
        True,
        False,
        True,
    )
    sources = [e["kind"] for e in store.event_rows(notice_id) if e["kind"] == "callback"]
    assert len(sources) == 2


# -- outcomes that lose the race still count ------------------------------------------


def test_a_failure_recorded_after_a_takeover_makes_the_notice_due_at_once(
    store: Store, clock: FakeClock
) -> None:
    """A stale worker's `failed` loses its compare-and-set yet the fallback goes next round."""
    from resetctl import machine
    from resetctl.machine import OutcomeKind, SubmissionOutcome, SubmissionStarted
    from resetctl.store import OutcomeFacts, Step

    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock)
    transports = _transports(settings, store, clock, sms=provider)
    notice_id = _notice(store, clock, settings)
    # Worker A claims, writes its intent, and its call hangs past the lease.
    (claim,) = store.claim_due("A", clock(), 60, 10)
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    policy = store.load_policy(loaded.policy_name, loaded.policy_version)
    key = f"{notice_id}:sms:1"
    state = machine.apply(loaded.state, SubmissionStarted("sms", key, False, 30.0), clock())
    decision = machine.decide(loaded.state, policy, clock())
    from resetctl.store import IntentFacts

    won = store.record_step(
        Step(
            notice_id, loaded.version, claim.lease_token, loaded.state.phase, decision,
            False, IntentFacts(key, "sms", "fakeprovider", "v1", 1, False, 30.0),
            "intent", "A", clock(), channel="sms",
        )
    )  # fmt: skip
    assert won.won
    # B takes over after the lease and parks the in-doubt attempt (lookups find nothing).
    clock.advance(61)
    provider.lookup = lambda *_: None  # type: ignore[method-assign]
    run_sweep(store, settings, clock, transports, worker="B")
    parked = store.load_notice(notice_id)
    assert parked is not None
    assert parked.due_at is not None
    assert parked.due_at > clock()
    # A's reply finally arrives: refused for good. Its write loses, but is evidence.
    outcome = SubmissionOutcome("sms", OutcomeKind.PERMANENT)
    state, decision = machine.transition(state, policy, outcome, clock())
    lost = store.record_step(
        Step(
            notice_id, won.version, claim.lease_token, Phase.PRIMARY_PENDING, decision,
            True, OutcomeFacts(key, machine.AttemptState.REJECTED, None, None, None, "refused"),
            "outcome", "A", clock(), channel="sms",
        )
    )  # fmt: skip
    assert not lost.won
    due = store.load_notice(notice_id)
    assert due is not None
    assert due.due_at == clock()

    run_sweep(store, settings, clock, transports, worker="C")

    assert [m["channel"] for m in store.outbox_messages(notice_id)] == ["email"]


# -- the first message goes out now ---------------------------------------------------


def test_enqueue_with_send_submits_before_returning(store: Store, clock: FakeClock) -> None:
    """enqueue(send=True): committed, claimed and submitted; results say so."""
    settings = make_settings()
    results = enqueue(
        store, settings, [reset_request(), reset_request()], clock(), send=True, clock=clock
    )

    assert [r.submitted for r in results] == [True, True]
    for result in results:
        assert [m["channel"] for m in store.outbox_messages(result.notice_id)] == ["email"]
        assert json.loads(json.dumps(result.to_json()))["submitted"] is True


def test_enqueue_with_send_reports_a_failed_call_and_keeps_the_notice(
    store: Store, clock: FakeClock
) -> None:
    """A transient failure: submitted false, the notice durable and due for cron."""
    settings = make_settings()
    provider = FakeProvider(clock)

    def down(message: Message, key: str) -> ProviderStatus:
        raise TransientError("connection refused")

    provider.submit = down  # type: ignore[method-assign]
    transports = _transports(settings, store, clock, email=provider)
    (result,) = enqueue(
        store, settings, [reset_request()], clock(), send=True, transports=transports, clock=clock
    )

    assert result.submitted is False
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.due_at is not None
    assert loaded.lease_owner is None


def test_an_idle_sweep_sends_a_new_notice_within_a_second(store: Store, clock: FakeClock) -> None:
    """While `sweep --max-runtime 30s` idles, a notice enqueued without --send waits ≤ 1 s."""
    settings = make_settings()
    enqueued: list[float] = []
    start = clock()

    def sleep(seconds: float) -> None:
        assert seconds <= 1.0  # the idle loop looks again at least once a second
        clock.advance(seconds)
        if not enqueued and clock() >= start + 7.3:
            enqueued.append(clock())
            _notice(store, clock, settings)

    sweeper = Sweeper(store, settings, build_transports(settings, store, clock), clock=clock,
                      sleep=sleep)  # fmt: skip
    summary = sweeper.run(SweepOptions("idle", 50, 60, max_runtime=30))

    assert summary.submitted == 1
    (message,) = store.outbox_messages()
    assert 0 <= message["submitted_at"] - enqueued[0] <= 1.0


# -- --max-runtime is a bound ---------------------------------------------------------


def test_max_runtime_bounds_a_sweep_over_a_large_backlog(store: Store, clock: FakeClock) -> None:
    """A 3 s run over 2,000 due notices stops claiming and calling, and hands back the rest."""
    settings = make_settings()
    enqueue(store, settings, [reset_request() for _ in range(2000)], clock())
    provider = FakeProvider(clock, initial="accepted", call_timeout=0.5)
    real_submit = provider.submit

    def slow(message: Message, key: str) -> ProviderStatus:
        clock.advance(0.01)  # 10 ms per provider call
        return real_submit(message, key)

    provider.submit = slow  # type: ignore[method-assign]
    transports = _transports(settings, store, clock, email=provider)
    start = clock()

    summary = run_sweep(store, settings, clock, transports, max_runtime=3)

    assert clock() - start <= 3 + provider.call_timeout
    assert 0 < summary.submitted < 2000
    assert summary.released > 0
    leased = [n for n in store.live_notices() if n.lease_owner is not None and n.lease_owner != ""]
    assert leased == []
    # Nothing was lost: every notice is submitted or still due, and none twice.
    assert max(provider.calls.values()) == 1
    assert len(provider.created) == summary.submitted


def test_stop_hands_back_what_it_holds(store: Store, clock: FakeClock) -> None:
    """stop() (SIGTERM) mid-batch: no new call, leases released, the summary counts them."""
    settings = make_settings()
    enqueue(store, settings, [reset_request() for _ in range(20)], clock())
    provider = FakeProvider(clock, initial="accepted")
    sweeper: Sweeper | None = None
    real_submit = provider.submit

    def stop_after_five(message: Message, key: str) -> ProviderStatus:
        reply = real_submit(message, key)
        if len(provider.created) == 5:
            assert sweeper is not None
            sweeper.stop()
        return reply

    provider.submit = stop_after_five  # type: ignore[method-assign]
    sweeper = Sweeper(store, settings, _transports(settings, store, clock, email=provider),
                      clock=clock, sleep=clock.sleep)  # fmt: skip
    summary = sweeper.run(SweepOptions("w", 50, 60, max_runtime=55))

    assert summary.submitted == 5
    assert summary.declined + summary.released >= 15
    assert all(n.lease_owner is None for n in store.live_notices())
    due = [n for n in store.live_notices() if n.due_at is not None and n.due_at <= clock()]
    assert len(due) == 15


# -- inspect: the action budget -------------------------------------------------------


def test_inspect_shows_the_fallback_deadline_and_what_counts_as_success(
    store: Store, clock: FakeClock
) -> None:
    """inspect says until when a fallback is possible and which statuses end each channel."""
    settings = make_settings(outbox={"email_status": "pending"})
    notice_id = _notice(store, clock, settings)
    run_sweep(store, settings, clock)

    report = notice_report(store, notice_id, clock() + 60)
    budget = report["action_budget"]
    assert budget["fallback_channel"] == "sms"
    assert budget["seconds_to_fallback_deadline"] == 600 - 180 - 60
    assert budget["fallback_possible"] is True
    assert budget["success_statuses"] == {"email": ["accepted", "delivered"], "sms": ["delivered"]}

    late = notice_report(store, notice_id, clock() + 500)["action_budget"]
    assert late["fallback_possible"] is False


# -- a late sweep reads once ----------------------------------------------------------


def test_a_late_sweep_collapses_past_poll_slots_into_one_read(
    store: Store, clock: FakeClock
) -> None:
    """With the 15 s and 45 s slots both past, one read; the next goes to the 105 s slot."""
    settings = make_settings(outbox={"email_status": "pending"})
    notice_id = _notice(store, clock, settings)
    run_sweep(store, settings, clock)
    clock.advance(50)
    run_sweep(store, settings, clock)

    (attempt,) = store.attempt_rows(notice_id)
    assert attempt["polls"] == 1
    report = notice_report(store, notice_id, clock())
    assert report["next_action"]["action"] == "poll"
    assert report["next_action"]["due_in_seconds"] == pytest.approx(105 - 50)


def test_refused_primary_is_a_failure_not_a_retry(store: Store, clock: FakeClock) -> None:
    """A permanent refusal escalates at once: the person still gets the fallback."""
    settings = make_settings(policy=SMS_FIRST)
    provider = FakeProvider(clock, script=["refused"])
    notice_id = _notice(store, clock, settings)

    run_sweep(store, settings, clock, _transports(settings, store, clock, sms=provider))

    assert _phase(store, notice_id) == ("accepted", "accepted")
    assert [m["channel"] for m in store.outbox_messages(notice_id)] == ["email"]
