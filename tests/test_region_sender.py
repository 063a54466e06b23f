"""Sender per region (issue 25, item 1): a policy's ``email.from``, ``email.reply_to`` and
``sms.from`` are what each built-in transport sends from, else the transport's own
setting; resolved with the policy version at enqueue, so a later config change never
rewrites a notice in flight; lookups match the sender recorded at the intent; inspect
shows the sender and nothing secret. Real providers on loopback, both backends."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from email.headerregistry import Address
from typing import Any, cast

import pytest
from conftest import FakeClock, database_follows, make_settings, reset_request, resetctl, run_sweep
from fakes import ScriptedTransport
from providers_postmark import SENDER as POSTMARK_SENDER
from providers_postmark import TOKEN as POSTMARK_TOKEN
from providers_postmark import FakePostmark
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, SERVICE_SID, FakeTwilio
from providers_twilio import SENDER as TWILIO_SENDER
from test_transport_smtp import ScriptedHandler, serve

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.policy import Sender
from resetctl.render import EmailContent, SmsContent, SmsEncoding
from resetctl.report import notice_report
from resetctl.store import Store
from resetctl.transports import (
    Message,
    Transport,
    TransportContext,
    build_transports,
    close_transports,
    plugin,
)
from resetctl.transports.base import TRANSPORT_SENDER
from resetctl.transports.outbox import OutboxTransport
from resetctl.transports.twilio import TwilioTransport

ENVIRON = {
    "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
    "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
    "POSTMARK_SERVER_TOKEN": POSTMARK_TOKEN,
}
SMTP_FROM = "Shop <no-reply@shop.example>"
EU_FROM = "Shop EU <reset@eu.shop.example>"
EU_REPLY_TO = "help@eu.shop.example"
EU_NUMBER = "+4915123456789"
#: A region's own Messaging Service (the transport's is SERVICE_SID).
APAC_SERVICE = "MG" + "0123456789abcdef" * 2
EU_EMAIL = {"from": EU_FROM, "reply_to": EU_REPLY_TO}
EMAIL_ONLY: dict[str, Any] = {"channels": ["email"]}
SMS_ONLY: dict[str, Any] = {"channels": ["sms"]}
#: The regions' policies: eu names every sender, apac a Messaging Service, default none.
POLICIES = {
    "default": {"channels": ["email", "sms"]},
    "eu": {"channels": ["email", "sms"], "email": EU_EMAIL, "sms": {"from": EU_NUMBER}},
    "apac": {"channels": ["sms", "email"], "sms": {"from": APAC_SERVICE}},
}


def _sweep(store: Store, settings: Settings, clock: FakeClock) -> None:
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)


def _attempt(store: Store, notice_id: str, channel: str) -> dict[str, Any]:
    (row,) = [a for a in store.attempt_rows(notice_id) if a["channel"] == channel]
    return row


def _built(name: str, channel: str, options: Mapping[str, Any]) -> Transport:
    """A transport from its plugin, as a sweep builds it, without a store (SMTP and
    Twilio keep nothing in the database)."""
    found = plugin(name)
    assert found is not None
    context = TransportContext(
        name=name,
        channel=channel,
        options=options,
        secret=ENVIRON.get,
        store=cast(Store, None),
        clock=time.time,
    )
    return found.create(context)


@pytest.fixture
def clock() -> FakeClock:
    # Real time, moved by hand: on PostgreSQL the database's clock decides.
    return FakeClock(time.time())


@pytest.fixture
def relay() -> Iterator[tuple[ScriptedHandler, int]]:
    handler = ScriptedHandler()
    with serve(handler) as port:
        yield handler, port


@pytest.fixture
def twilio_server(clock: FakeClock) -> Iterator[FakeTwilio]:
    server = FakeTwilio(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def postmark_server(clock: FakeClock) -> Iterator[FakePostmark]:
    server = FakePostmark(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.problems == []


@pytest.mark.parametrize(
    ("given", "address", "name"),
    [
        (EU_FROM, "reset@eu.shop.example", "Shop EU"),
        ("reset@eu.shop.example", "reset@eu.shop.example", None),
        ('"Shop, EU" <reset@eu.shop.example>', "reset@eu.shop.example", "Shop, EU"),
        (
            {"address": "reset@eu.shop.example", "name": "Shop EU"},
            "reset@eu.shop.example",
            "Shop EU",
        ),
    ],
)
def test_a_policys_from_is_read_as_one_mailbox(
    given: object, address: str, name: str | None
) -> None:
    """``email.from`` as a string (on every interpreter: 3.11.7's parseaddr has no strict
    mode) or a table gives the address and display name the transports send."""
    policy = make_settings(policy={"eu": {"email": {"from": given}}}).policies["eu"]
    assert (policy.sender.email_from, policy.sender.email_from_name) == (address, name)


@pytest.mark.parametrize(
    "given",
    [
        "reset@eu.shop.example, other@attacker.example",
        "reset@eu.shop.example)<other@attacker.example>",
        "Shop <reset@eu.shop.example> <other@attacker.example>",
        "Shop, EU <reset@eu.shop.example>",
        "Shop EU <reset@eu.shop.example",
        "team: reset@eu.shop.example;",
        "not an address",
        "",
    ],
)
def test_a_policys_from_that_is_not_exactly_one_mailbox_is_refused(given: str) -> None:
    """Several addresses, a group, or one parseaddr would read half of (CVE-2023-27043)
    is a ConfigError naming the key, never the first address that happened to parse."""
    with pytest.raises(ConfigError, match=r"policy\.eu\.email\.from: expected an address"):
        make_settings(policy={"eu": {"email": {"from": given}}})


def _smtp(port: int) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": port, "security": "none", "from": SMTP_FROM}


def test_smtp_sends_from_the_regions_sender_else_smtp_from(
    store: Store, relay: tuple[ScriptedHandler, int], clock: FakeClock
) -> None:
    """An eu notice's email comes from the eu policy (From with its name, Reply-To, the
    envelope); a default notice's from [smtp] from, with no Reply-To."""
    handler, port = relay
    settings = make_settings(
        transport={"email": "smtp"},
        smtp=_smtp(port),
        policy={"default": EMAIL_ONLY, "eu": {**EMAIL_ONLY, "email": EU_EMAIL}},
    )
    requests = [reset_request(region="eu"), reset_request()]
    eu, default = enqueue(store, settings, requests, clock())
    _sweep(store, settings, clock)
    pairs = zip(handler.received, handler.envelopes, strict=True)
    mails = {str(mail["To"]): (mail, envelope) for mail, envelope in pairs}
    eu_mail, eu_envelope = mails[requests[0]["email"]]
    assert eu_mail["From"] == EU_FROM
    assert eu_mail["Reply-To"] == EU_REPLY_TO
    assert eu_envelope[0] == "reset@eu.shop.example"
    default_mail, default_envelope = mails[requests[1]["email"]]
    assert default_mail["From"] == SMTP_FROM
    assert "Reply-To" not in default_mail
    assert default_envelope[0] == "no-reply@shop.example"
    # SMTP records no fingerprint (nothing to look up): inspect names the policy's sender.
    assert notice_report(store, eu.notice_id, clock())["attempts"][0]["sender"] == {
        "source": "policy",
        "from": "reset@eu.shop.example",
        "from_name": "Shop EU",
        "reply_to": EU_REPLY_TO,
    }
    assert notice_report(store, default.notice_id, clock())["attempts"][0]["sender"] == {
        "source": "transport"
    }


@pytest.mark.parametrize("name", ["Shop EU", "Boutique Zürich, EU", 'Shop "EU" \\ Support'])
def test_smtp_writes_any_display_name_as_one_mailbox(
    relay: tuple[ScriptedHandler, int], name: str
) -> None:
    """A display name with commas, quotes or non-ASCII letters arrives as written, in one
    From mailbox, with the headers resetctl built and no more."""
    handler, port = relay
    transport = _built("smtp", "email", _smtp(port))
    sender = Sender("reset@eu.shop.example", name, EU_REPLY_TO)
    transport.submit(_email_message(sender), "ntc_1:email:1")
    (mail,) = handler.received
    (address,) = mail["From"].addresses
    assert (address.display_name, address.addr_spec) == (name, "reset@eu.shop.example")
    assert [a.addr_spec for a in mail["Reply-To"].addresses] == [EU_REPLY_TO]
    assert len(mail.get_all("From")) == 1


def test_smtp_an_internationalized_sender_travels_with_smtputf8(
    relay: tuple[ScriptedHandler, int],
) -> None:
    """A region's non-ASCII sender address is sent with SMTPUTF8, as a recipient's is."""
    handler, port = relay
    transport = _built("smtp", "email", _smtp(port))
    transport.submit(_email_message(Sender("reset@bücher.example", "Bücher")), "ntc_1:email:1")
    assert handler.envelopes[0][0] == "reset@bücher.example"
    assert str(handler.received[0]["From"]) == str(
        Address("Bücher", addr_spec="reset@bücher.example")
    )


def _email_message(sender: Sender) -> Message:
    content = EmailContent("Your reset link", "https://shop.example/r/1", "<p>link</p>")
    return Message("email", "ntc_1", "ada@example.org", 4e9, email=content, sender=sender)


def test_postmark_sends_the_regions_from_and_reply_to(
    store: Store, postmark_server: FakePostmark, clock: FakeClock
) -> None:
    """An eu send names the eu From (with its name) and ReplyTo, as Postmark's email API
    spells them; a default send names [postmark] from and no ReplyTo."""
    settings = make_settings(
        transport={"email": "postmark"},
        postmark={"base_url": postmark_server.base_url, "from": POSTMARK_SENDER},
        policy={"default": EMAIL_ONLY, "eu": {**EMAIL_ONLY, "email": EU_EMAIL}},
    )
    requests = [reset_request(region="eu"), reset_request()]
    eu, default = enqueue(store, settings, requests, clock())
    _sweep(store, settings, clock)
    sent = {p["To"]: p for p in postmark_server.sent.values()}
    assert (sent[requests[0]["email"]]["From"], sent[requests[0]["email"]]["ReplyTo"]) == (
        EU_FROM,
        EU_REPLY_TO,
    )
    assert sent[requests[1]["email"]]["From"] == POSTMARK_SENDER
    assert "ReplyTo" not in sent[requests[1]["email"]]
    # What the lookup would match is recorded with the intent: the sender actually named.
    recorded = json.loads(_attempt(store, eu.notice_id, "email")["sent"])
    assert (recorded["from"], recorded["reply_to"]) == (EU_FROM, EU_REPLY_TO)
    assert json.loads(_attempt(store, default.notice_id, "email")["sent"])["from"] == (
        POSTMARK_SENDER
    )


@pytest.mark.parametrize(
    ("transport_sender", "default_form"),
    [
        ({"from": TWILIO_SENDER}, {"From": TWILIO_SENDER}),
        ({"messaging_service_sid": SERVICE_SID}, {"MessagingServiceSid": SERVICE_SID}),
    ],
    ids=["transport-from", "transport-service"],
)
def test_twilio_sends_the_regions_number_or_messaging_service(
    store: Store,
    twilio_server: FakeTwilio,
    clock: FakeClock,
    transport_sender: dict[str, str],
    default_form: dict[str, str],
) -> None:
    """A region's number goes as From, its Messaging Service as MessagingServiceSid, each
    alone (never beside the transport's own); a region without one sends as [twilio]
    says. Every create is checked against Twilio's OpenAPI description."""
    settings = make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio_server.base_url, **transport_sender},
        policy={
            "default": SMS_ONLY,
            "eu": {**SMS_ONLY, "sms": {"from": EU_NUMBER}},
            "apac": {**SMS_ONLY, "sms": {"from": APAC_SERVICE}},
        },
    )
    requests = [reset_request(region="eu"), reset_request(region="apac"), reset_request()]
    eu, apac, default = enqueue(store, settings, requests, clock())
    _sweep(store, settings, clock)

    def sender_of(notice_id: str) -> dict[str, str]:
        message = twilio_server.messages[_attempt(store, notice_id, "sms")["message_id"]]
        named = {"From": message["from"], "MessagingServiceSid": message["messaging_service_sid"]}
        return {k: v for k, v in named.items() if v is not None}

    assert sender_of(eu.notice_id) == {"From": EU_NUMBER}
    assert sender_of(apac.notice_id) == {"MessagingServiceSid": APAC_SERVICE}
    assert sender_of(default.notice_id) == default_form
    assert len(twilio_server.requests) == 3


def test_outbox_records_the_sender_in_the_stored_message(store: Store, clock: FakeClock) -> None:
    """The outbox keeps the sender a message was sent from, per channel, for tests and
    demos to read; a message whose policy names none records none."""
    settings = make_settings(
        outbox={"email_status": "failed", "sms_status": "pending", "keep_content": True},
        policy=POLICIES,
    )
    eu, default = enqueue(store, settings, [reset_request(region="eu"), reset_request()], clock())
    _sweep(store, settings, clock)  # the email fails at once: the SMS goes in this sweep

    def stored(notice_id: str) -> dict[str, dict[str, Any]]:
        rows = store.outbox_messages(notice_id)
        found = [store.outbox_message(row["message_id"]) for row in rows]
        return {m["channel"]: m for m in found if m is not None}

    eu_messages = stored(eu.notice_id)
    assert (eu_messages["email"]["from"], eu_messages["email"]["reply_to"]) == (
        EU_FROM,
        EU_REPLY_TO,
    )
    assert eu_messages["sms"]["from"] == EU_NUMBER
    default_messages = stored(default.notice_id)
    assert set(default_messages) == {"email", "sms"}
    for message in default_messages.values():
        assert "from" not in message
        assert "reply_to" not in message


def test_a_plugin_transport_gets_the_sender_and_may_ignore_it(
    store: Store, clock: FakeClock
) -> None:
    """A third-party transport is handed the same Message with the policy's sender
    added; one written before senders were policy (it ignores the field) still sends,
    and a Message built the old way carries the transport's own sender."""
    settings = make_settings(policy=POLICIES)
    seen: list[Sender] = []
    inner = OutboxTransport(store, "accepted", clock)
    email = ScriptedTransport(inner, on_submit=lambda message, key: seen.append(message.sender))
    (eu,) = enqueue(store, settings, [reset_request(region="eu")], clock())
    run_sweep(store, settings, clock, {"email": email, "sms": inner})
    assert seen == [settings.policy_for("eu").sender]  # type: ignore[union-attr]
    loaded = store.load_notice(eu.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"
    old_style = Message("sms", "ntc_1", "+14155550123", 4e9)
    assert old_style.sender is TRANSPORT_SENDER
    assert old_style.sender == Sender()


def test_a_sender_changed_after_enqueue_leaves_the_notice_in_flight_alone(
    store: Store, twilio_server: FakeTwilio, clock: FakeClock
) -> None:
    """Senders change in config (version bumped) between a notice's email and its SMS
    fallback: the notice in flight finishes from the senders of its own version, by
    email and by SMS, while a notice enqueued after the change uses the new ones."""

    def settings_at(version: int, email_from: str, number: str) -> Settings:
        eu = {
            "version": version,
            "channels": ["email", "sms"],
            "email": {"from": email_from, "poll_delays": [5]},
            "sms": {"from": number},
        }
        return make_settings(
            transport={"sms": "twilio"},
            twilio={"base_url": twilio_server.base_url, "from": TWILIO_SENDER},
            outbox={"email_status": "pending", "keep_content": True},
            policy={"eu": eu},
        )

    old = settings_at(1, "Shop EU <reset@eu.shop.example>", "+4915123456789")
    new = settings_at(2, "Shop Europe <hello@europe.shop.example>", "+4917612345678")
    (in_flight,) = enqueue(store, old, [reset_request(region="eu")], clock())
    _sweep(store, old, clock)  # the email goes out; the SMS is its fallback, later

    (fresh,) = enqueue(store, new, [reset_request(region="eu")], clock())
    for _ in range(2):  # every sweep from here on runs with the new config only
        clock.advance(6)
        database_follows(store, clock)
        _sweep(store, new, clock)

    def email_from(notice_id: str) -> str:
        (row,) = store.outbox_messages(notice_id)
        message = store.outbox_message(row["message_id"])
        assert message is not None
        return str(message["from"])

    def sms_from(notice_id: str) -> str:
        sid = _attempt(store, notice_id, "sms")["message_id"]
        return str(twilio_server.messages[sid]["from"])

    assert email_from(in_flight.notice_id) == "Shop EU <reset@eu.shop.example>"
    assert sms_from(in_flight.notice_id) == "+4915123456789"
    assert email_from(fresh.notice_id) == "Shop Europe <hello@europe.shop.example>"
    assert sms_from(fresh.notice_id) == "+4917612345678"
    report = notice_report(store, in_flight.notice_id, clock())
    assert report["policy_version"] == 1
    assert report["senders"]["sms"] == {"from": "+4915123456789"}


#: Seconds a provider's list trails its creates in the lookup tests: the lookup right
#: after a lost reply finds nothing, so the one that finds it runs under the new config.
LIST_LAG = 8.0


def _until_settled(store: Store, settings: Settings, clock: FakeClock, attempt_key: str) -> None:
    """Sweep every 6 s (more than the 5 s settle time) until the doubt is settled."""
    for _ in range(5):
        clock.advance(6)
        database_follows(store, clock)
        _sweep(store, settings, clock)
        if _attempt_by_key(store, attempt_key)["state"] != "ambiguous":
            return


def _attempt_by_key(store: Store, attempt_key: str) -> dict[str, Any]:
    notice_id = attempt_key.split(":")[0]
    (row,) = [a for a in store.attempt_rows(notice_id) if a["attempt_key"] == attempt_key]
    return row


@pytest.mark.parametrize("region", ["eu", "default"])
def test_a_twilio_lookup_matches_the_sender_recorded_not_todays(
    store: Store, twilio_server: FakeTwilio, clock: FakeClock, region: str
) -> None:
    """A create whose reply was lost is looked up by the sender it named (the region's,
    or the transport's of the time) after [twilio] from has changed: found, no second
    SMS. (Looked up by today's From, the list would show nothing and the SMS would be
    sent again once two lookups had missed it.)"""

    def settings_from(number: str) -> Settings:
        return make_settings(
            transport={"sms": "twilio"},
            twilio={"base_url": twilio_server.base_url, "from": number, "lookup_settle": "5s"},
            policy={"default": SMS_ONLY, "eu": {**SMS_ONLY, "sms": {"from": EU_NUMBER}}},
        )

    twilio_server.list_lag = LIST_LAG
    before = settings_from(TWILIO_SENDER)
    (notice,) = enqueue(store, before, [reset_request(region=region)], clock())
    twilio_server.outcomes.append("created-504")
    _sweep(store, before, clock)
    key = _attempt(store, notice.notice_id, "sms")["attempt_key"]
    assert _attempt_by_key(store, key)["state"] == "ambiguous"
    looked_up_before = len(twilio_server.list_queries)
    named = EU_NUMBER if region == "eu" else TWILIO_SENDER

    _until_settled(store, settings_from("+15005550007"), clock, key)
    attempt = _attempt_by_key(store, key)
    assert attempt["state"] == "submitted"
    assert attempt["message_id"] in twilio_server.messages
    assert len(twilio_server.requests) == 1  # no second create
    after_change = twilio_server.list_queries[looked_up_before:]
    assert after_change
    assert {tuple(q["From"]) for q in after_change} == {(named,)}


def test_a_postmark_lookup_survives_a_changed_from(
    store: Store, postmark_server: FakePostmark, clock: FakeClock
) -> None:
    """A send whose reply was lost is found by its attempt key after [postmark] from has
    changed: the lookup never searches by today's sender."""

    def settings_from(sender: str) -> Settings:
        table = {"base_url": postmark_server.base_url, "from": sender, "lookup_settle": "5s"}
        return make_settings(
            transport={"email": "postmark"}, postmark=table, policy={"default": EMAIL_ONLY}
        )

    postmark_server.search_lag = LIST_LAG
    before = settings_from(POSTMARK_SENDER)
    (notice,) = enqueue(store, before, [reset_request()], clock())
    postmark_server.script("created-504")
    _sweep(store, before, clock)
    key = _attempt(store, notice.notice_id, "email")["attempt_key"]
    assert _attempt_by_key(store, key)["state"] == "ambiguous"
    searched_before = len(postmark_server.searches)

    _until_settled(store, settings_from("Acme Support <support@acme.example>"), clock, key)
    assert _attempt_by_key(store, key)["state"] == "submitted"
    assert len(postmark_server.searches) > searched_before
    assert len(postmark_server.sent) == 1  # no second email
    (sent,) = postmark_server.sent.values()
    assert sent["From"] == POSTMARK_SENDER
    loaded = store.load_notice(notice.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"  # Postmark's "Sent" ends an email


def test_twilio_fingerprint_names_the_messages_sender() -> None:
    """What a lookup will match names the sender the create sends: the policy's number or
    service, else the transport's; a changed default would miss the message, which is
    why the one recorded at the intent is used."""
    ours = _built("twilio", "sms", {"from": TWILIO_SENDER})
    assert isinstance(ours, TwilioTransport)
    body = "Reset: https://shop.example/r/1"

    def message(sender: Sender) -> Message:
        sms = SmsContent(body, SmsEncoding.GSM7, 1)
        return Message("sms", "ntc_1", "+14155550123", 4e9, sms=sms, sender=sender)

    assert ours.fingerprint(message(Sender()))["from"] == TWILIO_SENDER
    assert ours.fingerprint(message(Sender(sms_from=EU_NUMBER)))["from"] == EU_NUMBER
    by_service = ours.fingerprint(message(Sender(sms_from=APAC_SERVICE)))
    assert (by_service["from"], by_service["service"]) == ("", APAC_SERVICE)
    ours.close()


def test_inspect_shows_the_sender_per_attempt_and_per_channel(
    db: str, store: Store, postmark_server: FakePostmark, clock: FakeClock
) -> None:
    """inspect (JSON and text) names each attempt's sender and how it is known (recorded
    at the intent while the notice lives, its policy's once that is scrubbed) and the
    policy's sender per channel; never the recipient, the link or the body's digest."""
    settings = make_settings(
        transport={"email": "postmark"},
        postmark={"base_url": postmark_server.base_url, "from": POSTMARK_SENDER},
        policy=POLICIES,
    )
    request = reset_request(region="eu")
    (notice,) = enqueue(store, settings, [request], clock())
    _sweep(store, settings, clock)
    secrets = (request["email"], request["phone"], request["reset_url"], "body_sha256")

    shown = resetctl("inspect", notice.notice_id, "--json", db=db)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["senders"] == {
        "email": {"from": "reset@eu.shop.example", "from_name": "Shop EU", "reply_to": EU_REPLY_TO},
        "sms": {"from": EU_NUMBER},
    }
    (attempt,) = report["attempts"]
    assert attempt["sender"] == {"source": "recorded", "from": EU_FROM, "reply_to": EU_REPLY_TO}
    text = resetctl("inspect", notice.notice_id, db=db)
    assert text.returncode == 0, text.stderr
    assert f"senders: email {EU_FROM}, reply-to {EU_REPLY_TO}; sms {EU_NUMBER}" in text.stdout
    assert f"from {EU_FROM}, reply-to {EU_REPLY_TO} (recorded)" in text.stdout
    for secret in secrets:
        assert secret not in shown.stdout
        assert secret not in text.stdout

    # Delivered: the notice ends and its fingerprint is scrubbed; the policy still says.
    (message_id,) = postmark_server.sent
    postmark_server.add_event(message_id, "Delivered")
    clock.advance(16)
    database_follows(store, clock)
    _sweep(store, settings, clock)
    ended = notice_report(store, notice.notice_id, clock())
    assert ended["phase"] == "accepted"
    assert ended["attempts"][0]["sender"]["source"] == "policy"
    assert ended["attempts"][0]["sender"]["from"] == "reset@eu.shop.example"
    text = resetctl("inspect", notice.notice_id, db=db)
    assert f"from {EU_FROM}, reply-to {EU_REPLY_TO} (policy)" in text.stdout
