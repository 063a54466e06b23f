"""Mailgun's webhooks: verified with the webhook signing key as Mailgun's "Securing
Webhooks" page describes (checked against a signer written in the fake, never against
the code under test), refused when forged, stale or malformed, read into reports."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import T0, FakeClock
from contract import SECRET_EMAIL, assert_no_secrets, email_message
from providers_mailgun import (
    API_KEY,
    DOMAIN,
    SENDER,
    SIGNING_KEY,
    WEBHOOK_URL,
    FakeMailgun,
    reference_signature,
)

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports.base import CallbackReader, CallbackRequest, TransportContext
from resetctl.transports.mailgun import (
    PLUGIN,
    WEBHOOK_MAX_AGE,
    WEBHOOK_MAX_AHEAD,
    MailgunTransport,
)

KEY = "ntc_hook:email:1"
TOKEN = "e0b5477167110d68991efc6b9f89f0a11066af27834600e123"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def mailgun(clock: FakeClock) -> Iterator[FakeMailgun]:
    fake = FakeMailgun(clock)
    yield fake
    fake.close()
    assert fake.problems == []


def _context(store: Store, secrets: dict[str, str], **table: Any) -> TransportContext:
    return TransportContext(
        name="mailgun",
        channel="email",
        options={"domain": DOMAIN, "from": SENDER, **table},
        secret=secrets.get,
        store=store,
        clock=time.time,
    )


@pytest.fixture
def reader(store: Store) -> CallbackReader:
    assert PLUGIN.callbacks is not None
    secrets = {"MAILGUN_WEBHOOK_SIGNING_KEY": SIGNING_KEY}
    return PLUGIN.callbacks(_context(store, secrets, webhook_url=WEBHOOK_URL))


@pytest.fixture
def sent(mailgun: FakeMailgun, store: Store, clock: FakeClock) -> Iterator[str]:
    """The id of one message sent through the fake, as the transport reported it."""
    context = _context(
        store, {"MAILGUN_API_KEY": API_KEY}, base_url=mailgun.base_url, webhook_url=WEBHOOK_URL
    )
    transport = PLUGIN.create(context)
    assert isinstance(transport, MailgunTransport)
    try:
        yield transport.submit(email_message(), KEY).message_id
    finally:
        transport.close()


def _rebuilt(request: CallbackRequest, change: Any) -> CallbackRequest:
    body = json.loads(request.body)
    change(body)
    return CallbackRequest(request.url, request.headers, json.dumps(body).encode())


def _flip(signature: str) -> str:
    return signature[:10] + ("0" if signature[10] != "0" else "1") + signature[11:]


def test_the_signer_follows_mailguns_description() -> None:
    """The fake's signer is hex HMAC-SHA256 of timestamp then token, keyed, no separator."""
    spelled_out = hmac.new(b"key-1", b"1770920772" + TOKEN.encode(), hashlib.sha256)
    assert reference_signature("1770920772", TOKEN, "key-1") == spelled_out.hexdigest()


@pytest.mark.parametrize(
    ("kind", "severity", "raw", "status"),
    [
        ("delivered", None, "delivered", Status.DELIVERED),
        ("failed", "permanent", "failed/permanent", Status.FAILED),
        ("failed", "temporary", "failed/temporary", Status.PENDING),
        ("accepted", None, "accepted", Status.PENDING),
        ("rejected", None, "rejected", Status.FAILED),
    ],
)
def test_a_signed_delivery_event_is_one_report(
    reader: CallbackReader,
    mailgun: FakeMailgun,
    sent: str,
    kind: str,
    severity: str | None,
    raw: str,
    status: Status,
) -> None:
    """A verified webhook names the sent message and its attempt; a bounce is failed."""
    request = mailgun.webhook(mailgun.event_data(sent, kind, severity))
    (report,) = reader.read(request, T0)
    assert (report.message_id, report.attempt_key) == (sent, KEY)
    assert (report.raw_status, report.status) == (raw, status)
    assert report.dedupe.startswith("mailgun:sig:")


def test_the_reader_says_where_and_what_it_takes(reader: CallbackReader) -> None:
    """Its public URL is [mailgun] webhook_url, and it reads JSON bodies only."""
    assert reader.public_url == WEBHOOK_URL
    assert reader.media_types == frozenset({"application/json"})
    assert SIGNING_KEY not in repr(reader)


@pytest.mark.parametrize("kind", ["opened", "clicked", "unsubscribed", "complained"])
def test_events_that_are_not_delivery_are_no_report(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str, kind: str
) -> None:
    """An open, a click, an unsubscribe or a complaint says nothing about delivery."""
    assert reader.read(mailgun.webhook(mailgun.event_data(sent, kind)), T0) == []


def test_an_undocumented_event_is_unknown_and_stored_by_length(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str
) -> None:
    """An event type Mailgun does not document is recorded as unknown:<length>."""
    event = {**mailgun.event_data(sent, "delivered"), "event": SECRET_EMAIL}
    (report,) = reader.read(mailgun.webhook(event), T0)
    assert (report.raw_status, report.status) == (f"unknown:{len(SECRET_EMAIL)}", Status.UNKNOWN)


def test_a_webhook_signed_with_another_key_is_refused(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str
) -> None:
    """A signature made with any key but the webhook signing key does not verify."""
    for key in ("another-signing-key", API_KEY, ""):
        request = mailgun.webhook(mailgun.event_data(sent, "delivered"), key=key)
        with pytest.raises(SignatureMismatch):
            reader.read(request, T0)


@pytest.mark.parametrize(
    "forge",
    [
        lambda b: b["signature"].update(signature=b["signature"]["signature"][:-1]),
        lambda b: b["signature"].update(signature=b["signature"]["signature"][::-1]),
        lambda b: b["signature"].update(signature=_flip(b["signature"]["signature"])),
        lambda b: b["signature"].update(token=b["signature"]["token"] + "0"),
        lambda b: b["signature"].update(timestamp=str(int(b["signature"]["timestamp"]) - 1)),
        lambda b: b["signature"].pop("signature"),
        lambda b: b.pop("signature"),
        lambda b: b.update(signature="deadbeef"),
        lambda b: b["signature"].update(timestamp="1.5e9"),
    ],
    ids=[
        "truncated",
        "reversed",
        "one-digit-changed",
        "token-changed",
        "timestamp-changed",
        "no-signature",
        "no-signature-block",
        "signature-not-an-object",
        "timestamp-not-digits",
    ],
)
def test_a_forged_or_unsigned_webhook_is_refused(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str, forge: Any
) -> None:
    """Any change to what is signed, or no signature at all, is a SignatureMismatch."""
    request = _rebuilt(mailgun.webhook(mailgun.event_data(sent, "delivered")), forge)
    with pytest.raises(SignatureMismatch) as raised:
        reader.read(request, T0)
    assert_no_secrets(f"{raised.value!s} {raised.value!r}", SIGNING_KEY, TOKEN, sent)


def test_a_subaccounts_webhook_verifies_by_its_parent_signature(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str
) -> None:
    """A subaccount's webhook carries parent-signature, made with the primary's key."""
    request = mailgun.webhook(mailgun.event_data(sent, "delivered"), key="subaccount-key")

    def add_parent(body: dict[str, Any]) -> None:
        block = body["signature"]
        parent = reference_signature(block["timestamp"], block["token"], SIGNING_KEY)
        block["parent-signature"] = parent

    (report,) = reader.read(_rebuilt(request, add_parent), T0)
    assert report.status is Status.DELIVERED


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [
        (0, True),
        (-WEBHOOK_MAX_AGE, True),
        (-WEBHOOK_MAX_AGE - 1, False),
        (-86_400, False),
        (WEBHOOK_MAX_AHEAD, True),
        (WEBHOOK_MAX_AHEAD + 1, False),
    ],
    ids=["now", "oldest-kept", "just-stale", "a-day-old", "furthest-ahead", "too-far-ahead"],
)
def test_a_stale_or_future_webhook_is_refused(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str, offset: float, accepted: bool
) -> None:
    """A correctly signed webhook whose timestamp is too far from now is refused."""
    request = mailgun.webhook(
        mailgun.event_data(sent, "delivered"), timestamp=str(int(T0 + offset))
    )
    if accepted:
        assert len(reader.read(request, T0)) == 1
    else:
        with pytest.raises(SignatureMismatch):
            reader.read(request, T0)


def test_a_replay_has_the_identity_of_the_original(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str
) -> None:
    """The same signed token is one report however it is replayed, its body reworded too."""
    request = mailgun.webhook(mailgun.event_data(sent, "delivered"), token=TOKEN)
    (first,) = reader.read(request, T0)
    (again,) = reader.read(request, T0 + 60)
    shouted = _rebuilt(
        request, lambda b: b["signature"].update(signature=b["signature"]["signature"].upper())
    )
    (upper,) = reader.read(shouted, T0)
    # The event data is not signed: a captured signature under another event is the same
    # signed request, so it dedupes onto the first.
    reworded = _rebuilt(request, lambda b: b["event-data"].update(event="rejected"))
    (forged,) = reader.read(reworded, T0)
    assert first.dedupe == again.dedupe == upper.dedupe == forged.dedupe
    assert TOKEN not in first.dedupe
    signature = json.loads(request.body)["signature"]["signature"]
    assert signature not in first.dedupe
    (other,) = reader.read(mailgun.webhook(mailgun.event_data(sent, "delivered")), T0)
    assert other.dedupe != first.dedupe


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"signature=abc&token=def",
        b"\xff\xfe not utf-8",
        b"[1, 2, 3]",
        b'"a string"',
    ],
    ids=["empty", "form-encoded", "not-utf-8", "array", "string"],
)
def test_a_body_that_is_not_a_json_object_is_malformed(reader: CallbackReader, body: bytes) -> None:
    """A body Mailgun's webhooks never send is a MalformedCallback."""
    with pytest.raises(MalformedCallback):
        reader.read(CallbackRequest(WEBHOOK_URL, {"content-type": "application/json"}, body), T0)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda b: b.pop("event-data"),
        lambda b: b.update({"event-data": [SECRET_EMAIL]}),
        lambda b: b["event-data"].pop("event"),
        lambda b: (b["event-data"].pop("message"), b["event-data"].pop("user-variables")),
        lambda b: (
            b["event-data"]["message"]["headers"].update({"message-id": f"<{SECRET_EMAIL}>>"}),
            b["event-data"].pop("user-variables"),
        ),
    ],
    ids=["no-event-data", "event-data-not-an-object", "no-event", "no-ids", "bad-message-id"],
)
def test_a_signed_webhook_that_is_no_report_is_malformed(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str, break_it: Any
) -> None:
    """A verified body without an event, or naming no message nor attempt, is malformed."""
    request = _rebuilt(mailgun.webhook(mailgun.event_data(sent, "failed", "permanent")), break_it)
    with pytest.raises(MalformedCallback) as raised:
        reader.read(request, T0)
    assert_no_secrets(f"{raised.value!s} {raised.value!r}", SIGNING_KEY)


def test_a_report_naming_only_the_attempt_is_kept(
    reader: CallbackReader, mailgun: FakeMailgun, sent: str
) -> None:
    """A webhook without a readable message id still lands on its attempt by the key."""
    event = mailgun.event_data(sent, "failed", "permanent")
    event["message"]["headers"].pop("message-id")
    (report,) = reader.read(mailgun.webhook(event), T0)
    assert (report.message_id, report.attempt_key, report.status) == (None, KEY, Status.FAILED)


def test_the_reader_needs_only_the_signing_key(store: Store) -> None:
    """Without MAILGUN_WEBHOOK_SIGNING_KEY the reader fails its check and reads nothing
    (the API key is not needed)."""
    assert PLUGIN.callbacks is not None
    keyless = PLUGIN.callbacks(_context(store, {"MAILGUN_API_KEY": API_KEY}))
    with pytest.raises(ConfigError, match="MAILGUN_WEBHOOK_SIGNING_KEY"):
        keyless.check()
    with pytest.raises(ConfigError, match="MAILGUN_WEBHOOK_SIGNING_KEY"):
        keyless.read(CallbackRequest("https://hooks.example/m", {}, b"{}"), T0)
    built = PLUGIN.callbacks(_context(store, {"MAILGUN_WEBHOOK_SIGNING_KEY": SIGNING_KEY}))
    assert built.public_url is None


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://hooks.acme.example/mailgun", True),
        ("http://127.0.0.1:8080/mailgun", True),
        ("http://hooks.acme.example/mailgun", False),
        ("hooks.acme.example/mailgun", False),
        ("", False),
    ],
)
def test_the_webhook_url_must_be_https_off_this_host(store: Store, url: str, ok: bool) -> None:
    """The webhook carries the address: https://, or http:// only to a loopback host."""
    assert PLUGIN.callbacks is not None
    context = _context(store, {"MAILGUN_WEBHOOK_SIGNING_KEY": SIGNING_KEY}, webhook_url=url)
    if ok:
        assert PLUGIN.callbacks(context).public_url == url
    else:
        with pytest.raises(ConfigError, match=r"^mailgun\.webhook_url"):
            PLUGIN.callbacks(context)
