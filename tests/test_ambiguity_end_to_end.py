"""Ambiguous Twilio submissions over real HTTP on loopback, through real sweeps: a 504
after the message was created, a dropped connection, a 5xx that created nothing, a 429.
The person gets one text, whatever the provider answered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep
from providers_twilio import FakeTwilio
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.transports import build_transports, close_transports

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}


@pytest.fixture
def twilio(clock: FakeClock) -> Iterator[FakeTwilio]:
    server = FakeTwilio(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


def _settings(twilio: FakeTwilio) -> Settings:
    return make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio.base_url, "from": SENDER},
        policy={"default": {"channels": ["sms", "email"]}},
    )


def _sweep(store: Store, settings: Settings, clock: FakeClock) -> None:
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)


@pytest.mark.parametrize("outcome", ["created-504", "hangup"])
def test_a_created_message_whose_reply_was_lost_is_found_not_resent(
    store: Store, clock: FakeClock, twilio: FakeTwilio, outcome: str
) -> None:
    """The create went through but its reply did not: one text, found by lookup, polled."""
    settings = _settings(twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = [outcome]

    _sweep(store, settings, clock)
    (sid,) = twilio.messages
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["message_id"]) == ("submitted", sid)
    twilio.set_status(sid, "delivered")
    clock.advance(15)
    _sweep(store, settings, clock)

    assert len(twilio.messages) == 1
    assert len(twilio.requests) == 1
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase == "accepted"
    assert store.outbox_messages(result.notice_id) == []  # no email fallback needed


def test_a_5xx_that_created_nothing_is_sent_once_after_two_empty_lookups(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """A 500 may or may not have created it: two lookups 30 s apart, then one resend."""
    settings = _settings(twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = ["error"]

    _sweep(store, settings, clock)
    assert twilio.messages == {}
    clock.advance(10)
    _sweep(store, settings, clock)
    assert len(twilio.requests) == 1  # no resend before the second lookup
    clock.advance(20)
    _sweep(store, settings, clock)

    assert len(twilio.requests) == 2
    assert len(twilio.messages) == 1
    assert len(twilio.list_queries) == 2
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 2)


def test_a_429_is_retried_under_the_same_key_without_a_lookup(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """429 provably created nothing: retried on the retry schedule, no lookup needed."""
    settings = _settings(twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = ["throttle"]

    _sweep(store, settings, clock)
    clock.advance(10)
    _sweep(store, settings, clock)

    assert len(twilio.messages) == 1
    assert twilio.list_queries == []
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 2)
