"""The Plivo transport: the shared contract, classification of every failure, recovery
by lookup (which, without a message text to match, refuses to guess) and status reads,
against a fake Plivo on loopback built from Plivo's documentation."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import T0, FakeClock
from contract import SECRET_PHONE, TransportContract, assert_no_secrets, sms_message
from fakes import look_up
from providers_http import closed_port_url
from providers_plivo import (
    AUTH_ID,
    AUTH_TOKEN,
    CALLBACK_URL,
    DOCUMENTED_STATES,
    POWERPACK,
    SENDER,
    FakePlivo,
    mock_transport,
    plivo_context,
)

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
from resetctl.transports.base import ProviderStatus, call_timeout, supports_lookup
from resetctl.transports.plivo import (
    CLOCK_SKEW,
    LOOKUP_PAGE_SIZE,
    MESSAGE_EXPIRY_MAX,
    PLIVO_STATUSES,
    PLUGIN,
    PlivoRefused,
    PlivoTransport,
    normalize,
)

KEY = "ntc_1:sms:1"
ATTEMPT_QUERY = "?attempt=ntc_1%3Asms%3A1"


def _no_secrets(text: str) -> None:
    assert_no_secrets(text, AUTH_TOKEN)


@pytest.fixture
def fake(clock: FakeClock) -> Iterator[FakePlivo]:
    """A Plivo API on loopback; the test fails on any request off Plivo's documentation."""
    server = FakePlivo(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


MakeTransport = Callable[..., PlivoTransport]


@pytest.fixture
def make_transport(
    fake: FakePlivo, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> Iterator[MakeTransport]:
    """Build a transport through the plugin factory, as a sweep would."""
    built: list[PlivoTransport] = []

    def make(**options: Any) -> PlivoTransport:
        table: dict[str, Any] = {"base_url": fake.base_url, "from": SENDER}
        table.update(options)
        table = {key: value for key, value in table.items() if value is not None}
        transport = PLUGIN.create(plivo_context(table, store, clock))
        assert isinstance(transport, PlivoTransport)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        transport.close()


@dataclass
class PlivoHarness:
    transport: PlivoTransport
    plugin: TransportPlugin
    fake: FakePlivo
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
            "ambiguous": "created-503",
        }
        self.fake.outcomes.append(scripted[outcome])

    def report(self, message_id: str, outcome: str) -> None:
        self.fake.set_status(
            message_id, {"delivered": "delivered", "failed": "undelivered"}[outcome]
        )

    def logs(self) -> str:
        return self.caplog.text


class TestPlivoContract(TransportContract):
    @pytest.fixture
    def harness(
        self, fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
    ) -> PlivoHarness:
        return PlivoHarness(make_transport(), PLUGIN, fake, logs)


def _expiring_in(seconds: float, sender: Sender | None = None) -> Message:
    message = sms_message(expires_at=T0 + seconds)
    return message if sender is None else replace(message, sender=sender)


@pytest.mark.parametrize(
    ("options", "sender"),
    [
        ({}, {"src": SENDER}),
        (
            {"from": None, "powerpack_uuid": POWERPACK, "status_callback": CALLBACK_URL},
            {"powerpack_uuid": POWERPACK, "url": CALLBACK_URL + ATTEMPT_QUERY, "method": "POST"},
        ),
    ],
    ids=["from", "powerpack"],
)
def test_send_request_is_the_documented_json(
    fake: FakePlivo, make_transport: MakeTransport, options: dict[str, Any], sender: dict[str, str]
) -> None:
    """The send is a documented JSON body: dst, text, type, message_expiry, the sender."""
    message = _expiring_in(600)
    reply = make_transport(**options).submit(message, KEY)
    assert message.sms is not None
    expected = {"dst": SECRET_PHONE, "text": message.sms.body, "type": "sms", "message_expiry": 600}
    assert fake.requests == [{**expected, **sender}]
    assert reply == ProviderStatus(reply.message_id, "queued", Status.PENDING)
    assert list(fake.messages) == [reply.message_id]


@pytest.mark.parametrize(
    ("sms_from", "field"),
    [("+442071838750", "src"), (POWERPACK, "powerpack_uuid")],
    ids=["number", "powerpack"],
)
def test_the_policys_sender_replaces_the_transports(
    fake: FakePlivo, make_transport: MakeTransport, sms_from: str, field: str
) -> None:
    """A policy's sender goes out as src, or as powerpack_uuid when it is a Powerpack."""
    transport = make_transport()
    message = _expiring_in(600, Sender(sms_from=sms_from))
    transport.submit(message, KEY)
    assert fake.requests[-1][field] == sms_from
    assert {"src", "powerpack_uuid"} & set(fake.requests[-1]) == {field}
    fingerprint = transport.fingerprint(message)
    assert fingerprint["from" if field == "src" else "service"] == sms_from


def test_a_twilio_service_as_policy_sender_is_refused_unsent(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """A Twilio messaging service named as sender is a permanent refusal, never sent."""
    message = _expiring_in(600, Sender(sms_from="MG" + "ab" * 16))
    with pytest.raises(PermanentError):
        make_transport().submit(message, KEY)
    assert fake.hits == 0


@pytest.mark.parametrize(
    ("lifetime", "expiry"),
    [(600.7, 600), (5.0, 5), (5.99, 5), (10_799.9, 10_799), (86_400.0, MESSAGE_EXPIRY_MAX)],
)
def test_message_expiry_is_the_remaining_lifetime_clamped(
    fake: FakePlivo, make_transport: MakeTransport, clock: FakeClock, lifetime: float, expiry: int
) -> None:
    """message_expiry is the link's whole seconds left, within Plivo's 5 to 10799."""
    make_transport().submit(_expiring_in(lifetime), KEY)
    assert fake.requests[-1]["message_expiry"] == expiry


def test_message_expiry_reads_the_clock_at_submission(
    fake: FakePlivo, make_transport: MakeTransport, clock: FakeClock
) -> None:
    """Time spent before the submission is taken off message_expiry."""
    transport = make_transport()
    clock.advance(100)
    transport.submit(_expiring_in(600), KEY)
    assert fake.requests[-1]["message_expiry"] == 500


@pytest.mark.parametrize("lifetime", [4.99, 1.0, 0.0, -30.0])
def test_dead_link_is_refused_without_a_request(
    fake: FakePlivo, make_transport: MakeTransport, lifetime: float
) -> None:
    """A link with under 5 seconds to live is a permanent refusal and never reaches Plivo."""
    with pytest.raises(PermanentError) as raised:
        make_transport().submit(_expiring_in(lifetime), KEY)
    assert fake.hits == 0
    _no_secrets(f"{raised.value!s} {raised.value!r}")


STATUS_TABLE = [
    ("queued", Status.PENDING),
    ("sent", Status.ACCEPTED),
    ("delivered", Status.DELIVERED),
    ("read", Status.DELIVERED),
    ("failed", Status.FAILED),
    ("undelivered", Status.FAILED),
    ("rejected", Status.FAILED),
    ("received", Status.UNKNOWN),
]


def test_status_table_covers_every_documented_state() -> None:
    """The transport knows exactly the states Plivo documents; the table covers them."""
    assert frozenset(raw for raw, _ in STATUS_TABLE) == DOCUMENTED_STATES == PLIVO_STATUSES
    assert PLUGIN.vocabulary.known == PLIVO_STATUSES
    assert normalize("some_state_plivo_adds_later") is Status.UNKNOWN


@pytest.mark.parametrize(("raw", "expected"), STATUS_TABLE)
def test_status_read_maps_each_documented_state(
    fake: FakePlivo, make_transport: MakeTransport, raw: str, expected: Status
) -> None:
    """A fetched record's message_state normalizes as the table says."""
    transport = make_transport()
    message_uuid = transport.submit(sms_message(), KEY).message_id
    fake.set_status(message_uuid, raw)
    assert transport.status(message_uuid) == ProviderStatus(message_uuid, raw, expected)


def test_an_undocumented_state_is_kept_as_its_length_only(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """A state Plivo does not document is stored as unknown:<length>, never its text."""
    transport = make_transport()
    message_uuid = transport.submit(sms_message(), KEY).message_id
    fake.set_status(message_uuid, SECRET_PHONE)
    reply = transport.status(message_uuid)
    assert (reply.raw_status, reply.status) == (f"unknown:{len(SECRET_PHONE)}", Status.UNKNOWN)


def test_a_failure_logs_plivos_error_code_never_its_text(
    fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """An undelivered record's error_code reaches the log; its error_message does not."""
    transport = make_transport()
    message_uuid = transport.submit(sms_message(), KEY).message_id
    fake.set_status(message_uuid, "undelivered", "300")
    fake.messages[message_uuid]["error_message"] = f"Handset {SECRET_PHONE} is off"
    assert transport.status(message_uuid).status is Status.FAILED
    assert "(error 300)" in logs.text
    _no_secrets(logs.text)


@pytest.mark.parametrize(
    ("outcome", "error", "created"),
    [
        ("throttle", ThrottledError, 0),
        ("error", AmbiguousError, 0),
        ("created-503", AmbiguousError, 1),
        ("hangup", AmbiguousError, 1),
        ("stall", AmbiguousError, 1),
    ],
    ids=["429", "500", "503-after-create", "dropped-after-create", "read-timeout"],
)
def test_submit_failures_are_classified(
    fake: FakePlivo,
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
        transport.submit(sms_message(), KEY)
    assert len(fake.requests) == 1
    # Ambiguity is real: Plivo queued the message whose reply was lost.
    assert len(fake.messages) == created
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), (None, None)])
def test_throttling_carries_retry_after(
    fake: FakePlivo, make_transport: MakeTransport, header: str | None, seconds: float | None
) -> None:
    """A 429 is a ThrottledError with Plivo's Retry-After, on a send and on a lookup."""
    transport = make_transport()
    fake.retry_after = header
    fake.outcomes.append("throttle")
    with pytest.raises(ThrottledError) as raised:
        transport.submit(sms_message(), KEY)
    assert raised.value.retry_after == seconds
    fake.list_outcomes.append("throttle")
    with pytest.raises(ThrottledError) as raised:
        look_up(transport, sms_message(), KEY, T0)
    assert raised.value.retry_after == seconds


def test_refused_connection_is_transient(
    make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """Nothing listening means nothing reached Plivo: transient, for a status read too."""
    transport = make_transport(base_url=closed_port_url())
    with pytest.raises(TransientError) as raised:
        transport.submit(sms_message(), KEY)
    assert not isinstance(raised.value, AmbiguousError)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")
    with pytest.raises(TransientError):
        transport.status("5b40a428-bfc7-4daf-9d06-726c558bf3b8")


def test_rejection_is_permanent_without_plivos_text(
    fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """A 400 is permanent with its HTTP status; Plivo's text, which quotes the number, is
    dropped."""
    fake.outcomes.append("reject")
    with pytest.raises(PlivoRefused) as raised:
        make_transport().submit(sms_message(), KEY)
    assert raised.value.http_status == 400
    assert "invalid" in str(raised.value)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_wrong_credentials_are_refused_without_echoing_the_token(
    fake: FakePlivo, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """A 401 is permanent and names the secrets to check, and no token appears anywhere."""
    wrong = "wrong-token-canary-0c55"
    transport = PlivoTransport(AUTH_ID, wrong, sender=SENDER, base_url=fake.base_url, clock=clock)
    try:
        with pytest.raises(PlivoRefused) as raised:
            transport.submit(sms_message(), KEY)
        assert raised.value.http_status == 401
        assert "PLIVO_AUTH_TOKEN" in str(raised.value)
        text = f"{raised.value!s} {raised.value!r} {transport!r} {logs.text}"
        _no_secrets(text)
        assert wrong not in text
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("outcome", "error"),
    [("error", TransientError), ("hangup", TransientError), ("unknown", PlivoRefused)],
)
def test_status_read_failures_are_classified(
    fake: FakePlivo, make_transport: MakeTransport, outcome: str, error: type[Exception]
) -> None:
    """A failed read is transient (reads are safe to repeat); an unknown uuid permanent."""
    transport = make_transport()
    message_uuid = transport.submit(sms_message(), KEY).message_id
    if outcome == "unknown":
        message_uuid = "00000000-0000-4000-8000-000000000000"
    else:
        fake.fetch_outcomes.append(outcome)
    with pytest.raises(error):
        transport.status(message_uuid)


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

    transport = mock_transport(clock, fail)
    try:
        with pytest.raises(on_submit) as raised:
            transport.submit(sms_message(), KEY)
        _no_secrets(f"{raised.value!s} {raised.value!r}")
        with pytest.raises(TransientError):
            transport.status("5b40a428-bfc7-4daf-9d06-726c558bf3b8")
        with pytest.raises(TransientError) as raised:
            look_up(transport, sms_message(), KEY, T0)
        _no_secrets(f"{raised.value!s} {raised.value!r}")
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (httpx.Response(202, text="<html>"), AmbiguousError),
        (httpx.Response(202, json={"message_uuid": []}), AmbiguousError),
        (httpx.Response(202, json={"message_uuid": ["a", "b"]}), AmbiguousError),
        (httpx.Response(202, json={"message_uuid": [], "invalid_number": ["1"]}), PlivoRefused),
    ],
    ids=["not-json", "no-uuid", "two-uuids", "invalid-number"],
)
def test_an_accepted_reply_without_one_uuid_is_ambiguous(
    clock: FakeClock, reply: httpx.Response, error: type[Exception]
) -> None:
    """A 2xx without one readable uuid still means Plivo may have it: never resent, unless
    Plivo names the number it would not queue."""
    transport = mock_transport(clock, lambda request: reply)
    try:
        with pytest.raises(error):
            transport.submit(sms_message(), KEY)
    finally:
        transport.close()


@pytest.mark.parametrize("outcome", ["created-503", "hangup"])
def test_lookup_recovers_the_message_an_ambiguous_send_created(
    fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture, outcome: str
) -> None:
    """After a 503 or a dropped reply, lookup returns the one message Plivo holds, and
    nothing is sent again."""
    transport = make_transport()
    fake.outcomes.append(outcome)
    with pytest.raises(AmbiguousError):
        transport.submit(sms_message(), KEY)
    (message_uuid,) = fake.messages
    assert look_up(transport, sms_message(), KEY, T0) == ProviderStatus(
        message_uuid, "queued", Status.PENDING
    )
    fake.set_status(message_uuid, "delivered")
    found = look_up(transport, sms_message(), KEY, T0)
    assert found == ProviderStatus(message_uuid, "delivered", Status.DELIVERED)
    assert len(fake.messages) == 1
    assert len(fake.requests) == 1
    _no_secrets(logs.text)


def test_lookup_returns_none_when_nothing_was_created(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """A 500 before creating queued nothing, and lookup says so."""
    transport = make_transport()
    fake.outcomes.append("error")
    with pytest.raises(AmbiguousError):
        transport.submit(sms_message(), KEY)
    assert look_up(transport, sms_message(), KEY, T0) is None
    assert fake.messages == {}


@pytest.mark.parametrize(
    ("to", "sender", "created", "fields", "found"),
    [
        (SECRET_PHONE, SENDER, T0, {}, True),
        (SECRET_PHONE, SENDER, T0 - CLOCK_SKEW, {}, True),
        (SECRET_PHONE, SENDER, T0 - CLOCK_SKEW - 1, {}, False),
        (SECRET_PHONE, "+15005550009", T0, {}, False),
        (SECRET_PHONE, "+15005550009", T0, {"replaced_sender": "15005550009"}, True),
        (SECRET_PHONE, SENDER, T0, {"message_direction": "inbound"}, False),
        ("+61491570158", SENDER, T0, {}, False),
    ],
    ids=[
        "ours",
        "within-clock-skew",
        "before-since",
        "another-sender",
        "sender-replaced-by-plivo",
        "inbound",
        "another-number",
    ],
)
def test_lookup_matches_only_what_was_sent(
    fake: FakePlivo,
    make_transport: MakeTransport,
    to: str,
    sender: str,
    created: float,
    fields: dict[str, Any],
    found: bool,
) -> None:
    """Only an outbound SMS to the number, from the sender sent with, since then, counts."""
    message_uuid = fake.add_message(to, created=created, sender=sender, **fields)
    result = look_up(make_transport(), sms_message(), KEY, T0)
    assert result == (ProviderStatus(message_uuid, "queued", Status.PENDING) if found else None)


@pytest.mark.parametrize(("powerpack", "found"), [(POWERPACK, True), (POWERPACK[:-1] + "e", False)])
def test_lookup_through_a_powerpack_matches_the_powerpack(
    fake: FakePlivo, make_transport: MakeTransport, powerpack: str, found: bool
) -> None:
    """A Powerpack send matches records of that Powerpack, whatever number it chose."""
    message_uuid = fake.add_message(SECRET_PHONE, created=T0, sender=None, powerpack=powerpack)
    transport = make_transport(**{"from": None, "powerpack_uuid": POWERPACK})
    result = look_up(transport, sms_message(), KEY, T0)
    assert (result is not None and result.message_id == message_uuid) is found


def test_lookup_matches_the_fingerprint_not_todays_sender(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """A lookup looks for the sender recorded at send time, though the config changed."""
    sent_with = make_transport().fingerprint(sms_message())
    fake.add_message(SECRET_PHONE, created=T0)
    changed = make_transport(**{"from": "+15005550009"})
    found = changed.lookup(SECRET_PHONE, KEY, T0, sent_with)
    assert found is not None


def test_two_messages_that_could_be_ours_are_never_guessed(
    fake: FakePlivo, make_transport: MakeTransport, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """Two candidate records make the lookup fail (TransientError) rather than pick one."""
    clock.advance(10)
    fake.add_message(SECRET_PHONE, created=T0 + 1)
    fake.add_message(SECRET_PHONE, created=T0 + 2)
    with pytest.raises(TransientError) as raised:
        look_up(make_transport(), sms_message(), KEY, T0)
    _no_secrets(f"{raised.value!s} {logs.text}")


def test_a_full_page_is_never_taken_for_absence(
    fake: FakePlivo, make_transport: MakeTransport, clock: FakeClock
) -> None:
    """A list with a next page could hide ours: TransientError, not a not-found."""
    clock.advance(60)
    for n in range(LOOKUP_PAGE_SIZE + 1):
        fake.add_message(SECRET_PHONE, created=T0 + n, sender="+15005550009")
    with pytest.raises(TransientError):
        look_up(make_transport(), sms_message(), KEY, T0)


def test_lookup_request_is_the_documented_list_query(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """The lookup lists outbound SMS to the number since then (UTC), one page of 20."""
    look_up(make_transport(), sms_message(), KEY, T0)
    assert fake.list_queries == [
        {
            "message_direction": ["outbound"],
            "message_type": ["sms"],
            "to_number": [SECRET_PHONE],
            "message_time__gte": ["2025-12-31 23:59:00"],
            "limit": [str(LOOKUP_PAGE_SIZE)],
            "offset": ["0"],
        }
    ]


@pytest.mark.parametrize(
    ("shown", "found"),
    [("2025-12-31 19:00:10-05:00", True), ("2026-01-01 04:30:00+05:30", False)],
    ids=["after-since-west-of-utc", "before-since-east-of-utc"],
)
def test_record_times_are_read_as_the_instants_they_name(
    clock: FakeClock, shown: str, found: bool
) -> None:
    """A message_time with an offset is compared as an instant, never as local time."""
    record = {
        "message_uuid": "5b40a428-bfc7-4daf-9d06-726c558bf3b8",
        "message_state": "sent",
        "message_direction": "outbound",
        "message_type": "sms",
        "message_time": shown,
        "from_number": SENDER.lstrip("+"),
        "to_number": SECRET_PHONE.lstrip("+"),
    }
    page = {"meta": {"next": None, "total_count": 1}, "objects": [record]}
    transport = mock_transport(clock, lambda request: httpx.Response(200, json=page))
    try:
        assert (look_up(transport, sms_message(), KEY, T0) is not None) is found
    finally:
        transport.close()


@pytest.mark.parametrize("outcome", ["error", "throttle", "hangup", "stall"])
def test_a_failed_lookup_is_transient(
    fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture, outcome: str
) -> None:
    """A 503, a 429, a dropped connection or a read time-out on a lookup proves nothing."""
    transport = make_transport(read_timeout=0.2)
    transport.submit(sms_message(), KEY)
    fake.list_outcomes.append(outcome)
    with pytest.raises(TransientError) as raised:
        look_up(transport, sms_message(), KEY, T0)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, text="<html>"),
        httpx.Response(200, json={"objects": []}),
        httpx.Response(401, json={"api_id": "x", "error": "authentication failed"}),
    ],
    ids=["not-json", "no-meta", "unauthorized"],
)
def test_an_unreadable_or_refused_lookup_is_transient(
    clock: FakeClock, reply: httpx.Response
) -> None:
    """A lookup reply without a record list is a failed read, never a not-found."""
    transport = mock_transport(clock, lambda request: reply)
    try:
        with pytest.raises(TransientError):
            look_up(transport, sms_message(), KEY, T0)
    finally:
        transport.close()


def test_lookup_url_is_redacted_in_httpx_logs(
    fake: FakePlivo, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request URL; a lookup's (which holds the number) loses its query."""
    look_up(make_transport(), sms_message(), KEY, T0)
    assert "/Message/?<redacted>" in logs.text
    _no_secrets(logs.text)


def test_status_callback_url_carries_the_attempt_key(
    fake: FakePlivo, make_transport: MakeTransport
) -> None:
    """url is the configured status_callback with attempt=<key> merged into its query."""
    make_transport(status_callback=CALLBACK_URL + "?attempt=stale&t=1").submit(sms_message(), KEY)
    assert fake.requests[-1]["url"] == CALLBACK_URL + "?t=1&attempt=ntc_1%3Asms%3A1"
    assert fake.requests[-1]["method"] == "POST"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"base_url": "https://api.plivo.com"}, 2 * 5.0 + 2 * 10.0),
        ({"connect_timeout": 1, "read_timeout": 2.5}, 1 + 2 * 2.5),
    ],
    ids=["https-defaults", "http"],
)
def test_call_timeout_bounds_connect_write_and_read(
    make_transport: MakeTransport, options: dict[str, Any], expected: float
) -> None:
    """call_timeout adds connect (twice over TLS: connect, handshake), write and read."""
    transport = make_transport(**options)
    assert call_timeout(transport) == expected


@pytest.mark.parametrize(("value", "settle"), [(None, 60.0), (45, 45.0), ("2m", 120.0)])
def test_lookup_settle_is_a_duration_defaulting_to_60s(
    make_transport: MakeTransport, value: object, settle: float
) -> None:
    """lookup_settle takes seconds or a duration; the transport can recover by lookup."""
    transport = make_transport(lookup_settle=value)
    assert transport.lookup_settle == settle
    assert supports_lookup(transport)


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({}, "plivo.from"),
        ({"from": SENDER, "powerpack_uuid": POWERPACK}, "plivo.from"),
        ({"powerpack_uuid": "pp-1"}, "plivo.powerpack_uuid"),
        ({"from": SENDER, "read_timeout": 0}, "plivo.read_timeout"),
        ({"from": SENDER, "connect_timeout": "5"}, "plivo.connect_timeout"),
        ({"from": SENDER, "status_callback": "hooks.example/x"}, "plivo.status_callback"),
        ({"from": SENDER, "status_callback": "http://hooks.example/x"}, "plivo.status_callback"),
        ({"from": SENDER, "base_url": "ftp://api.plivo.com"}, "plivo.base_url"),
        ({"from": SENDER, "src": SENDER}, "plivo.src"),
        ({"from": SENDER, "lookup_settle": 0}, "plivo.lookup_settle"),
        ({"from": SENDER, "lookup_settle": 7200}, "plivo.lookup_settle"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(
    store: Store, clock: FakeClock, table: dict[str, Any], names: str
) -> None:
    """Each invalid [plivo] option fails the build with its dotted name."""
    with pytest.raises(ConfigError, match=re.escape(names)) as raised:
        PLUGIN.create(plivo_context(table, store, clock))
    _no_secrets(str(raised.value))


@pytest.mark.parametrize(
    ("secrets", "named"),
    [({"PLIVO_AUTH_ID": ""}, "PLIVO_AUTH_ID"), ({"PLIVO_AUTH_ID": "AC123"}, "PLIVO_AUTH_ID")],
    ids=["missing", "malformed"],
)
def test_missing_or_malformed_credentials_are_config_errors(
    store: Store, clock: FakeClock, secrets: dict[str, str], named: str
) -> None:
    """No (or a malformed) PLIVO_AUTH_ID fails the build, naming the variable, no value."""
    with pytest.raises(ConfigError, match=named) as raised:
        PLUGIN.create(plivo_context({"from": SENDER}, store, clock, **secrets))
    _no_secrets(str(raised.value))


def test_credentials_file_supplies_the_secrets(
    fake: FakePlivo, store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """Secrets from a TOML credentials_file authenticate against Plivo."""
    from resetctl.transports import transport_secrets

    credentials = tmp_path / "plivo.toml"
    credentials.write_text(f'PLIVO_AUTH_ID = "{AUTH_ID}"\nPLIVO_AUTH_TOKEN = "{AUTH_TOKEN}"\n')
    credentials.chmod(0o600)  # resetctl refuses a credentials file others can read
    table = {"from": SENDER, "base_url": fake.base_url, "credentials_file": str(credentials)}
    secret = transport_secrets("plivo", table, {})
    transport = PLUGIN.create(TransportContext("plivo", "sms", table, secret, store, clock))
    try:
        assert transport.submit(sms_message(), KEY).message_id in fake.messages
        _no_secrets(repr(transport))
    finally:
        transport.close()


def _send(**fields: Any) -> dict[str, Any]:
    return {"src": SENDER, "dst": SECRET_PHONE, "text": "x", **fields}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"src": SENDER, "text": "x"}, "dst:"),
        (_send(powerpack_uuid=POWERPACK), "not both"),
        (_send(message_expiry="60"), "message_expiry"),
        (_send(message_expiry=4), "message_expiry"),
        (_send(expiry_time=60), "expiry_time:"),
        (_send(url="hooks/x"), "url:"),
        (_send(dst=SENDER), "cannot be same"),
    ],
    ids=["no-dst", "two-senders", "expiry-text", "expiry-short", "unknown", "url", "src-is-dst"],
)
def test_fake_plivo_refuses_undocumented_sends(
    fake: FakePlivo, body: dict[str, Any], problem: str
) -> None:
    """The fake's send check has teeth: an undocumented body is a 400 and a violation."""
    url = f"{fake.base_url}/v1/Account/{AUTH_ID}/Message/"
    with httpx.Client(auth=(AUTH_ID, AUTH_TOKEN)) as client:
        assert client.post(url, json=body).status_code == 400
    assert any(problem in violation for violation in fake.violations), fake.violations
    fake.violations.clear()


@pytest.mark.parametrize(
    "query",
    [
        {"to_number": SECRET_PHONE, "limit": "50"},
        {"to_number": SECRET_PHONE.lstrip("+")},
        {"message_time__gte": "2026-01-01T00:00:00Z"},
        {"to": SECRET_PHONE},
    ],
    ids=["limit-over-20", "to-not-e164", "time-not-plivos-format", "no-such-filter"],
)
def test_fake_plivo_refuses_undocumented_list_queries(
    fake: FakePlivo, query: dict[str, str]
) -> None:
    """The fake's list check has teeth: an undocumented query is a 400 and a violation."""
    url = f"{fake.base_url}/v1/Account/{AUTH_ID}/Message/"
    with httpx.Client(auth=(AUTH_ID, AUTH_TOKEN)) as client:
        assert client.get(url, params=query).status_code == 400
    assert fake.violations
    fake.violations.clear()
