"""Postmark's webhooks as the postmark kind reads them: basic credentials checked in
constant time, Bounce, Delivery and SpamComplaint records read into reports, everything
else no report, against records a fake Postmark builds from what it was actually sent."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import T0
from contract import SECRET_EMAIL, SECRET_URL, email_message
from providers_http import FakeProvider, ProviderHandler
from providers_postmark import (
    BOUNCE_TYPES,
    SENDER,
    TOKEN,
    WEBHOOK_PASSWORD,
    WEBHOOK_URL,
    WEBHOOK_USERNAME,
    FakePostmark,
    PostmarkWebhookSender,
    credentialed,
    post_webhook,
    webhook_request,
)

from resetctl.errors import ConfigError, InputError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports import TransportContext
from resetctl.transports.base import CallbackReader, CallbackReport, CallbackRequest
from resetctl.transports.postmark import (
    BOUNCE_TYPE_CODES,
    PLUGIN,
    VOCABULARY,
    PostmarkTransport,
)
from resetctl.transports.postmark_webhooks import WEBHOOK_IDENTITY_PREFIX

KEY = "ntc_hook:email:1"
SECRETS = {
    "POSTMARK_SERVER_TOKEN": TOKEN,
    "POSTMARK_WEBHOOK_USERNAME": WEBHOOK_USERNAME,
    "POSTMARK_WEBHOOK_PASSWORD": WEBHOOK_PASSWORD,
}


@pytest.fixture
def postmark_server() -> Iterator[FakePostmark]:
    fake = FakePostmark(lambda: T0)
    yield fake
    fake.close()
    assert fake.problems == []


@pytest.fixture
def sender(postmark_server: FakePostmark) -> PostmarkWebhookSender:
    return PostmarkWebhookSender(postmark_server)


Context = Callable[..., TransportContext]


@pytest.fixture
def context(postmark_server: FakePostmark, store: Store) -> Context:
    """The instance's context, as both the transport and its reader are built from."""

    def make(secrets: dict[str, str] | None = None, **options: Any) -> TransportContext:
        table = {"base_url": postmark_server.base_url, "from": SENDER, **options}
        found = SECRETS if secrets is None else secrets
        return TransportContext("postmark", "email", table, found.get, store, lambda: T0)

    return make


@pytest.fixture
def reader(context: Context) -> CallbackReader:
    assert PLUGIN.callbacks is not None
    return PLUGIN.callbacks(context(webhook_url=WEBHOOK_URL))


@pytest.fixture
def sent(context: Context) -> Iterator[str]:
    """The MessageID of one reset email sent through the transport under KEY."""
    transport = PLUGIN.create(context())
    assert isinstance(transport, PostmarkTransport)
    try:
        yield transport.submit(email_message(), KEY).message_id
    finally:
        transport.close()


def read_one(reader: CallbackReader, record: Any, url: str | None = None) -> CallbackReport:
    [report] = reader.read(webhook_request(record, url), T0)
    return report


def assert_quiet(error: BaseException) -> None:
    """Neither the address, the link nor a credential is in an error's text."""
    text = f"{error!s} {error!r} {getattr(error, 'problems', '')}"
    for secret in (SECRET_EMAIL, SECRET_URL, WEBHOOK_PASSWORD, WEBHOOK_USERNAME, TOKEN):
        assert secret not in text


def test_a_hard_bounce_is_a_failed_report_naming_the_attempt(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A HardBounce webhook with good credentials: failed, with the message and attempt key."""
    report = read_one(reader, sender.bounce(sent, "HardBounce"))
    assert (report.message_id, report.attempt_key) == (sent, KEY)
    assert (report.raw_status, report.status) == ("HardBounce", Status.FAILED)
    assert report.dedupe.startswith(WEBHOOK_IDENTITY_PREFIX)


def test_a_soft_bounce_is_failed_because_postmark_stopped_trying(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A SoftBounce ends Postmark's attempts at that message: failed, so the notice escalates."""
    report = read_one(reader, sender.bounce(sent, "SoftBounce"))
    assert (report.raw_status, report.status) == ("SoftBounce", Status.FAILED)


@pytest.mark.parametrize("delayed", ["Transient", "DnsError"])
def test_a_delay_is_pending(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str, delayed: str
) -> None:
    """A delayed message (Transient, DnsError) may still arrive: pending; the poll budget rules."""
    report = read_one(reader, sender.bounce(sent, delayed))
    assert (report.raw_status, report.status) == (delayed, Status.PENDING)


EXPECTED = {
    **dict.fromkeys(
        [
            "HardBounce",
            "BadEmailAddress",
            "SoftBounce",
            "Blocked",
            "DMARCPolicy",
            "SpamNotification",
            "VirusNotification",
            "ChallengeVerification",
            "ManuallyDeactivated",
            "Unconfirmed",
            "SMTPApiError",
            "TemplateRenderingFailed",
            "SpamComplaint",
        ],
        Status.FAILED,
    ),
    **dict.fromkeys(["Transient", "DnsError"], Status.PENDING),
    **dict.fromkeys(
        [
            "AutoResponder",
            "Unsubscribe",
            "Subscribe",
            "AddressChange",
            "OpenRelayTest",
            "InboundError",
            "Unknown",
        ],
        Status.UNKNOWN,
    ),
}


@pytest.mark.parametrize("bounce_type", sorted(BOUNCE_TYPES))
def test_every_documented_bounce_type_has_its_row(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str, bounce_type: str
) -> None:
    """Each of Postmark's bounce types is its own evidence and maps to its decided status."""
    report = read_one(reader, sender.bounce(sent, bounce_type))
    assert (report.raw_status, report.status) == (bounce_type, EXPECTED[bounce_type])
    assert BOUNCE_TYPE_CODES[bounce_type] == BOUNCE_TYPES[bounce_type][0]
    assert bounce_type in VOCABULARY.known


def test_a_delivery_is_delivered(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A Delivery webhook: delivered, recorded as Postmark's Delivered event word."""
    report = read_one(reader, sender.delivery(sent))
    assert (report.message_id, report.attempt_key) == (sent, KEY)
    assert (report.raw_status, report.status) == ("Delivered", Status.DELIVERED)


def test_a_spam_complaint_is_failed_as_the_poll_reads_it(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A SpamComplaint webhook is failed, the same word and status a status poll records."""
    report = read_one(reader, sender.spam_complaint(sent))
    assert (report.raw_status, report.status) == ("SpamComplaint", Status.FAILED)
    assert VOCABULARY.reading("SpamComplaint") == ("SpamComplaint", Status.FAILED)


@pytest.mark.parametrize("kind", ["open", "click", "subscription_change"])
def test_records_that_say_nothing_about_delivery_are_no_report(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str, kind: str
) -> None:
    """Open, Click and SubscriptionChange webhooks verify and carry no report."""
    record = getattr(sender, kind)(sent)
    assert reader.read(webhook_request(record), T0) == []


def test_an_unknown_record_type_is_no_report(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A verified record of a type Postmark may add later is no report, not an error."""
    record = {**sender.delivery(sent), "RecordType": "Archived"}
    assert reader.read(webhook_request(record), T0) == []


def test_a_retry_of_the_same_record_has_the_same_identity(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """Postmark's retry (even re-serialized) has one identity; another bounce has another."""
    record = sender.bounce(sent)
    first = read_one(reader, record)
    reordered = json.dumps(dict(reversed(list(record.items()))), indent=2).encode()
    assert read_one(reader, record).dedupe == first.dedupe
    assert read_one(reader, reordered).dedupe == first.dedupe
    assert read_one(reader, sender.bounce(sent)).dedupe != first.dedupe
    assert sent not in first.dedupe
    assert SECRET_EMAIL not in first.dedupe
    delivery = read_one(reader, sender.delivery(sent))
    assert read_one(reader, sender.delivery(sent)).dedupe == delivery.dedupe != first.dedupe


def test_the_identity_is_keyed_by_the_webhook_password(
    context: Context, sender: PostmarkWebhookSender, sent: str
) -> None:
    """The same record read under another password has another identity (it is a keyed digest)."""
    assert PLUGIN.callbacks is not None
    other_password = "another-hook-password-0123"
    other = PLUGIN.callbacks(context({**SECRETS, "POSTMARK_WEBHOOK_PASSWORD": other_password}))
    record = sender.bounce(sent)
    ours = read_one(PLUGIN.callbacks(context()), record)
    theirs = read_one(other, record, credentialed(pw=other_password))
    assert ours.dedupe != theirs.dedupe


@pytest.mark.parametrize(
    "url",
    [
        credentialed(pw="wrong-password-0123456"),
        credentialed(user="someone-else"),
        credentialed(pw=WEBHOOK_PASSWORD + "x"),
        credentialed(pw=WEBHOOK_PASSWORD[:-1]),
        WEBHOOK_URL,
    ],
    ids=["wrong-password", "wrong-user", "longer", "shorter", "no-credentials"],
)
def test_wrong_or_missing_credentials_are_a_signature_mismatch(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str, url: str
) -> None:
    """Anything but the configured pair is refused before the body is read, quoting nothing."""
    with pytest.raises(SignatureMismatch) as raised:
        reader.read(webhook_request(sender.bounce(sent), url), T0)
    assert_quiet(raised.value)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer " + base64.b64encode(f"{WEBHOOK_USERNAME}:{WEBHOOK_PASSWORD}".encode()).decode(),
        f"Basic {WEBHOOK_USERNAME}:{WEBHOOK_PASSWORD}",
        "Basic !!!not-base64!!!",
        "Basic",
        "",
    ],
    ids=["other-scheme", "not-encoded", "bad-base64", "no-token", "empty"],
)
def test_a_malformed_authorization_header_is_a_signature_mismatch(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str, header: str
) -> None:
    """An Authorization header that is not Basic with base64 credentials is refused."""
    good = webhook_request(sender.bounce(sent))
    request = CallbackRequest(good.url, {**good.headers, "authorization": header}, good.body)
    with pytest.raises(SignatureMismatch) as raised:
        reader.read(request, T0)
    assert_quiet(raised.value)


def test_the_basic_scheme_is_case_insensitive(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """RFC 7617's scheme name is case-insensitive: "basic" works as "Basic" does."""
    good = webhook_request(sender.bounce(sent))
    header = good.headers["authorization"].replace("Basic", "basic")
    request = CallbackRequest(good.url, {**good.headers, "authorization": header}, good.body)
    assert [r.status for r in reader.read(request, T0)] == [Status.FAILED]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"RecordType": "Bounce", ', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"MessageID": SECRET_EMAIL}).encode(), "no RecordType"),
        (
            json.dumps({"RecordType": "Delivery", "MessageID": SECRET_EMAIL}).encode(),
            "MessageID",
        ),
        (
            json.dumps(
                {"RecordType": "Bounce", "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483"}
            ).encode(),
            "numeric ID",
        ),
        (
            json.dumps(
                {
                    "RecordType": "Bounce",
                    "ID": 42,
                    "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
                    "Email": SECRET_EMAIL,
                }
            ).encode(),
            "bounce Type",
        ),
    ],
    ids=["truncated", "not-utf8", "array", "no-record-type", "bad-id", "no-id", "no-type"],
)
def test_a_body_that_is_not_a_record_is_malformed_and_not_quoted(
    reader: CallbackReader, body: bytes, words: str
) -> None:
    """Authenticated but not a Postmark record: MalformedCallback that quotes none of it."""
    with pytest.raises(MalformedCallback, match=words) as raised:
        reader.read(webhook_request(body), T0)
    assert_quiet(raised.value)
    assert isinstance(raised.value, InputError)


def test_an_undocumented_bounce_type_is_unknown_evidence(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A Type outside Postmark's list (or a message status there) is stored by its length."""
    odd = read_one(reader, {**sender.bounce(sent), "Type": SECRET_EMAIL})
    assert (odd.raw_status, odd.status) == (f"unknown:{len(SECRET_EMAIL)}", Status.UNKNOWN)
    status_word = read_one(reader, {**sender.bounce(sent), "Type": "Delivered"})
    assert (status_word.raw_status, status_word.status) == ("unknown:9", Status.UNKNOWN)


def test_a_bounce_without_a_type_is_read_by_its_type_code(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """A record carrying only TypeCode 4096 reads as SoftBounce, the code's documented name."""
    record = sender.bounce(sent, "SoftBounce")
    del record["Type"]
    assert read_one(reader, record).raw_status == "SoftBounce"


def test_a_record_without_our_metadata_names_no_attempt(
    reader: CallbackReader, sender: PostmarkWebhookSender, sent: str
) -> None:
    """Without an attempt_key in Metadata the report names only the message."""
    for metadata in ({}, {"attempt_key": 7}, {"attempt_key": "x" * 81}, None):
        report = read_one(reader, {**sender.bounce(sent), "Metadata": metadata})
        assert (report.message_id, report.attempt_key) == (sent, None)


def test_a_webhook_over_http_with_credentials_in_its_url_verifies(
    context: Context, sender: PostmarkWebhookSender, sent: str
) -> None:
    """Posted over real HTTP to a URL holding the credentials, as Postmark does, it verifies."""

    class Receiver(FakeProvider):
        def __init__(self) -> None:
            self.requests: list[CallbackRequest] = []
            super().__init__()

        def handle_post(self, handler: ProviderHandler) -> None:
            body = handler.read_body()
            headers = {k.lower(): v for k, v in handler.headers.items()}
            self.requests.append(CallbackRequest(self.base_url + handler.path, headers, body))
            handler.reply(200, {})

    receiver = Receiver()
    try:
        hook = f"{receiver.base_url}/postmark/webhook"
        assert post_webhook(credentialed(hook), sender.bounce(sent)).status_code == 200
    finally:
        receiver.close()
    assert PLUGIN.callbacks is not None
    reader = PLUGIN.callbacks(context(webhook_url=hook))
    [request] = receiver.requests
    assert request.headers["content-type"].startswith("application/json")
    [report] = reader.read(request, T0)
    assert (report.message_id, report.attempt_key, report.status) == (sent, KEY, Status.FAILED)
    assert reader.public_url == hook


def test_the_reader_takes_json_and_shows_no_credentials(reader: CallbackReader) -> None:
    """Its media type is JSON, its public URL the option, and its repr holds no secret."""
    assert reader.media_types == frozenset({"application/json"})
    assert reader.public_url == WEBHOOK_URL
    assert WEBHOOK_PASSWORD not in repr(reader)
    assert WEBHOOK_USERNAME not in repr(reader)


def test_without_webhook_url_the_reader_has_no_public_url(context: Context) -> None:
    """webhook_url is optional: without it the reader reads, but names no public URL."""
    assert PLUGIN.callbacks is not None
    assert PLUGIN.callbacks(context()).public_url is None


@pytest.mark.parametrize("missing", ["POSTMARK_WEBHOOK_USERNAME", "POSTMARK_WEBHOOK_PASSWORD"])
def test_missing_credentials_fail_the_check_naming_the_variable(
    context: Context, missing: str
) -> None:
    """Without either secret the reader's check (what a server runs when it starts) and
    every read are a ConfigError naming it, not its value."""
    assert PLUGIN.callbacks is not None
    secrets = {name: value for name, value in SECRETS.items() if name != missing}
    reader = PLUGIN.callbacks(context(secrets))
    with pytest.raises(ConfigError, match=missing) as raised:
        reader.check()
    assert_quiet(raised.value)
    with pytest.raises(ConfigError, match=missing):
        reader.read(CallbackRequest(WEBHOOK_URL, {}, b"{}"), 0.0)


@pytest.mark.parametrize(
    ("secrets", "words"),
    [
        ({"POSTMARK_WEBHOOK_PASSWORD": "short-pw-123"}, "shorter than 16"),
        ({"POSTMARK_WEBHOOK_PASSWORD": "has:colon/and@at-signs-000"}, "letters, digits"),
        ({"POSTMARK_WEBHOOK_USERNAME": "user:name"}, "POSTMARK_WEBHOOK_USERNAME must be"),
    ],
)
def test_weak_or_unwritable_credentials_fail_at_build(
    context: Context, secrets: dict[str, str], words: str
) -> None:
    """A short password, or credentials a URL cannot carry as they are, are refused."""
    assert PLUGIN.callbacks is not None
    with pytest.raises(ConfigError, match=words) as raised:
        PLUGIN.callbacks(context({**SECRETS, **secrets}))
    for value in secrets.values():
        assert value not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://hooks.example.com/postmark", "must be https"),
        ("ftp://hooks.example.com/postmark", "absolute https"),
        ("/postmark/webhook", "absolute https"),
        (credentialed(), "must not hold credentials"),
    ],
)
def test_bad_webhook_urls_are_config_errors(context: Context, url: str, words: str) -> None:
    """webhook_url is https (http only on loopback) and never carries the credentials."""
    assert PLUGIN.callbacks is not None
    with pytest.raises(ConfigError, match=f"postmark.webhook_url: .*{words}") as raised:
        PLUGIN.callbacks(context(webhook_url=url))
    assert WEBHOOK_PASSWORD not in str(raised.value)


def test_a_loopback_webhook_url_may_be_http(context: Context) -> None:
    """A stand-in on this machine may take webhooks over plain http."""
    assert PLUGIN.callbacks is not None
    url = "http://127.0.0.1:8025/postmark/webhook"
    assert PLUGIN.callbacks(context(webhook_url=url)).public_url == url


def test_the_transport_accepts_webhook_url_and_still_refuses_unknown_keys(
    context: Context,
) -> None:
    """webhook_url is a key of the postmark table for the transport too; a typo is not."""
    transport = PLUGIN.create(context(webhook_url=WEBHOOK_URL))
    transport.close()
    assert PLUGIN.callbacks is not None
    with pytest.raises(ConfigError, match=r"postmark\.webhook_ur: unknown key"):
        PLUGIN.callbacks(context(webhook_ur=WEBHOOK_URL))
