"""The Postmark transport: the shared contract, classification of every failure and
recovery by lookup, against a Postmark-shaped HTTP server on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import T0
from contract import SECRET_EMAIL, TransportContract, assert_no_secrets, email_message
from fakes import look_up
from providers_http import ProviderHandler, closed_port_url
from providers_postmark import SENDER, TOKEN, FakePostmark

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
from resetctl.transports.postmark import (
    PLUGIN,
    POSTMARK_STATUSES,
    PostmarkRefused,
    PostmarkTransport,
    normalize,
)


@pytest.fixture
def postmark_server() -> Iterator[FakePostmark]:
    fake = FakePostmark(lambda: T0)
    yield fake
    fake.close()
    assert fake.problems == []


MakeTransport = Callable[..., PostmarkTransport]
KEY = "ntc_1:email:1"


@pytest.fixture
def make_transport(postmark_server: FakePostmark, store: Store) -> Iterator[MakeTransport]:
    """Build transports through the plugin factory; options override the defaults."""
    built: list[PostmarkTransport] = []

    def make(**options: Any) -> PostmarkTransport:
        table = {"base_url": postmark_server.base_url, "from": SENDER, **options}
        context = TransportContext(
            name="postmark",
            channel="email",
            options=table,
            secret={"POSTMARK_SERVER_TOKEN": TOKEN}.get,
            store=store,
            clock=lambda: T0,
        )
        transport = PLUGIN.create(context)
        assert isinstance(transport, PostmarkTransport)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        transport.close()


@dataclass
class PostmarkHarness:
    transport: PostmarkTransport
    server: FakePostmark
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
        self.server.add_event(message_id, {"delivered": "Delivered", "failed": "Bounced"}[outcome])

    def logs(self) -> str:
        return self.caplog.text


class TestPostmarkContract(TransportContract):
    @pytest.fixture
    def harness(
        self,
        make_transport: MakeTransport,
        postmark_server: FakePostmark,
        caplog: pytest.LogCaptureFixture,
    ) -> PostmarkHarness:
        # Everything down to httpcore's debug lines must stay free of the secrets.
        caplog.set_level("DEBUG")
        return PostmarkHarness(make_transport(), postmark_server, caplog)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        ("Queued", Status.PENDING),
        ("Sent", Status.ACCEPTED),
        ("Processed", Status.ACCEPTED),
        ("Transient", Status.PENDING),
        ("Delivered", Status.DELIVERED),
        ("Opened", Status.DELIVERED),
        ("LinkClicked", Status.DELIVERED),
        ("Bounced", Status.FAILED),
        ("SpamComplaint", Status.FAILED),
        ("delivered", Status.DELIVERED),
        ("SubscriptionChanged", Status.UNKNOWN),
        ("Scheduled", Status.UNKNOWN),
        ("", Status.UNKNOWN),
    ],
)
def test_normalize_maps_postmark_words(raw: str, status: Status) -> None:
    """Each Postmark status and event type maps to its row of the table; others are unknown."""
    assert normalize(raw) is status


def test_vocabulary_is_the_plugins() -> None:
    """The registered plugin is this module's, with its known statuses and mapping."""
    assert plugin("postmark") is PLUGIN
    assert PLUGIN.vocabulary.known == POSTMARK_STATUSES
    assert PLUGIN.vocabulary.normalize is normalize
    assert PLUGIN.channels == frozenset({"email"})


@pytest.mark.parametrize(
    ("message_status", "events", "raw", "status"),
    [
        ("Queued", [], "Queued", Status.PENDING),
        ("Sent", [], "Sent", Status.ACCEPTED),
        ("Processed", [], "Processed", Status.ACCEPTED),
        ("Sent", [("Transient", 1)], "Transient", Status.PENDING),
        ("Sent", [("Transient", 1), ("Delivered", 2)], "Delivered", Status.DELIVERED),
        # Postmark's own example lists the Delivered before the Transient it followed.
        ("Sent", [("Delivered", 2), ("Transient", 1)], "Delivered", Status.DELIVERED),
        ("Sent", [("Delivered", 1), ("Opened", 5)], "Opened", Status.DELIVERED),
        ("Sent", [("LinkClicked", 3)], "LinkClicked", Status.DELIVERED),
        ("Sent", [("Transient", 1), ("Bounced", 2)], "Bounced", Status.FAILED),
        ("Sent", [("Delivered", 1), ("Bounced", 9)], "Bounced", Status.FAILED),
        ("Sent", [("Bounced", 1), ("SubscriptionChanged", 2)], "Bounced", Status.FAILED),
        ("Sent", [("SubscriptionChanged", 1)], "Sent", Status.ACCEPTED),
        ("Sent", [("Delivered", 1), ("SpamComplaint", 60)], "SpamComplaint", Status.FAILED),
        # Not a documented word: stored by its length, never as it came.
        ("Archived", [], "unknown:8", Status.UNKNOWN),
    ],
)
def test_status_reads_the_latest_decisive_event(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    message_status: str,
    events: list[tuple[str, float]],
    raw: str,
    status: Status,
) -> None:
    """A status read takes the latest delivery event by time, else the message's Status."""
    transport = make_transport()
    message_id = transport.submit(email_message(), "ntc_map:email:1").message_id
    postmark_server.statuses[message_id] = message_status
    for kind, at in events:
        postmark_server.add_event(message_id, kind, at)
    reply = transport.status(message_id)
    assert (reply.message_id, reply.raw_status, reply.status) == (message_id, raw, status)


def test_submission_is_documented_json_with_tracking_off(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """The send is Postmark's JSON with the token, the attempt key and no click tracking."""
    transport = make_transport(message_stream="password-resets")
    message = email_message()
    reply = transport.submit(message, "ntc_shape:email:1")
    assert message.email is not None
    assert postmark_server.sent[reply.message_id] == {
        "From": SENDER,
        "To": SECRET_EMAIL,
        "Subject": message.email.subject,
        "TextBody": message.email.text,
        "HtmlBody": message.email.html,
        "MessageStream": "password-resets",
        "Metadata": {"attempt_key": "ntc_shape:email:1"},
        "TrackOpens": False,
        "TrackLinks": "None",
    }
    assert postmark_server.headers[-1]["x-postmark-server-token"] == TOKEN
    # Taken is not sent: the notice stays open until a status read says more.
    assert (reply.raw_status, reply.status) == ("Queued", Status.PENDING)


@pytest.mark.parametrize(("outcome", "code"), [("reject", 300), ("inactive", 406)])
def test_refusals_carry_the_error_code_not_the_message(
    make_transport: MakeTransport, postmark_server: FakePostmark, outcome: str, code: int
) -> None:
    """A 422 is permanent, keeps Postmark's ErrorCode and drops its address-quoting text."""
    postmark_server.script(outcome)
    with pytest.raises(PostmarkRefused) as raised:
        make_transport().submit(email_message(), "ntc_refused:email:1")
    assert (raised.value.http_status, raised.value.error_code) == (422, code)
    assert f"ErrorCode {code}" in str(raised.value)
    for text in (str(raised.value), repr(raised.value)):
        assert SECRET_EMAIL not in text
        assert "inactive addresses" not in text


def test_wrong_token_is_permanent_and_not_echoed(
    postmark_server: FakePostmark, store: Store
) -> None:
    """A 401 is a permanent refusal whose message holds no token."""
    transport = PostmarkTransport(
        token="pm-wrong-token-77", sender=SENDER, base_url=postmark_server.base_url
    )
    try:
        with pytest.raises(PostmarkRefused) as raised:
            transport.submit(email_message(), "ntc_token:email:1")
    finally:
        transport.close()
    assert (raised.value.http_status, raised.value.error_code) == (401, 10)
    assert "pm-wrong-token-77" not in f"{raised.value!s} {raised.value!r}"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    # Everything down to httpcore's debug lines must stay free of the secrets.
    caplog.set_level("DEBUG")
    return caplog


def test_rate_limit_is_transient_and_nothing_was_sent(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """A 429 (ErrorCode 429) means Postmark took nothing: transient, safe to retry."""
    postmark_server.script("rate-limit")
    with pytest.raises(TransientError) as raised:
        make_transport().submit(email_message(), KEY)
    assert not isinstance(raised.value, AmbiguousError)
    assert postmark_server.sent == {}


@pytest.mark.parametrize(
    ("outcome", "sent"),
    [("error", 0), ("maintenance", 0), ("created-504", 1)],
    ids=["500", "503-errorcode-100", "504-after-accepting"],
)
def test_a_5xx_to_a_send_is_ambiguous(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    logs: pytest.LogCaptureFixture,
    outcome: str,
    sent: int,
) -> None:
    """Any 5xx to a send may follow Postmark taking the message (even ErrorCode 100)."""
    postmark_server.script(outcome)
    with pytest.raises(AmbiguousError) as raised:
        make_transport().submit(email_message(), KEY)
    assert len(postmark_server.sent) == sent
    assert_no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}", TOKEN)


def test_refused_connection_is_transient(make_transport: MakeTransport) -> None:
    """Nothing listening means nothing was sent: transient for sends and every read."""
    transport = make_transport(base_url=closed_port_url())
    with pytest.raises(TransientError) as raised:
        transport.submit(email_message(), "ntc_closed:email:1")
    assert not isinstance(raised.value, AmbiguousError)
    with pytest.raises(TransientError):
        transport.status("0e4e0e4e-0000-4000-8000-000000000000")
    with pytest.raises(TransientError):
        look_up(transport, email_message(), KEY, T0)


@pytest.mark.parametrize("outcome", ["hang-up", "stall"])
def test_no_answer_after_sending_is_ambiguous(
    make_transport: MakeTransport, postmark_server: FakePostmark, outcome: str
) -> None:
    """A send Postmark took but never answered (dropped, or timed out) is ambiguous."""
    postmark_server.script(outcome)
    transport = make_transport(read_timeout=0.2)
    with pytest.raises(AmbiguousError) as raised:
        transport.submit(email_message(), "ntc_silent:email:1")
    assert_no_secrets(f"{raised.value!s} {raised.value!r}")
    assert len(postmark_server.sent) == 1
    # The pool recovers: the next send goes through on a fresh connection.
    assert transport.submit(email_message(), "ntc_silent:email:2").message_id


@pytest.mark.parametrize("outcome", ["created-504", "hang-up"])
def test_lookup_finds_the_message_an_ambiguous_send_left(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    logs: pytest.LogCaptureFixture,
    outcome: str,
) -> None:
    """After a 504 or a dropped reply, lookup by attempt key returns the one message."""
    transport = make_transport()
    postmark_server.script(outcome)
    with pytest.raises(AmbiguousError):
        transport.submit(email_message(), KEY)
    (message_id,) = postmark_server.sent
    found = look_up(transport, email_message(), KEY, T0)
    assert found == ProviderStatus(message_id, "Sent", Status.ACCEPTED)
    assert len(postmark_server.sent) == 1
    assert_no_secrets(logs.text, TOKEN)


@pytest.mark.parametrize(
    ("event", "raw", "status"),
    [("Bounced", "Bounced", Status.FAILED), ("Delivered", "Delivered", Status.DELIVERED)],
)
def test_lookup_reads_the_found_messages_details(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    event: str,
    raw: str,
    status: Status,
) -> None:
    """A found message's status comes from its events: the search's "Sent" hides a bounce."""
    transport = make_transport()
    postmark_server.script("hang-up")
    with pytest.raises(AmbiguousError):
        transport.submit(email_message(), KEY)
    (message_id,) = postmark_server.sent
    postmark_server.add_event(message_id, event)
    assert look_up(transport, email_message(), KEY, T0) == ProviderStatus(message_id, raw, status)


@pytest.mark.parametrize("failure", ["error", "missing", "hang-up", "stall"])
def test_lookup_keeps_the_search_status_when_the_details_read_fails(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    """A failed details read leaves the search's answer, within call_timeout: found is found."""
    answer = postmark_server.handle_get

    def failing_details(handler: ProviderHandler) -> None:
        if not handler.path.endswith("/details"):
            answer(handler)
        elif failure == "error":
            handler.reply(500, "Internal Server Error")
        elif failure == "missing":
            handler.reply(404, {"ErrorCode": 701, "Message": "Message not found."})
        elif failure == "hang-up":
            handler.drop()
        else:
            handler.hold()
            answer(handler)

    monkeypatch.setattr(postmark_server, "handle_get", failing_details)
    transport = make_transport(connect_timeout=0.1, read_timeout=0.1)
    message_id = transport.submit(email_message(), KEY).message_id
    postmark_server.add_event(message_id, "Bounced")
    started = time.monotonic()
    found = look_up(transport, email_message(), KEY, T0)
    # What finishing up after the last time-out may take on a busy machine.
    assert time.monotonic() - started < transport.call_timeout + 0.2
    assert found == ProviderStatus(message_id, "Sent", Status.ACCEPTED)


def test_lookup_returns_none_when_nothing_was_sent(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """A 429 took nothing, and lookup says so."""
    transport = make_transport()
    postmark_server.script("rate-limit")
    with pytest.raises(TransientError):
        transport.submit(email_message(), KEY)
    assert look_up(transport, email_message(), KEY, T0) is None


def test_lookup_request_is_the_documented_search(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """The lookup searches by recipient, stream and attempt_key metadata, one page."""
    look_up(make_transport(message_stream="password-resets"), email_message(), KEY, T0)
    assert postmark_server.searches == [
        {
            "recipient": [SECRET_EMAIL],
            "count": ["50"],
            "offset": ["0"],
            "messagestream": ["password-resets"],
            "metadata_attempt_key": [KEY],
        }
    ]


@pytest.mark.parametrize("filters_metadata", [True, False], ids=["filtered", "filter-ignored"])
def test_lookup_checks_the_attempt_key_itself(
    make_transport: MakeTransport, postmark_server: FakePostmark, filters_metadata: bool
) -> None:
    """Another attempt's email to the same address is never taken for ours."""
    postmark_server.filters_metadata = filters_metadata
    transport = make_transport()
    other = transport.submit(email_message(), "ntc_other:email:1")
    assert look_up(transport, email_message(), KEY, T0) is None
    ours = transport.submit(email_message(), KEY)
    found = look_up(transport, email_message(), KEY, T0)
    assert found is not None
    assert found.message_id == ours.message_id != other.message_id


def test_lookup_searches_the_configured_stream(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """A message on a non-default stream is found: the search names the stream."""
    transport = make_transport(message_stream="password-resets")
    sent = transport.submit(email_message(), KEY)
    found = look_up(transport, email_message(), KEY, T0)
    assert found is not None
    assert found.message_id == sent.message_id


def test_a_full_page_without_ours_is_not_a_not_found(
    make_transport: MakeTransport, postmark_server: FakePostmark
) -> None:
    """If the search matched more than one page and ours was not on it, nothing is proved."""
    postmark_server.filters_metadata = False
    transport = make_transport()
    for n in range(51):
        transport.submit(email_message(), f"ntc_other:email:{n}")
    with pytest.raises(TransientError):
        look_up(transport, email_message(), KEY, T0)


@pytest.mark.parametrize("outcome", ["error", "rate-limit", "hang-up", "stall"])
def test_a_failed_lookup_is_transient(
    make_transport: MakeTransport,
    postmark_server: FakePostmark,
    logs: pytest.LogCaptureFixture,
    outcome: str,
) -> None:
    """A 500, a 429, a dropped connection or a read time-out on a lookup proves nothing."""
    transport = make_transport(read_timeout=0.2)
    transport.submit(email_message(), KEY)
    postmark_server.search_outcomes.append(outcome)
    with pytest.raises(TransientError) as raised:
        look_up(transport, email_message(), KEY, T0)
    assert_no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}", TOKEN)


def test_a_refused_lookup_is_transient(postmark_server: FakePostmark) -> None:
    """A 401 on a lookup is a failed read (the message may exist), not a not-found."""
    transport = PostmarkTransport(
        token="pm-wrong-token-77", sender=SENDER, base_url=postmark_server.base_url
    )
    try:
        with pytest.raises(TransientError) as raised:
            look_up(transport, email_message(), KEY, T0)
    finally:
        transport.close()
    assert "pm-wrong-token-77" not in f"{raised.value!s} {raised.value!r}"


def test_lookup_url_is_redacted_in_httpx_logs(
    make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request URL; a lookup's (which holds the address) loses its query."""
    look_up(make_transport(), email_message(), KEY, T0)
    assert "/messages/outbound?<redacted>" in logs.text
    assert_no_secrets(logs.text, TOKEN)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"base_url": "https://api.postmarkapp.com"}, 2 * 5.0 + 2 * 10.0),
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
    options = {} if value is None else {"lookup_settle": value}
    transport = make_transport(**options)
    assert transport.lookup_settle == settle
    assert supports_lookup(transport)


def test_status_of_an_unknown_message_is_permanent(make_transport: MakeTransport) -> None:
    """A details read for an id Postmark does not know is a permanent error."""
    with pytest.raises(PermanentError):
        make_transport().status("no-such-message")


def postmark_settings(**table: Any) -> Any:
    return settings_from_mapping({"transport": {"email": "postmark"}, "postmark": table}, "test")


def test_built_from_config_and_environment(
    postmark_server: FakePostmark, store: Store, tmp_path: Path
) -> None:
    """[postmark] and POSTMARK_SERVER_TOKEN build a working email transport."""
    settings = postmark_settings(
        base_url=postmark_server.base_url,
        message_stream="resets",
        connect_timeout=1,
        read_timeout=2.5,
        **{"from": SENDER},
    )
    built = build_transports(settings, store, lambda: T0, {"POSTMARK_SERVER_TOKEN": TOKEN})
    transport = built["email"]
    assert isinstance(transport, PostmarkTransport)
    try:
        reply = transport.submit(email_message(), "ntc_config:email:1")
    finally:
        transport.close()
    assert postmark_server.sent[reply.message_id]["MessageStream"] == "resets"


@pytest.mark.parametrize("environ", [{}, {"POSTMARK_SERVER_TOKEN": ""}])
def test_missing_token_names_the_variable(store: Store, environ: dict[str, str]) -> None:
    """Without POSTMARK_SERVER_TOKEN, building fails naming the variable (no value)."""
    settings = postmark_settings(**{"from": SENDER})
    with pytest.raises(ConfigError, match="POSTMARK_SERVER_TOKEN"):
        build_transports(settings, store, lambda: T0, environ)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"from": SENDER, "track_links": "HtmlOnly"}, "postmark.track_links"),
        ({}, "postmark.from"),
        ({"from": SENDER, "read_timeout": 0}, "postmark.read_timeout"),
        ({"from": SENDER, "connect_timeout": True}, "postmark.connect_timeout"),
        ({"from": SENDER, "base_url": "api.postmarkapp.com"}, "postmark.base_url"),
        ({"from": SENDER, "lookup_settle": 0}, "postmark.lookup_settle"),
        ({"from": SENDER, "lookup_settle": "soon"}, "postmark.lookup_settle"),
        ({"from": SENDER, "lookup_settle": True}, "postmark.lookup_settle"),
        ({"from": SENDER, "lookup_settle": 7200}, "postmark.lookup_settle"),
    ],
)
def test_bad_options_name_their_key(store: Store, table: dict[str, Any], named: str) -> None:
    """An unknown, missing or malformed [postmark] option fails naming postmark.<key>."""
    settings = postmark_settings(**table)
    with pytest.raises(ConfigError) as raised:
        build_transports(settings, store, lambda: T0, {"POSTMARK_SERVER_TOKEN": TOKEN})
    assert str(raised.value).startswith(named)
    assert TOKEN not in str(raised.value)
