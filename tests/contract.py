"""The transport contract: one suite every transport must pass (outbox, SMTP, Postmark,
Twilio). A test module subclasses TransportContract and provides a `harness` fixture."""

from __future__ import annotations

import math
from typing import Protocol, cast
from urllib.parse import quote, quote_plus

import pytest
from fakes import look_up

from resetctl.machine import Status
from resetctl.render import EmailContent, SmsContent, SmsEncoding
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    TransientError,
    Transport,
    TransportPlugin,
)
from resetctl.transports.base import LookupTransport, call_timeout, supports_lookup

#: Distinctive secrets: none may appear in an exception, a repr or a log line.
SECRET_EMAIL = "canary.contract@example.org"
SECRET_PHONE = "+61491570157"
SECRET_URL = "https://shop.example/reset/CONTRACT-CANARY-93c1"


def email_message(notice_id: str = "ntc_contract", expires_at: float = 4e9) -> Message:
    return Message(
        "email",
        notice_id,
        SECRET_EMAIL,
        expires_at,
        email=EmailContent(
            subject="Your password reset link (expires in 10 min)",
            text=f"Hi,\n\nReset: {SECRET_URL}\n",
            html=f'<p><a href="{SECRET_URL}">Reset</a></p>',
        ),
    )


def sms_message(notice_id: str = "ntc_contract", expires_at: float = 4e9) -> Message:
    body = f"Acme: reset your password within 10 min:\n{SECRET_URL}"
    return Message(
        "sms", notice_id, SECRET_PHONE, expires_at, sms=SmsContent(body, SmsEncoding.GSM7, 1)
    )


class Harness(Protocol):
    """A transport under test and the provider (or fake provider) behind it."""

    transport: Transport
    plugin: TransportPlugin
    channel: str
    #: whether the provider reports later statuses (SMTP's 250 is final)
    reports_later_statuses: bool

    def message(self) -> Message:
        """A rendered message for this channel, holding the SECRET_* values."""
        ...

    def script(self, outcome: str) -> None:
        """Make the next submission end as "accept", "reject", "transient" or "ambiguous"."""
        ...

    def report(self, message_id: str, outcome: str) -> None:
        """Make the provider report "delivered" or "failed" for the message."""
        ...

    def logs(self) -> str:
        """Everything the transport wrote where a secret must not be (may be empty)."""
        ...


def assert_no_secrets(text: str, *more: str) -> None:
    """No SECRET_* value (nor any of ``more``) in ``text``, as is or URL-encoded (a
    request URL in a log line carries them encoded)."""
    for secret in (SECRET_EMAIL, SECRET_PHONE, SECRET_URL, SECRET_PHONE.lstrip("+"), *more):
        for form in {secret, quote(secret, safe=""), quote_plus(secret, safe="")}:
            assert form not in text, "a secret leaked"


class TransportContract:
    """Behaviour every transport shares; subclasses provide the `harness` fixture."""

    def test_accepted_submission_gives_a_message_id_and_statuses(self, harness: Harness) -> None:
        """A submission the provider takes returns its id, raw and normalized status."""
        harness.script("accept")
        reply = harness.transport.submit(harness.message(), "ntc_contract:x:1")
        assert reply.message_id
        assert reply.raw_status
        assert reply.status in (Status.PENDING, Status.ACCEPTED, Status.DELIVERED)
        assert harness.plugin.vocabulary.normalize(reply.raw_status) is reply.status

    def test_status_reports_the_outcome(self, harness: Harness) -> None:
        """A status read returns the provider's later word, normalized by the transport."""
        harness.script("accept")
        reply = harness.transport.submit(harness.message(), "ntc_contract:x:2")
        if not harness.reports_later_statuses:
            assert harness.transport.status(reply.message_id).status is reply.status
            return
        harness.report(reply.message_id, "delivered")
        assert harness.transport.status(reply.message_id).status.success
        harness.script("accept")
        other = harness.transport.submit(harness.message(), "ntc_contract:x:3")
        harness.report(other.message_id, "failed")
        assert harness.transport.status(other.message_id).status is Status.FAILED

    @pytest.mark.parametrize(
        ("outcome", "error"),
        [
            ("reject", PermanentError),
            ("transient", TransientError),
            ("ambiguous", AmbiguousError),
        ],
    )
    def test_failures_have_the_three_kinds_and_no_secrets(
        self, harness: Harness, outcome: str, error: type[Exception]
    ) -> None:
        """Refusals are permanent, nothing-accepted is transient, maybe-accepted ambiguous."""
        harness.script(outcome)
        with pytest.raises(error) as raised:
            harness.transport.submit(harness.message(), "ntc_contract:x:4")
        assert_no_secrets(f"{raised.value!s} {raised.value!r} {harness.logs()}")

    def test_same_key_is_recovered_when_the_transport_says_it_can(self, harness: Harness) -> None:
        """A transport that recovers by key returns the same message for the same key."""
        if not harness.transport.recovers_by_key:
            pytest.skip("this provider has no idempotency key: ambiguity is never resent")
        harness.script("accept")
        first = harness.transport.submit(harness.message(), "ntc_contract:x:5")
        harness.script("accept")
        again = harness.transport.submit(harness.message(), "ntc_contract:x:5")
        assert again.message_id == first.message_id

    def test_message_repr_and_vocabulary(self, harness: Harness) -> None:
        """A message's repr shows no secret; unknown raw statuses normalize to unknown."""
        assert_no_secrets(repr(harness.message()))
        vocabulary = harness.plugin.vocabulary
        assert vocabulary.normalize("no-such-status-ever") is Status.UNKNOWN
        for raw in vocabulary.known:
            assert isinstance(vocabulary.normalize(raw), Status)

    def test_call_timeout_is_a_finite_number_of_seconds(self, harness: Harness) -> None:
        """The longest one call can take is known, so a sweep can fit calls in its lease."""
        seconds = call_timeout(harness.transport)
        assert math.isfinite(seconds)
        assert seconds >= 0

    def test_lookup_finds_what_was_sent_and_nothing_before(self, harness: Harness) -> None:
        """Lookup finds nothing before a send, then the sent message under its id."""
        if not supports_lookup(harness.transport):
            pytest.skip("this transport has nothing to look up")
        transport = cast(LookupTransport, harness.transport)
        assert transport.lookup_settle > 0
        assert look_up(transport, harness.message(), "ntc_contract:x:6", 0.0) is None
        harness.script("accept")
        sent = transport.submit(harness.message(), "ntc_contract:x:6")
        found = look_up(transport, harness.message(), "ntc_contract:x:6", 0.0)
        assert found is not None
        assert found.message_id == sent.message_id
        assert harness.plugin.vocabulary.normalize(found.raw_status) is found.status
