"""Ambiguous Twilio submissions over real HTTP on loopback, through real sweeps: a 504
after the message was created, a dropped connection, a 5xx that created nothing, a 429.
The person gets one text, whatever the provider answered."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep
from providers_twilio import FakeTwilio
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.transports import build_transports, close_transports
from resetctl.transports.twilio import compute_signature

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}


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
    """A 500 may or may not have created it: two not-found lookups 30 s apart, both
    once Twilio could have listed it, then one resend."""
    settings = _settings(twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = ["error"]

    _sweep(store, settings, clock)  # the call, and a lookup at once (too soon to count)
    assert twilio.messages == {}
    clock.advance(10)
    _sweep(store, settings, clock)
    clock.advance(20)
    _sweep(store, settings, clock)  # the first not-found that counts
    assert len(twilio.requests) == 1  # no resend before the second lookup
    clock.advance(30)
    _sweep(store, settings, clock)

    assert len(twilio.requests) == 2
    assert len(twilio.messages) == 1
    assert len(twilio.list_queries) == 3
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 2)


def test_a_429_pauses_the_lane_and_is_sent_again_without_spending_a_retry(
    store: Store, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """429 provably created nothing and is no attempt: the lane waits out the pause and
    sends it again under the same key, in the same sweep, with no lookup."""
    settings = _settings(twilio)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = ["throttle"]

    _sweep(store, settings, clock)

    assert len(twilio.requests) == 2
    assert len(twilio.messages) == 1
    assert twilio.list_queries == []
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 1)


def test_a_callback_names_the_attempt_whose_reply_was_lost(
    store: Store, clock: FakeClock, twilio: FakeTwilio, db_path: Path
) -> None:
    """`observe twilio` matches a signed callback by the attempt in its URL; a replay is
    stored once, and so is a retry carrying the same idempotency token."""
    settings = make_settings(
        transport={"sms": "twilio"},
        twilio={
            "base_url": twilio.base_url,
            "from": SENDER,
            "status_callback": "https://hooks.acme.example/twilio?site=eu",
        },
        policy={"default": {"channels": ["sms", "email"]}},
    )
    (result,) = enqueue(store, settings, [reset_request()], clock())
    twilio.outcomes = ["hangup"]
    twilio.list_outcomes = ["error"]  # the lookup cannot tell either
    _sweep(store, settings, clock)
    (sid,) = twilio.messages
    url = twilio.requests[0]["StatusCallback"]
    key = f"{result.notice_id}:sms:1"
    assert url.startswith("https://hooks.acme.example/twilio?")
    assert parse_qs(urlsplit(url).query) == {"site": ["eu"], "attempt": [key]}
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["message_id"]) == ("ambiguous", None)

    form = {"MessageSid": sid, "MessageStatus": "delivered", "AccountSid": ACCOUNT_SID}
    body = urlencode(form)
    signature = compute_signature(url, form, AUTH_TOKEN)
    env = {"TWILIO_AUTH_TOKEN": AUTH_TOKEN}

    def observe(*extra: str) -> subprocess.CompletedProcess[str]:
        args = ("observe", "twilio", "--url", url, "--signature", signature, "--json", *extra)
        return resetctl(*args, db=db_path, input=body, env=env)

    first = observe()
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["new_phase"] == "accepted"
    again = observe()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["duplicate"] is True
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["message_id"]) == ("submitted", sid)
    callbacks = [e for e in store.event_rows(result.notice_id) if e["kind"] == "callback"]
    assert len(callbacks) == 1

    form["MessageStatus"] = "read"
    body = urlencode(form)
    signature = compute_signature(url, form, AUTH_TOKEN)
    token = observe("--idempotency-token", "tok-7")
    retry = observe("--idempotency-token", "tok-7")
    assert token.returncode == 0, token.stderr
    assert retry.returncode == 0, retry.stderr
    assert [json.loads(token.stdout)["duplicate"], json.loads(retry.stdout)["duplicate"]] == [
        False,
        True,
    ]
