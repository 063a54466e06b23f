"""The Twilio transport: the shared contract, classification of every failure, recovery
by lookup, and status callbacks, against a fake Twilio on loopback that checks each
request against Twilio's own OpenAPI description."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from conftest import T0, FakeClock
from contract import SECRET_PHONE, TransportContract, assert_no_secrets, sms_message
from fakes import look_up
from providers_http import closed_port_url
from providers_twilio import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    CALLBACK_URL,
    DOCUMENTED_STATUSES,
    SENDER,
    SERVICE_SID,
    FakeTwilio,
)

from resetctl.config import settings_from_mapping
from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    TransientError,
    TransportContext,
    TransportPlugin,
    build_transports,
    plugin,
)
from resetctl.transports.base import ProviderStatus, call_timeout, supports_lookup
from resetctl.transports.twilio import (
    CLOCK_SKEW,
    LOOKUP_PAGE_SIZE,
    PLUGIN,
    TRIAL_PREFIX,
    TWILIO_STATUSES,
    VALIDITY_PERIOD_MAX,
    TwilioRefused,
    TwilioTransport,
    attempt_from_callback_url,
    callback_status,
    callback_url_for_attempt,
    compute_signature,
    normalize,
    verify_signature,
)


def _no_secrets(text: str) -> None:
    assert_no_secrets(text, AUTH_TOKEN)


@pytest.fixture
def fake(twilio: FakeTwilio) -> FakeTwilio:
    """conftest's loopback Twilio, under this file's name for it."""
    return twilio


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


MakeTransport = Callable[..., TwilioTransport]


@pytest.fixture
def make_transport(
    fake: FakeTwilio, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> Iterator[MakeTransport]:
    """Build a transport through the plugin factory, as a sweep would."""
    built: list[TwilioTransport] = []

    def make(**options: Any) -> TwilioTransport:
        table: dict[str, Any] = {"base_url": fake.base_url, "from": SENDER}
        table.update(options)
        table = {key: value for key, value in table.items() if value is not None}
        secrets = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
        context = TransportContext("twilio", "sms", table, secrets.get, store, clock)
        transport = PLUGIN.create(context)
        assert isinstance(transport, TwilioTransport)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        transport.close()


@dataclass
class TwilioHarness:
    transport: TwilioTransport
    plugin: TransportPlugin
    fake: FakeTwilio
    caplog: pytest.LogCaptureFixture
    channel: str = "sms"
    reports_later_statuses: bool = True

    def message(self) -> Message:
        return sms_message()

    def script(self, outcome: str) -> None:
        scripted = {
            "accept": "accept",
            "reject": "reject",
            "transient": "throttle",
            "ambiguous": "created-504",
        }
        self.fake.outcomes.append(scripted[outcome])

    def report(self, message_id: str, outcome: str) -> None:
        self.fake.set_status(
            message_id, {"delivered": "delivered", "failed": "undelivered"}[outcome]
        )

    def logs(self) -> str:
        return self.caplog.text


class TestTwilioContract(TransportContract):
    @pytest.fixture
    def harness(
        self, fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
    ) -> TwilioHarness:
        return TwilioHarness(make_transport(), PLUGIN, fake, logs)


#: The attempt key every submission here uses, as the callback URL's query carries it.
ATTEMPT_QUERY = "?attempt=ntc_1%3Asms%3A1"


def _expiring_in(seconds: float) -> Message:
    return sms_message(expires_at=T0 + seconds)


@pytest.mark.parametrize(
    ("options", "sender", "initial"),
    [
        ({}, {"From": SENDER}, "queued"),
        (
            {"from": None, "messaging_service_sid": SERVICE_SID, "status_callback": CALLBACK_URL},
            {"MessagingServiceSid": SERVICE_SID, "StatusCallback": CALLBACK_URL + ATTEMPT_QUERY},
            "accepted",
        ),
    ],
    ids=["from", "messaging-service"],
)
def test_create_request_is_the_documented_form(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    options: dict[str, Any],
    sender: dict[str, str],
    initial: str,
) -> None:
    """The create is a spec-valid form with To, the sender, Body and ValidityPeriod."""
    message = _expiring_in(600)
    assert message.sms is not None
    reply = make_transport(**options).submit(message, "ntc_1:sms:1")
    expected = {"To": SECRET_PHONE, "Body": message.sms.body, "ValidityPeriod": 600, **sender}
    assert fake.requests == [expected]
    assert reply.message_id in fake.messages
    # Twilio's documented initial status: queued, or accepted through a messaging service.
    assert (reply.raw_status, reply.status) == (initial, Status.PENDING)


@pytest.mark.parametrize(
    ("lifetime", "validity"),
    [
        (600.7, 600),
        (1.0, 1),
        (1.99, 1),
        (36_000.0, 36_000),
        (36_000.9, 36_000),
        (86_400.0, VALIDITY_PERIOD_MAX),
    ],
)
def test_validity_period_is_the_remaining_lifetime_clamped(
    fake: FakeTwilio, make_transport: MakeTransport, lifetime: float, validity: int
) -> None:
    """ValidityPeriod is the link's whole seconds left, within Twilio's 1 to 36000."""
    make_transport().submit(_expiring_in(lifetime), "ntc_1:sms:1")
    assert fake.requests[-1]["ValidityPeriod"] == validity


def test_validity_period_reads_the_clock_at_submission(
    fake: FakeTwilio, make_transport: MakeTransport, clock: FakeClock
) -> None:
    """Time spent before the submission is taken off the ValidityPeriod."""
    transport = make_transport()
    clock.advance(100)
    transport.submit(_expiring_in(600), "ntc_1:sms:1")
    assert fake.requests[-1]["ValidityPeriod"] == 500


@pytest.mark.parametrize("lifetime", [0.99, 0.0, -30.0])
def test_dead_link_is_refused_without_a_request(
    fake: FakeTwilio, make_transport: MakeTransport, lifetime: float
) -> None:
    """A link with under a second to live is a permanent refusal and never reaches Twilio."""
    with pytest.raises(PermanentError) as raised:
        make_transport().submit(_expiring_in(lifetime), "ntc_1:sms:1")
    assert fake.hits == 0
    _no_secrets(f"{raised.value!s} {raised.value!r}")


STATUS_TABLE = [
    ("queued", Status.PENDING),
    ("accepted", Status.PENDING),
    ("scheduled", Status.PENDING),
    ("sending", Status.PENDING),
    ("sent", Status.ACCEPTED),
    ("delivered", Status.DELIVERED),
    ("read", Status.DELIVERED),
    ("failed", Status.FAILED),
    ("undelivered", Status.FAILED),
    ("canceled", Status.FAILED),
    ("receiving", Status.UNKNOWN),
    ("received", Status.UNKNOWN),
    ("partially_delivered", Status.UNKNOWN),
]


def test_status_table_covers_every_documented_status() -> None:
    """The transport knows exactly the statuses Twilio's spec lists; the table covers them."""
    assert frozenset(raw for raw, _ in STATUS_TABLE) == DOCUMENTED_STATUSES == TWILIO_STATUSES
    assert plugin("twilio") is PLUGIN
    assert PLUGIN.vocabulary.known == TWILIO_STATUSES
    assert normalize("some_status_twilio_adds_later") is Status.UNKNOWN


@pytest.mark.parametrize(("raw", "expected"), STATUS_TABLE)
def test_status_read_maps_each_documented_status(
    fake: FakeTwilio, make_transport: MakeTransport, raw: str, expected: Status
) -> None:
    """A fetched Message's status normalizes as the table says."""
    transport = make_transport()
    sid = transport.submit(sms_message(), "ntc_1:sms:1").message_id
    fake.set_status(sid, raw)
    reply = transport.status(sid)
    assert (reply.message_id, reply.raw_status, reply.status) == (sid, raw, expected)
    assert PLUGIN.vocabulary.normalize(raw) is expected


@pytest.mark.parametrize(
    ("outcome", "error", "created"),
    [
        ("throttle", TransientError, 0),
        ("error", AmbiguousError, 0),
        ("created-504", AmbiguousError, 1),
        ("hangup", AmbiguousError, 1),
        ("stall", AmbiguousError, 1),
    ],
    ids=["429", "500", "504-after-create", "dropped-after-create", "read-timeout"],
)
def test_submit_failures_are_classified(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    logs: pytest.LogCaptureFixture,
    outcome: str,
    error: type[Exception],
    created: int,
) -> None:
    """Only a 429 is transient; any 5xx, a lost reply or a read time-out is ambiguous."""
    transport = make_transport(read_timeout=0.2)
    fake.outcomes.append(outcome)
    with pytest.raises(error) as raised:
        transport.submit(sms_message(), "ntc_1:sms:1")
    assert len(fake.requests) == 1
    # Ambiguity is real: Twilio created the message whose reply was lost.
    assert len(fake.messages) == created
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_refused_connection_is_transient(
    make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """Nothing listening means nothing reached Twilio: transient, for a status read too."""
    transport = make_transport(base_url=closed_port_url())
    with pytest.raises(TransientError) as raised:
        transport.submit(sms_message(), "ntc_1:sms:1")
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")
    with pytest.raises(TransientError):
        transport.status("SM" + "0" * 32)


def test_rejection_carries_the_code_but_not_twilios_message(
    fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """A 400 is permanent with Twilio's code; its text, which quotes the number, is dropped."""
    fake.outcomes.append("reject")
    with pytest.raises(TwilioRefused) as raised:
        make_transport().submit(sms_message(), "ntc_1:sms:1")
    assert raised.value.code == 21211
    assert raised.value.http_status == 400
    assert "21211" in str(raised.value)
    assert "To number" in str(raised.value)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_wrong_credentials_are_refused_without_echoing_the_token(
    fake: FakeTwilio, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """A 401 is permanent with code 20003, and neither token appears anywhere."""
    wrong = "wrong-token-canary-0c55"
    transport = TwilioTransport(
        ACCOUNT_SID, wrong, sender=SENDER, base_url=fake.base_url, clock=clock
    )
    try:
        with pytest.raises(TwilioRefused) as raised:
            transport.submit(sms_message(), "ntc_1:sms:1")
        assert raised.value.code == 20003
        text = f"{raised.value!s} {raised.value!r} {transport!r} {logs.text}"
        _no_secrets(text)
        assert wrong not in text
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("outcome", "error", "code"),
    [
        ("error", TransientError, None),
        ("hangup", TransientError, None),
        ("unknown", TwilioRefused, 20404),
    ],
)
def test_status_read_failures_are_classified(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    outcome: str,
    error: type[Exception],
    code: int | None,
) -> None:
    """A failed read is transient (reads are safe to repeat); an unknown sid is permanent."""
    transport = make_transport()
    sid = transport.submit(sms_message(), "ntc_1:sms:1").message_id
    if outcome == "unknown":
        sid = "SM" + "9" * 32
    else:
        fake.fetch_outcomes.append(outcome)
    with pytest.raises(error) as raised:
        transport.status(sid)
    assert getattr(raised.value, "code", None) == code


@pytest.mark.parametrize(
    ("failure", "on_submit"),
    [
        (httpx.ConnectError, TransientError),
        (httpx.ConnectTimeout, TransientError),
        (httpx.PoolTimeout, TransientError),
        (httpx.WriteTimeout, AmbiguousError),
        (httpx.WriteError, AmbiguousError),
        (httpx.ReadTimeout, AmbiguousError),
        (httpx.ReadError, AmbiguousError),
        (httpx.RemoteProtocolError, AmbiguousError),
    ],
)
def test_every_httpx_failure_is_classified(
    clock: FakeClock, failure: type[httpx.TransportError], on_submit: type[Exception]
) -> None:
    """Only failures before the request left are transient on submit; all are on reads."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise failure(f"simulated, for {SECRET_PHONE}", request=request)

    transport = TwilioTransport(
        ACCOUNT_SID,
        AUTH_TOKEN,
        sender=SENDER,
        clock=clock,
        transport=httpx.MockTransport(fail),
    )
    try:
        with pytest.raises(on_submit) as raised:
            transport.submit(sms_message(), "ntc_1:sms:1")
        _no_secrets(f"{raised.value!s} {raised.value!r}")
        with pytest.raises(TransientError):
            transport.status("SM" + "0" * 32)
        with pytest.raises(TransientError) as raised:
            look_up(transport, sms_message(), "ntc_1:sms:1", T0)
        _no_secrets(f"{raised.value!s} {raised.value!r}")
    finally:
        transport.close()


def test_created_reply_without_a_sid_is_ambiguous(clock: FakeClock) -> None:
    """A 2xx that cannot be read still means Twilio has the message: ambiguous, not resent."""
    transport = TwilioTransport(
        ACCOUNT_SID,
        AUTH_TOKEN,
        sender=SENDER,
        clock=clock,
        transport=httpx.MockTransport(lambda request: httpx.Response(201, text="<html>")),
    )
    try:
        with pytest.raises(AmbiguousError):
            transport.submit(sms_message(), "ntc_1:sms:1")
    finally:
        transport.close()


KEY = "ntc_1:sms:1"


def _body(message: Message) -> str:
    assert message.sms is not None
    return message.sms.body


@pytest.mark.parametrize("outcome", ["created-504", "hangup"])
def test_lookup_finds_the_message_an_ambiguous_submit_created(
    fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture, outcome: str
) -> None:
    """After a 504 or a dropped reply, lookup returns the one message Twilio holds."""
    transport = make_transport()
    fake.outcomes.append(outcome)
    with pytest.raises(AmbiguousError):
        transport.submit(sms_message(), KEY)
    (sid,) = fake.messages
    found = look_up(transport, sms_message(), KEY, T0)
    assert found == ProviderStatus(sid, "queued", Status.PENDING)
    fake.set_status(sid, "delivered")
    assert look_up(transport, sms_message(), KEY, T0) == ProviderStatus(
        sid, "delivered", Status.DELIVERED
    )
    assert len(fake.messages) == 1
    _no_secrets(logs.text)


def test_lookup_returns_none_when_nothing_was_created(
    fake: FakeTwilio, make_transport: MakeTransport
) -> None:
    """A 429 created nothing, and lookup says so."""
    transport = make_transport()
    fake.outcomes.append("throttle")
    with pytest.raises(TransientError):
        transport.submit(sms_message(), KEY)
    assert look_up(transport, sms_message(), KEY, T0) is None
    assert fake.messages == {}


@pytest.mark.parametrize(
    ("to", "body", "created", "found"),
    [
        (SECRET_PHONE, "ours", T0, True),
        (SECRET_PHONE, "ours", T0 - CLOCK_SKEW, True),
        (SECRET_PHONE, "ours", T0 - CLOCK_SKEW - 1, False),
        (SECRET_PHONE, "ours", T0 - 86_400, False),
        (SECRET_PHONE, "another", T0, False),
        (SECRET_PHONE, "longer", T0, False),
        (SECRET_PHONE, "trial", T0, True),
        (SECRET_PHONE, "trial", T0 - CLOCK_SKEW, True),
        (SECRET_PHONE, "trial", T0 - CLOCK_SKEW - 1, False),
        (SECRET_PHONE, "trial-of-another", T0, False),
        ("+61491570158", "ours", T0, False),
    ],
    ids=[
        "ours",
        "within-clock-skew",
        "just-before-since",
        "a-day-before-since",
        "another-body",
        "body-not-exact",
        "trial-prefixed",
        "trial-prefixed-within-clock-skew",
        "trial-prefixed-just-before-since",
        "trial-prefixed-another-body",
        "another-number",
    ],
)
def test_lookup_matches_the_body_created_since(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    to: str,
    body: str,
    created: float,
    found: bool,
) -> None:
    """Only a message to the number, our body bare or trial-prefixed, created since, is ours."""
    message = sms_message()
    bodies = {
        "ours": _body(message),
        "another": "Acme: your order has shipped.",
        "longer": _body(message) + " ",
        "trial": TRIAL_PREFIX + _body(message),
        "trial-of-another": TRIAL_PREFIX + "Acme: your order has shipped.",
    }
    sid = fake.add_message(to, bodies[body], created=created)
    result = look_up(make_transport(), message, KEY, T0)
    assert result == (ProviderStatus(sid, "queued", Status.PENDING) if found else None)


def test_lookup_picks_ours_among_other_messages(
    fake: FakeTwilio, make_transport: MakeTransport
) -> None:
    """Older and other messages to the same number do not hide or replace ours."""
    message = sms_message()
    fake.add_message(SECRET_PHONE, _body(message), created=T0 - 7200)
    fake.add_message(SECRET_PHONE, "Acme: your code is 123456", created=T0 + 5)
    ours = fake.add_message(SECRET_PHONE, _body(message), created=T0 + 1)
    result = look_up(make_transport(), message, KEY, T0)
    assert result is not None
    assert result.message_id == ours


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"To": [SECRET_PHONE], "From": [SENDER], "PageSize": [str(LOOKUP_PAGE_SIZE)]}),
        (
            {"from": None, "messaging_service_sid": SERVICE_SID},
            {"To": [SECRET_PHONE], "PageSize": [str(LOOKUP_PAGE_SIZE)]},
        ),
    ],
    ids=["from", "messaging-service"],
)
def test_lookup_request_is_the_documented_list_without_a_date_sent_filter(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    options: dict[str, Any],
    expected: dict[str, list[str]],
) -> None:
    """The lookup is a spec-valid list by To (and From), never filtered by DateSent."""
    look_up(make_transport(**options), sms_message(), KEY, T0)
    assert fake.list_queries == [expected]
    assert fake.violations == []


@pytest.mark.parametrize(
    "query",
    [
        {"To": SECRET_PHONE, "PageSize": "0"},
        {"To": SECRET_PHONE, "PageSize": "fifty"},
        {"To": "0491 570 157"},
        {"To": SECRET_PHONE, "DateCreated>": "2026-01-01"},
    ],
    ids=["page-size-zero", "page-size-text", "to-not-e164", "no-such-filter"],
)
def test_fake_twilio_refuses_off_spec_list_queries(fake: FakeTwilio, query: dict[str, str]) -> None:
    """The fake's list check has teeth: an off-spec query is a 400 and a recorded violation."""
    url = f"{fake.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    with httpx.Client(auth=(ACCOUNT_SID, AUTH_TOKEN)) as client:
        assert client.get(url, params=query).status_code == 400
    assert fake.violations
    fake.violations.clear()


@pytest.mark.parametrize("outcome", ["error", "throttle", "hangup", "stall"])
def test_a_failed_lookup_is_transient(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    logs: pytest.LogCaptureFixture,
    outcome: str,
) -> None:
    """A 503, a 429, a dropped connection or a read time-out on a lookup proves nothing."""
    transport = make_transport(read_timeout=0.2)
    transport.submit(sms_message(), KEY)
    fake.list_outcomes.append(outcome)
    with pytest.raises(TransientError) as raised:
        look_up(transport, sms_message(), KEY, T0)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_a_lookup_that_cannot_reach_twilio_is_transient(make_transport: MakeTransport) -> None:
    """A refused connection on a lookup is transient, not a not-found."""
    transport = make_transport(base_url=closed_port_url())
    with pytest.raises(TransientError):
        look_up(transport, sms_message(), KEY, T0)


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, text="<html>"),
        httpx.Response(200, json={"page": 0}),
        httpx.Response(401, json={"code": 20003, "message": "Authenticate", "status": 401}),
    ],
    ids=["not-json", "no-messages", "unauthorized"],
)
def test_an_unreadable_or_refused_lookup_is_transient(
    clock: FakeClock, reply: httpx.Response
) -> None:
    """A lookup reply without a message list is a failed read, never a not-found."""
    transport = TwilioTransport(
        ACCOUNT_SID,
        AUTH_TOKEN,
        sender=SENDER,
        clock=clock,
        transport=httpx.MockTransport(lambda request: reply),
    )
    try:
        with pytest.raises(TransientError):
            look_up(transport, sms_message(), KEY, T0)
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("recent", "outcome"),
    [(LOOKUP_PAGE_SIZE, TransientError), (LOOKUP_PAGE_SIZE - 1, None)],
    ids=["page-all-since", "page-reaches-before-since"],
)
def test_a_full_page_proves_absence_only_when_it_reaches_back_past_since(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    recent: int,
    outcome: type[Exception] | None,
) -> None:
    """Not found on a full page is a not-found only if the page goes back before since."""
    for n in range(recent):
        fake.add_message(SECRET_PHONE, f"Acme: code {n}", created=T0 + 10)
    for age in (7200, 9000):
        fake.add_message(SECRET_PHONE, "Acme: an old one", created=T0 - age)
    transport = make_transport()
    if outcome is None:
        assert look_up(transport, sms_message(), KEY, T0) is None
    else:
        with pytest.raises(outcome):
            look_up(transport, sms_message(), KEY, T0)


def test_lookup_url_is_redacted_in_httpx_logs(
    fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request URL; a lookup's (which holds the number) loses its query."""
    look_up(make_transport(), sms_message(), KEY, T0)
    assert "Messages.json?<redacted>" in logs.text
    _no_secrets(logs.text)


@pytest.mark.parametrize(
    ("callback", "sent"),
    [
        (CALLBACK_URL, CALLBACK_URL + ATTEMPT_QUERY),
        (
            CALLBACK_URL + "?tenant=acme&sig=a%2Fb+c",
            CALLBACK_URL + "?tenant=acme&sig=a%2Fb+c&attempt=ntc_1%3Asms%3A1",
        ),
        (
            CALLBACK_URL + "?attempt=stale&tenant=acme",
            CALLBACK_URL + "?tenant=acme&attempt=ntc_1%3Asms%3A1",
        ),
    ],
    ids=["plain", "existing-query", "stale-attempt"],
)
def test_status_callback_carries_the_attempt_key(
    fake: FakeTwilio, make_transport: MakeTransport, callback: str, sent: str
) -> None:
    """StatusCallback is the configured URL with attempt=<key> merged into its query."""
    make_transport(status_callback=callback).submit(sms_message(), KEY)
    assert fake.requests[-1]["StatusCallback"] == sent
    assert attempt_from_callback_url(sent) == KEY
    assert dict(parse_qsl(urlsplit(sent).query)) == {
        **dict(parse_qsl(urlsplit(callback).query)),
        "attempt": KEY,
    }


@pytest.mark.parametrize(
    "url",
    [
        CALLBACK_URL,
        CALLBACK_URL + "?attempt=",
        CALLBACK_URL + "?attempt=a&attempt=b",
        "not a url",
    ],
)
def test_a_callback_url_without_one_attempt_key_gives_none(url: str) -> None:
    """No attempt parameter, an empty one or two of them: no attempt key."""
    assert attempt_from_callback_url(url) is None


def test_callback_url_round_trips_any_attempt_key() -> None:
    """Whatever the key holds, the callback URL gives it back unchanged."""
    key = "ntc_a&b=c d/é:sms:2"
    url = callback_url_for_attempt(CALLBACK_URL + "?x=1", key)
    assert attempt_from_callback_url(url) == key
    assert url.startswith(CALLBACK_URL + "?x=1&attempt=")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"base_url": "https://api.twilio.com"}, 2 * 5.0 + 2 * 10.0),
        ({"connect_timeout": 1, "read_timeout": 2.5}, 1 + 2 * 2.5),
    ],
    ids=["https-defaults", "http"],
)
def test_call_timeout_bounds_connect_write_and_read(
    make_transport: MakeTransport, options: dict[str, Any], expected: float
) -> None:
    """call_timeout adds connect (twice over TLS: connect, handshake), write and read."""
    transport = make_transport(**options)
    assert transport.call_timeout == expected
    assert call_timeout(transport) == expected


@pytest.mark.parametrize(("value", "settle"), [(None, 30.0), (45, 45.0), ("2m", 120.0)])
def test_lookup_settle_is_a_duration_defaulting_to_30s(
    make_transport: MakeTransport, value: object, settle: float
) -> None:
    """lookup_settle takes seconds or a duration; the transport can recover by lookup."""
    transport = make_transport(lookup_settle=value)
    assert transport.lookup_settle == settle
    assert supports_lookup(transport)


def _build(twilio: dict[str, Any], environ: dict[str, str], store: Store) -> TwilioTransport:
    settings = settings_from_mapping({"transport": {"sms": "twilio"}, "twilio": twilio})
    transport = build_transports(settings, store, FakeClock(), environ)["sms"]
    assert isinstance(transport, TwilioTransport)
    return transport


def test_missing_auth_token_is_a_config_error_naming_it(store: Store) -> None:
    """No TWILIO_AUTH_TOKEN fails the build, naming the variable and no value."""
    with pytest.raises(ConfigError) as raised:
        _build({"from": SENDER}, {"TWILIO_ACCOUNT_SID": ACCOUNT_SID}, store)
    assert "TWILIO_AUTH_TOKEN" in str(raised.value)
    assert ACCOUNT_SID not in str(raised.value)


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({}, "twilio.from"),
        ({"from": SENDER, "messaging_service_sid": SERVICE_SID}, "twilio.from"),
        ({"messaging_service_sid": "MG123"}, "twilio.messaging_service_sid"),
        ({"from": SENDER, "read_timeout": 0}, "twilio.read_timeout"),
        ({"from": SENDER, "connect_timeout": "5"}, "twilio.connect_timeout"),
        ({"from": SENDER, "status_callback": "hooks.example/x"}, "twilio.status_callback"),
        ({"from": SENDER, "base_url": "ftp://api.twilio.com"}, "twilio.base_url"),
        ({"from": SENDER, "sender": SENDER}, "twilio.sender"),
        ({"from": SENDER, "lookup_settle": 0}, "twilio.lookup_settle"),
        ({"from": SENDER, "lookup_settle": "soon"}, "twilio.lookup_settle"),
        ({"from": SENDER, "lookup_settle": True}, "twilio.lookup_settle"),
        ({"from": SENDER, "lookup_settle": 7200}, "twilio.lookup_settle"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(
    store: Store, table: dict[str, Any], names: str
) -> None:
    """Each invalid [twilio] option fails the build with its dotted name."""
    secrets = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
    with pytest.raises(ConfigError, match=re.escape(names)) as raised:
        _build(table, secrets, store)
    _no_secrets(str(raised.value))


def test_credentials_file_supplies_the_secrets(
    fake: FakeTwilio, store: Store, tmp_path: Path
) -> None:
    """Secrets from the TOML credentials_file authenticate against Twilio."""
    credentials = tmp_path / "twilio.toml"
    credentials.write_text(
        f'TWILIO_ACCOUNT_SID = "{ACCOUNT_SID}"\nTWILIO_AUTH_TOKEN = "{AUTH_TOKEN}"\n'
    )
    credentials.chmod(0o600)  # resetctl refuses a credentials file others can read
    table = {"from": SENDER, "base_url": fake.base_url, "credentials_file": str(credentials)}
    transport = _build(table, {}, store)
    try:
        reply = transport.submit(sms_message(), "ntc_1:sms:1")
        assert reply.message_id in fake.messages
        _no_secrets(repr(transport))
    finally:
        transport.close()


#: Twilio's published signature example: auth token 12345 and this URL and these
#: params. The vector with +14158675309 is the one in twilio-python's validator tests;
#: the one with +12349013030 is in Twilio's webhooks-security documentation.
VECTOR_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"


def _vector_params(caller: str) -> dict[str, str]:
    return {
        "CallSid": "CA1234567890ABCDE",
        "Caller": caller,
        "Digits": "1234",
        "From": caller,
        "To": "+18005551212",
    }


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
        ("+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="),
    ],
)
def test_twilios_published_signature_verifies(caller: str, expected: str) -> None:
    """Twilio's own example request and signature verify."""
    params = _vector_params(caller)
    assert compute_signature(VECTOR_URL, params, "12345") == expected
    assert verify_signature(VECTOR_URL, params, expected, "12345")


def _altered(params: dict[str, str], **changes: str) -> dict[str, str]:
    return {**params, **changes}


@pytest.mark.parametrize(
    ("url", "params", "signature", "token"),
    [
        (VECTOR_URL, _vector_params("+14158675309"), "RSOYDt4T1cUTdK1PDd93/VVr8B8x", "12345"),
        (VECTOR_URL, _vector_params("+14158675309"), "", "12345"),
        (VECTOR_URL, _altered(_vector_params("+14158675309"), Digits="1235"), None, "12345"),
        (VECTOR_URL, _altered(_vector_params("+14158675309"), Extra="1"), None, "12345"),
        (VECTOR_URL.replace("foo=1", "foo=2"), _vector_params("+14158675309"), None, "12345"),
        (VECTOR_URL.replace("https", "http"), _vector_params("+14158675309"), None, "12345"),
        (VECTOR_URL, _vector_params("+14158675309"), None, "12346"),
        (VECTOR_URL, _vector_params("+14158675309"), "RSOYDt4T1cUTdK1PDd93/VVr8B8=é", "12345"),
    ],
    ids=[
        "forged",
        "empty",
        "param-changed",
        "param-added",
        "url-changed",
        "scheme-changed",
        "wrong-token",
        "non-ascii",
    ],
)
def test_forged_or_altered_signatures_are_refused(
    url: str, params: dict[str, str], signature: str | None, token: str
) -> None:
    """Any change to the URL, a param, the token or the signature fails verification."""
    published = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert not verify_signature(url, params, published if signature is None else signature, token)


#: A status callback as Twilio posts it (form-encoded), for an SMS through a number.
CALLBACK_BODY = (
    "ApiVersion=2010-04-01&AccountSid=AC0123456789abcdef0123456789abcdef"
    "&SmsSid=SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801&SmsStatus=delivered"
    "&MessageSid=SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801&MessageStatus=delivered"
    "&From=%2B15005550006&To=%2B61491570157&RawDlrDoneDate=2601011200"
)


def test_callback_status_reads_a_signed_callback_body() -> None:
    """A real-shaped callback body gives (MessageSid, MessageStatus) and its signature checks."""
    params = dict(parse_qsl(CALLBACK_BODY, keep_blank_values=True))
    assert callback_status(params) == ("SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801", "delivered")
    signed = compute_signature(CALLBACK_URL, params, AUTH_TOKEN)
    assert verify_signature(CALLBACK_URL, params, signed, AUTH_TOKEN)
    assert not verify_signature(
        CALLBACK_URL, {**params, "MessageStatus": "failed"}, signed, AUTH_TOKEN
    )


@pytest.mark.parametrize("missing", ["MessageSid", "MessageStatus"])
def test_callback_status_names_a_missing_field(missing: str) -> None:
    """A callback body without MessageSid or MessageStatus is a ValueError naming it."""
    params = dict(parse_qsl(CALLBACK_BODY))
    del params[missing]
    with pytest.raises(ValueError, match=missing):
        callback_status(params)


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"From": SENDER, "Body": "x"}, "'To' is a required property"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "ValidityPeriod": "ten"}, "integer"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "ValidityPeriod": "0"}, "36000"),
        ({"To": SECRET_PHONE, "MessagingServiceSid": "MG1", "Body": "x"}, "MessagingServiceSid"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "Validity": "60"}, "Validity:"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "StatusCallback": "a_b"}, "uri"),
    ],
)
def test_fake_twilio_refuses_off_spec_requests(
    fake: FakeTwilio, form: dict[str, str], problem: str
) -> None:
    """The fake's spec check has teeth: an off-spec create is a 400 and a recorded violation."""
    url = f"{fake.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    with httpx.Client(auth=(ACCOUNT_SID, AUTH_TOKEN)) as client:
        assert client.post(url, data=form).status_code == 400
    assert any(problem in violation for violation in fake.violations), fake.violations
    fake.violations.clear()
