"""The Mailgun transport: the shared contract, classification of every failure, status
from the Events API and recovery by lookup, against a Mailgun-shaped server on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import T0, FakeClock
from contract import SECRET_EMAIL, SECRET_URL, TransportContract, assert_no_secrets, email_message
from fakes import look_up
from providers_http import closed_port_url
from providers_mailgun import API_KEY, DOMAIN, SENDER, FakeMailgun

from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.policy import Sender
from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    ThrottledError,
    TransientError,
    TransportContext,
    TransportPlugin,
)
from resetctl.transports.base import ProviderStatus, body_digest, call_timeout, supports_lookup
from resetctl.transports.mailgun import (
    DEFAULT_LOOKUP_SETTLE,
    EU_BASE_URL,
    MAILGUN_STATUSES,
    PLUGIN,
    MailgunRefused,
    MailgunTransport,
    normalize,
)

KEY = "ntc_1:email:1"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def mailgun(clock: FakeClock) -> Iterator[FakeMailgun]:
    fake = FakeMailgun(clock)
    yield fake
    fake.close()
    assert fake.problems == []


MakeTransport = Callable[..., MailgunTransport]


def context(store: Store, clock: Callable[[], float], **table: Any) -> TransportContext:
    return TransportContext(
        name="mailgun",
        channel="email",
        options=table,
        secret={"MAILGUN_API_KEY": API_KEY}.get,
        store=store,
        clock=clock,
    )


@pytest.fixture
def make_transport(mailgun: FakeMailgun, store: Store, clock: FakeClock) -> Iterator[MakeTransport]:
    """Build transports through the plugin factory; options override the defaults."""
    built: list[MailgunTransport] = []

    def make(**options: Any) -> MailgunTransport:
        table = {"base_url": mailgun.base_url, "domain": DOMAIN, "from": SENDER, **options}
        transport = PLUGIN.create(context(store, clock, **table))
        assert isinstance(transport, MailgunTransport)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        transport.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    # Everything down to httpcore's debug lines must stay free of the secrets.
    caplog.set_level("DEBUG")
    return caplog


@dataclass
class MailgunHarness:
    transport: MailgunTransport
    server: FakeMailgun
    caplog: pytest.LogCaptureFixture
    plugin: TransportPlugin = PLUGIN
    channel: str = "email"
    reports_later_statuses: bool = True

    def message(self) -> Message:
        return email_message()

    def script(self, outcome: str) -> None:
        sends = {"accept": "accept", "reject": "reject", "transient": "rate-limit"}
        self.server.script(sends.get(outcome, "hang-up"))

    def report(self, message_id: str, outcome: str) -> None:
        if outcome == "delivered":
            self.server.add_event(message_id, "delivered")
        else:
            self.server.add_event(message_id, "failed", "permanent")

    def logs(self) -> str:
        return self.caplog.text


class TestMailgunContract(TransportContract):
    @pytest.fixture
    def harness(
        self, make_transport: MakeTransport, mailgun: FakeMailgun, logs: pytest.LogCaptureFixture
    ) -> MailgunHarness:
        return MailgunHarness(make_transport(), mailgun, logs)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        ("accepted", Status.PENDING),
        ("delivered", Status.DELIVERED),
        ("failed/temporary", Status.PENDING),
        ("failed/permanent", Status.FAILED),
        ("failed", Status.UNKNOWN),
        ("rejected", Status.FAILED),
        ("opened", Status.UNKNOWN),
        ("complained", Status.UNKNOWN),
        ("Delivered", Status.UNKNOWN),
        ("", Status.UNKNOWN),
    ],
)
def test_normalize_maps_mailgun_events(raw: str, status: Status) -> None:
    """Each delivery event maps to its row of the table; anything else is unknown."""
    assert normalize(raw) is status


def test_vocabulary_is_the_plugins() -> None:
    """The plugin carries this module's statuses and mapping, serves email, reads webhooks."""
    assert PLUGIN.name == "mailgun"
    assert PLUGIN.vocabulary.known == MAILGUN_STATUSES
    assert PLUGIN.vocabulary.normalize is normalize
    assert PLUGIN.channels == frozenset({"email"})
    assert PLUGIN.callbacks is not None


def test_send_is_the_documented_form_with_tracking_off(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """The send is Mailgun's multipart form: sender, body, attempt key, all tracking off."""
    message = email_message()
    reply = make_transport().submit(message, "ntc_shape:email:1")
    assert message.email is not None
    assert mailgun.sent[reply.message_id] == {
        "from": SENDER,
        "to": SECRET_EMAIL,
        "subject": message.email.subject,
        "text": message.email.text,
        "html": message.email.html,
        "o:tracking": "no",
        "o:tracking-clicks": "no",
        "o:tracking-opens": "no",
        "v:attempt_key": "ntc_shape:email:1",
    }
    # The id as events and webhooks carry it (no angle brackets); queued is not sent.
    assert "<" not in reply.message_id
    assert (reply.raw_status, reply.status) == ("accepted", Status.PENDING)


def test_the_policys_sender_and_reply_to_are_sent(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """A region's sender replaces [mailgun] from; its Reply-To goes as h:Reply-To."""
    sender = Sender("reset@eu.acme.example", "Acme, EU", "help@eu.acme.example")
    message = Message("email", "ntc_eu", SECRET_EMAIL, 4e9, email_message().email, sender=sender)
    transport = make_transport()
    reply = transport.submit(message, KEY)
    sent = mailgun.sent[reply.message_id]
    assert sent["from"] == '"Acme, EU" <reset@eu.acme.example>'
    assert sent["h:Reply-To"] == "help@eu.acme.example"
    assert transport.fingerprint(message) == {
        "from": '"Acme, EU" <reset@eu.acme.example>',
        "reply_to": "help@eu.acme.example",
        "body_sha256": body_digest(email_message().email.text),  # type: ignore[union-attr]
        "marker": "user-variables.attempt_key",
    }


@pytest.mark.parametrize(("outcome", "code"), [("reject", 400), ("forbidden", 403)])
def test_refusals_keep_the_status_not_the_message(
    make_transport: MakeTransport, mailgun: FakeMailgun, outcome: str, code: int
) -> None:
    """A 4xx is permanent and keeps only its HTTP status: Mailgun's text quotes the address."""
    mailgun.script(outcome)
    with pytest.raises(MailgunRefused) as raised:
        make_transport().submit(email_message(), KEY)
    assert raised.value.http_status == code
    assert_no_secrets(f"{raised.value!s} {raised.value!r}", API_KEY)
    assert mailgun.sent == {}


def test_a_wrong_key_is_permanent_and_never_echoed(
    make_transport: MakeTransport, mailgun: FakeMailgun, store: Store, clock: FakeClock
) -> None:
    """A 401 is a permanent refusal whose message and repr hold no key."""
    table = {"base_url": mailgun.base_url, "domain": DOMAIN, "from": SENDER}
    wrong = replace(
        context(store, clock, **table), secret={"MAILGUN_API_KEY": "key-wrong-77a1"}.get
    )
    transport = PLUGIN.create(wrong)
    try:
        with pytest.raises(MailgunRefused) as raised:
            transport.submit(email_message(), KEY)
    finally:
        transport.close()
    assert raised.value.http_status == 401
    assert "key-wrong-77a1" not in f"{raised.value!s} {raised.value!r} {transport!r}"


def test_a_rate_limit_is_throttled_and_nothing_was_sent(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """A 429 means Mailgun queued nothing: throttled, with its Retry-After."""
    mailgun.script("rate-limit")
    with pytest.raises(ThrottledError) as raised:
        make_transport().submit(email_message(), KEY)
    assert raised.value.retry_after == 7.0
    assert mailgun.sent == {}


@pytest.mark.parametrize(("outcome", "queued"), [("error", 0), ("created-503", 1), ("no-id", 1)])
def test_a_5xx_or_a_reply_without_an_id_is_ambiguous(
    make_transport: MakeTransport,
    mailgun: FakeMailgun,
    logs: pytest.LogCaptureFixture,
    outcome: str,
    queued: int,
) -> None:
    """Any 5xx to a send, or a 200 without an id, may follow Mailgun queuing it."""
    mailgun.script(outcome)
    with pytest.raises(AmbiguousError) as raised:
        make_transport().submit(email_message(), KEY)
    assert len(mailgun.sent) == queued
    assert_no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}", API_KEY)


@pytest.mark.parametrize("outcome", ["hang-up", "stall"])
def test_no_answer_after_sending_is_ambiguous(
    make_transport: MakeTransport, mailgun: FakeMailgun, outcome: str
) -> None:
    """A send Mailgun queued but never answered (dropped, or timed out) is ambiguous."""
    mailgun.script(outcome)
    transport = make_transport(read_timeout=0.2)
    with pytest.raises(AmbiguousError) as raised:
        transport.submit(email_message(), "ntc_silent:email:1")
    assert_no_secrets(f"{raised.value!s} {raised.value!r}", API_KEY)
    assert len(mailgun.sent) == 1
    # The pool recovers: the next send goes through on a fresh connection.
    assert transport.submit(email_message(), "ntc_silent:email:2").message_id


def test_a_refused_connection_is_transient(make_transport: MakeTransport) -> None:
    """Nothing listening means nothing was sent: transient for a send and every read."""
    transport = make_transport(base_url=closed_port_url())
    with pytest.raises(TransientError) as raised:
        transport.submit(email_message(), KEY)
    assert not isinstance(raised.value, AmbiguousError)
    with pytest.raises(TransientError):
        transport.status(f"20260101000000.1.AB@{DOMAIN}")
    with pytest.raises(TransientError):
        look_up(transport, email_message(), KEY, T0)


@pytest.mark.parametrize("outcome", ["created-503", "hang-up"])
def test_lookup_recovers_an_ambiguous_send_without_sending_again(
    make_transport: MakeTransport,
    mailgun: FakeMailgun,
    logs: pytest.LogCaptureFixture,
    outcome: str,
) -> None:
    """After a 503 or a dropped reply, lookup by attempt key finds the one message."""
    transport = make_transport()
    mailgun.script(outcome)
    with pytest.raises(AmbiguousError):
        transport.submit(email_message(), KEY)
    (message_id,) = mailgun.sent
    found = look_up(transport, email_message(), KEY, T0)
    assert found == ProviderStatus(message_id, "accepted", Status.PENDING)
    assert transport.status(message_id).message_id == message_id
    assert len(mailgun.sent) == 1
    assert_no_secrets(logs.text, API_KEY)


def test_a_lookup_before_the_events_settle_proves_nothing(
    make_transport: MakeTransport, mailgun: FakeMailgun, clock: FakeClock
) -> None:
    """Events trail sends: found once listed, which is why not-found waits lookup_settle."""
    mailgun.events_lag = 90.0
    transport = make_transport()
    mailgun.script("hang-up")
    with pytest.raises(AmbiguousError):
        transport.submit(email_message(), KEY)
    assert look_up(transport, email_message(), KEY, T0) is None
    assert transport.lookup_settle == DEFAULT_LOOKUP_SETTLE > mailgun.events_lag
    clock.now += 90
    found = look_up(transport, email_message(), KEY, T0)
    assert found is not None
    assert [found.message_id] == list(mailgun.sent)


@pytest.mark.parametrize(
    ("events", "raw", "status"),
    [
        ([("delivered", None)], "delivered", Status.DELIVERED),
        ([("failed", "permanent")], "failed/permanent", Status.FAILED),
        ([("failed", "temporary")], "failed/temporary", Status.PENDING),
    ],
)
def test_lookup_reads_the_found_messages_latest_event(
    make_transport: MakeTransport,
    mailgun: FakeMailgun,
    events: list[tuple[str, str | None]],
    raw: str,
    status: Status,
) -> None:
    """A found message's status is its latest delivery event: a bounce shows as failed."""
    transport = make_transport()
    mailgun.script("hang-up")
    with pytest.raises(AmbiguousError):
        transport.submit(email_message(), KEY)
    (message_id,) = mailgun.sent
    for at, (kind, severity) in enumerate(events, start=1):
        mailgun.add_event(message_id, kind, severity, at=T0 + at)
    assert look_up(transport, email_message(), KEY, T0) == ProviderStatus(message_id, raw, status)


@pytest.mark.parametrize("filters_events", [True, False], ids=["filtered", "filters-ignored"])
def test_lookup_matches_only_what_this_attempt_sent(
    make_transport: MakeTransport, mailgun: FakeMailgun, filters_events: bool
) -> None:
    """Another attempt's email, another address or an earlier send is never taken for ours."""
    mailgun.filters_events = filters_events
    transport = make_transport()
    transport.submit(email_message(), "ntc_other:email:1")
    other = Message("email", "ntc_x", "other@example.org", 4e9, email_message().email)
    transport.submit(other, KEY)
    assert look_up(transport, email_message(), KEY, T0) is None
    ours = transport.submit(email_message(), KEY)
    found = look_up(transport, email_message(), KEY, T0)
    assert found is not None
    assert found.message_id == ours.message_id


def test_lookup_matches_the_sender_recorded_not_todays(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """A send is found by the From it named, even after [mailgun] from changed."""
    before = make_transport()
    sent = before.fingerprint(email_message())
    mailgun.script("hang-up")
    with pytest.raises(AmbiguousError):
        before.submit(email_message(), KEY)
    after = make_transport(**{"from": "Acme <resets@mg.acme.example>"})
    found = after.lookup(SECRET_EMAIL, KEY, T0, sent)
    assert found is not None
    moved = {**sent, "from": "Other <someone@elsewhere.example>"}
    assert after.lookup(SECRET_EMAIL, KEY, T0, moved) is None


def test_lookup_skips_events_from_before_the_send(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """The lookup's time range starts at the attempt (less clock skew), oldest first."""
    transport = make_transport()
    message_id = mailgun.queue(
        {"from": SENDER, "to": SECRET_EMAIL, "text": "old", "v:attempt_key": KEY}, at=T0 - 600
    )
    assert look_up(transport, email_message(), KEY, T0) is None
    assert look_up(transport, email_message(), KEY, T0 - 601) == ProviderStatus(
        message_id, "accepted", Status.PENDING
    )
    assert mailgun.queries[0] == {
        "recipient": [SECRET_EMAIL],
        "begin": [str(int(T0) - 60)],
        "ascending": ["yes"],
        "limit": ["300"],
    }


def test_a_full_page_without_ours_is_not_a_not_found(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """When the recipient's events fill a page, ours may be on the next: nothing is proved."""
    transport = make_transport()
    for n in range(300):
        fields = {"from": SENDER, "to": SECRET_EMAIL, "text": "x", "v:attempt_key": f"o:{n}"}
        mailgun.queue(fields, at=T0 + n / 1000)
    ours = mailgun.queue(
        {"from": SENDER, "to": SECRET_EMAIL, "text": "x", "v:attempt_key": KEY}, at=T0 + 1
    )
    with pytest.raises(TransientError):
        look_up(transport, email_message(), KEY, T0)
    # Mailgun's next page URL serves the rest of the same query: ours is there.
    query = {"recipient": SECRET_EMAIL, "begin": str(T0), "ascending": "yes", "limit": "300"}
    first = mailgun.page(f"{mailgun.base_url}/v3/{DOMAIN}/events?{urlencode(query)}")
    assert len(first["items"]) == 300
    second = mailgun.page(first["paging"]["next"])
    assert [e["message"]["headers"]["message-id"] for e in second["items"]] == [ours]


@pytest.mark.parametrize("outcome", ["error", "rate-limit", "hang-up", "stall"])
def test_a_failed_lookup_is_transient(
    make_transport: MakeTransport,
    mailgun: FakeMailgun,
    logs: pytest.LogCaptureFixture,
    outcome: str,
) -> None:
    """A 500, a 429, a dropped connection or a read time-out on a lookup proves nothing."""
    transport = make_transport(read_timeout=0.2)
    transport.submit(email_message(), KEY)
    mailgun.events_outcomes.append(outcome)
    with pytest.raises(TransientError) as raised:
        look_up(transport, email_message(), KEY, T0)
    assert isinstance(raised.value, ThrottledError) is (outcome == "rate-limit")
    assert_no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}", API_KEY)


def test_lookup_url_is_redacted_in_httpx_logs(
    make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request URL; an events read's (which holds the address) loses its query."""
    look_up(make_transport(), email_message(), KEY, T0)
    assert f"/v3/{DOMAIN}/events?<redacted>" in logs.text
    assert_no_secrets(logs.text, API_KEY)


@pytest.mark.parametrize(
    ("events", "raw", "status"),
    [
        ([], "accepted", Status.PENDING),
        ([("failed", "temporary", 5)], "failed/temporary", Status.PENDING),
        ([("failed", "temporary", 5), ("delivered", None, 9)], "delivered", Status.DELIVERED),
        # Events are not listed in order: the later one wins by its timestamp.
        ([("delivered", None, 9), ("failed", "temporary", 5)], "delivered", Status.DELIVERED),
        ([("failed", "permanent", 5)], "failed/permanent", Status.FAILED),
        # A delayed bounce after the recipient's server took it.
        ([("delivered", None, 5), ("failed", "permanent", 60)], "failed/permanent", Status.FAILED),
        ([("rejected", None, 1)], "rejected", Status.FAILED),
        # Not delivery statuses: an open, a click or a complaint changes nothing read here.
        ([("delivered", None, 5), ("opened", None, 30)], "delivered", Status.DELIVERED),
        ([("clicked", None, 30), ("complained", None, 40)], "accepted", Status.PENDING),
        # A failure without a severity: stored as Mailgun said it, normalized to unknown.
        ([("failed", None, 5)], "failed", Status.UNKNOWN),
        # An event type Mailgun does not document says nothing about delivery.
        ([("archived", None, 5)], "accepted", Status.PENDING),
    ],
)
def test_status_reads_the_latest_delivery_event(
    make_transport: MakeTransport,
    mailgun: FakeMailgun,
    events: list[tuple[str, str | None, float]],
    raw: str,
    status: Status,
) -> None:
    """A status read takes the latest delivery event by its timestamp."""
    transport = make_transport()
    message_id = transport.submit(email_message(), KEY).message_id
    for kind, severity, at in events:
        mailgun.add_event(message_id, kind, severity, at=T0 + at)
    assert transport.status(message_id) == ProviderStatus(message_id, raw, status)


def test_status_asks_for_the_message_newest_first(
    make_transport: MakeTransport, mailgun: FakeMailgun
) -> None:
    """The read filters by the bracket-less message id, back from just past our now."""
    transport = make_transport()
    message_id = transport.submit(email_message(), KEY).message_id
    assert transport.status(f"<{message_id}>").message_id == message_id
    assert mailgun.queries[-1] == {
        "message-id": [message_id],
        "begin": [str(int(T0) + 60)],
        "ascending": ["no"],
        "limit": ["300"],
    }


@pytest.mark.parametrize("outcome", ["lag", "error", "rate-limit", "hang-up"])
def test_a_status_read_that_says_nothing_is_transient(
    make_transport: MakeTransport, mailgun: FakeMailgun, outcome: str
) -> None:
    """No event listed yet, or a failed read: transient (a 429 throttles), never a status."""
    transport = make_transport(read_timeout=0.2)
    if outcome == "lag":
        mailgun.events_lag = 30.0
    else:
        mailgun.events_outcomes.append(outcome)
    message_id = transport.submit(email_message(), KEY).message_id
    with pytest.raises(TransientError) as raised:
        transport.status(message_id)
    assert isinstance(raised.value, ThrottledError) is (outcome == "rate-limit")


def test_nothing_the_transport_shows_holds_a_secret(
    make_transport: MakeTransport, mailgun: FakeMailgun, logs: pytest.LogCaptureFixture
) -> None:
    """Its repr, its fingerprint and its log lines hold no key, address, body or link."""
    transport = make_transport()
    message_id = transport.submit(email_message(), KEY).message_id
    mailgun.add_event(message_id, "failed", "permanent")
    transport.status(message_id)
    look_up(transport, email_message(), KEY, T0)
    shown = f"{transport!r} {transport.fingerprint(email_message())} {logs.text}"
    assert_no_secrets(shown, API_KEY)
    assert SECRET_URL not in shown


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"base_url": EU_BASE_URL}, 2 * 5.0 + 2 * 10.0),
        ({"connect_timeout": 1, "read_timeout": 2.5}, 1 + 2 * 2.5),
    ],
    ids=["https-defaults", "http-loopback"],
)
def test_call_timeout_bounds_connect_write_and_read(
    make_transport: MakeTransport, options: dict[str, Any], expected: float
) -> None:
    """call_timeout adds connect (twice over TLS: connect, handshake), write and read."""
    transport = make_transport(**options)
    assert transport.call_timeout == expected
    assert call_timeout(transport) == expected


@pytest.mark.parametrize(("value", "settle"), [(None, 1800.0), (45, 45.0), ("10m", 600.0)])
def test_lookup_settle_defaults_to_mailguns_half_hour(
    make_transport: MakeTransport, value: object, settle: float
) -> None:
    """lookup_settle takes seconds or a duration; by default Mailgun's own half hour."""
    transport = make_transport(**({} if value is None else {"lookup_settle": value}))
    assert transport.lookup_settle == settle
    assert supports_lookup(transport)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"domain": DOMAIN, "from": SENDER, "track_clicks": "yes"}, "mailgun.track_clicks"),
        ({"from": SENDER}, "mailgun.domain"),
        ({"domain": "mg.acme.example/v3", "from": SENDER}, "mailgun.domain"),
        ({"domain": DOMAIN}, "mailgun.from"),
        ({"domain": DOMAIN, "from": " "}, "mailgun.from"),
        ({"domain": DOMAIN, "from": SENDER, "read_timeout": 0}, "mailgun.read_timeout"),
        ({"domain": DOMAIN, "from": SENDER, "connect_timeout": True}, "mailgun.connect_timeout"),
        ({"domain": DOMAIN, "from": SENDER, "base_url": "api.mailgun.net"}, "mailgun.base_url"),
        (
            {"domain": DOMAIN, "from": SENDER, "base_url": "http://api.mailgun.net"},
            "mailgun.base_url",
        ),
        ({"domain": DOMAIN, "from": SENDER, "lookup_settle": 7200}, "mailgun.lookup_settle"),
        ({"domain": DOMAIN, "from": SENDER, "lookup_settle": "soon"}, "mailgun.lookup_settle"),
        (
            {"domain": DOMAIN, "from": SENDER, "webhook_url": "http://hooks.acme.example/mg"},
            "mailgun.webhook_url",
        ),
    ],
)
def test_bad_options_name_their_key(store: Store, table: dict[str, Any], named: str) -> None:
    """An unknown, missing or malformed [mailgun] option fails naming mailgun.<key>."""
    with pytest.raises(ConfigError) as raised:
        PLUGIN.create(context(store, time.time, **table))
    assert str(raised.value).startswith(named)
    assert API_KEY not in str(raised.value)


@pytest.mark.parametrize("value", [None, "", "kéy-1", " key-2"])
def test_a_missing_or_unusable_key_names_the_variable(store: Store, value: str | None) -> None:
    """Without a usable MAILGUN_API_KEY, building fails naming the variable (no value)."""
    ctx = TransportContext(
        name="mailgun",
        channel="email",
        options={"domain": DOMAIN, "from": SENDER},
        secret={"MAILGUN_API_KEY": value}.get if value is not None else {}.get,
        store=store,
        clock=time.time,
    )
    with pytest.raises(ConfigError, match="MAILGUN_API_KEY") as raised:
        PLUGIN.create(ctx)
    assert not value or value not in str(raised.value)


def test_a_non_email_message_is_refused(make_transport: MakeTransport) -> None:
    """A message with no rendered email is a permanent error, sent nowhere."""
    message = Message("sms", "ntc_sms", "+61491570157", 4e9)
    with pytest.raises(PermanentError):
        make_transport().submit(message, KEY)
