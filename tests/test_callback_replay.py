"""Callbacks cannot be replayed into new facts, and raw statuses are evidence.

A Twilio status callback is stored once per signed content (the URL with its query and
the form parameters), however its unsigned I-Twilio-Idempotency-Token varies. A raw
status that is not one of the provider's documented values, from a callback or from any
transport reply, is stored as ``unknown:<length>``: a signed body re-split so that
MessageStatus swallows the parameters after it carries the phone number, and that must
reach neither the database nor ``inspect``, ``export-timings`` or ``replay``.

Callbacks go to the real WSGI endpoint over loopback HTTP (test_web_callbacks' server),
signed with the oracle in test_twilio_signature.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from conftest import FakeClock, database_follows, make_settings, reset_request, run_sweep
from conftest import resetctl as cli
from contract import email_message, sms_message
from fakes import look_up
from providers_http import ProviderHandler
from providers_postmark import SENDER as POSTMARK_SENDER
from providers_postmark import TOKEN as POSTMARK_TOKEN
from providers_postmark import FakePostmark
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER, FakeTwilio
from test_twilio_signature import reference_signature
from test_web_callbacks import post, sent_sms, serving

import resetctl
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import MalformedCallback
from resetctl.machine import Status
from resetctl.replay import read_traces
from resetctl.store import Store
from resetctl.transports import BUILT_IN, ProviderStatus, build_transports, close_transports
from resetctl.transports import plugin as transport_plugin
from resetctl.transports.postmark import PostmarkTransport
from resetctl.transports.twilio import TwilioTransport
from resetctl.web import twilio_callbacks

PUBLIC_URL = "https://hooks.acme.example/twilio?site=eu"
#: reset_request's recipient: the number a re-split body carries.
PHONE = "+14155550123"
#: what a read or callback that carried PHONE as its status stores
PHONE_EVIDENCE = f"unknown:{len(PHONE)}"
ENVIRON = {
    "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
    "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
    # The db fixture's key on PostgreSQL (a server keeps no key file beside it).
    "RESETCTL_HASH_KEY": "test-hash-key-0123456789abcdef",
}


@pytest.fixture
def clock() -> FakeClock:
    # Near the real time: on PostgreSQL due times and leases are read on its clock.
    return FakeClock(time.time())


@pytest.fixture
def settings(twilio: FakeTwilio) -> Settings:
    return make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio.base_url, "from": SENDER, "status_callback": PUBLIC_URL},
        policy={"default": {"channels": ["sms", "email"]}},
    )


@pytest.fixture
def handle(db: str, settings: Settings, clock: FakeClock) -> Iterator[resetctl.Handle]:
    with resetctl.open(
        db, settings, clock=clock, sleep=clock.sleep, environ=ENVIRON, busy_timeout=5
    ) as opened:
        yield opened


def callback_form(sid: str, status: str) -> dict[str, str]:
    """A status callback's parameters as Twilio posts them for an SMS to PHONE."""
    return {
        "ApiVersion": "2010-04-01",
        "AccountSid": ACCOUNT_SID,
        "SmsSid": sid,
        "SmsStatus": status,
        "MessageSid": sid,
        "MessageStatus": status,
        "From": SENDER,
        "To": PHONE,
    }


def resplit(form: dict[str, str]) -> dict[str, str]:
    """The same signed bytes read as other parameters: MessageStatus swallows every
    parameter after it in name order (SmsSid, SmsStatus, To and its number)."""
    names = sorted(form)
    at = names.index("MessageStatus")
    swallowed = form["MessageStatus"] + "".join(name + form[name] for name in names[at + 1 :])
    return {**{name: form[name] for name in names[:at]}, "MessageStatus": swallowed}


def observation_rows(store: Store) -> list[tuple[Any, ...]]:
    """Every observation, every column, oldest first."""
    rows = store.conn.execute("SELECT * FROM observations ORDER BY id").fetchall()
    return [tuple(row) for row in rows]


def callback_rows(store: Store) -> list[tuple[str, str, str]]:
    """(raw_status, status, dedupe) of each stored callback, oldest first."""
    rows = store.conn.execute(
        "SELECT raw_status, status, dedupe FROM observations WHERE source = 'callback' ORDER BY id"
    ).fetchall()
    return [(str(raw), str(status), str(dedupe)) for raw, status, dedupe in rows]


def poll_rows(store: Store) -> list[tuple[str, str]]:
    """(raw_status, status) of each stored poll, oldest first."""
    rows = store.conn.execute(
        "SELECT raw_status, status FROM observations WHERE source = 'poll' ORDER BY id"
    ).fetchall()
    return [(str(raw), str(status)) for raw, status in rows]


def assert_no_number(text: str) -> None:
    """PHONE in no form a JSON document, a URL or a database row could hold it."""
    for form in (PHONE, PHONE.lstrip("+"), quote(PHONE, safe="")):
        assert form not in text


# -- dedupe on what is signed ---------------------------------------------------------


def test_a_callback_replayed_under_three_tokens_is_stored_once(
    handle: resetctl.Handle, twilio: FakeTwilio, store: Store
) -> None:
    """One signed callback posted three times with three idempotency tokens is one
    observation; a different callback (delivered after sent) is a second."""
    notice_id, sid, url = sent_sms(handle, twilio)
    sent = callback_form(sid, "sent")

    with serving(twilio_callbacks(handle)) as base:
        replays = [
            post(base, url, sent, headers={"I-Twilio-Idempotency-Token": token})
            for token in ("idem-1", "idem-2", "idem-3")
        ]
        delivered = post(
            base, url, callback_form(sid, "delivered"), headers={"I-Twilio-Idempotency-Token": "x"}
        )

    assert [r.status_code for r in [*replays, delivered]] == [204] * 4
    stored = callback_rows(store)
    assert [(raw, status) for raw, status, _ in stored] == [
        ("sent", "accepted"),
        ("delivered", "delivered"),
    ]
    # A digest of what was signed: no number, sid, body or URL in clear.
    assert all(re.fullmatch(r"twilio:sig:[0-9a-f]{64}", dedupe) for _, _, dedupe in stored)
    assert len({dedupe for _, _, dedupe in stored}) == 2
    assert handle.inspect(notice_id)["phase"] == "accepted"


def test_observe_ignores_the_idempotency_token(
    handle: resetctl.Handle, twilio: FakeTwilio, store: Store, db: str
) -> None:
    """`observe twilio --idempotency-token` is accepted and changes nothing: the same
    signed callback under another token is a duplicate."""
    _, sid, url = sent_sms(handle, twilio)
    form = callback_form(sid, "delivered")
    signature = reference_signature(url, form, AUTH_TOKEN)

    def observe(token: str) -> dict[str, Any]:
        done = cli(
            *("observe", "twilio", "--url", url, "--signature", signature, "--json"),
            *("--idempotency-token", token),
            db=db,
            input=urlencode(form),
            env={"TWILIO_AUTH_TOKEN": AUTH_TOKEN},
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    assert [observe("tok-1")["duplicate"], observe("tok-2")["duplicate"]] == [False, True]
    assert len(callback_rows(store)) == 1


def test_the_unique_index_alone_keeps_a_replay_out(
    handle: resetctl.Handle, twilio: FakeTwilio, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the in-transaction check skipped (two racing replays can both pass it), the
    UNIQUE index on observations.dedupe (INSERT … ON CONFLICT DO NOTHING) stores one."""
    _, sid, url = sent_sms(handle, twilio)
    monkeypatch.setattr(Store, "observation_seen", lambda self, dedupe: False)
    form = callback_form(sid, "sent")
    signature = reference_signature(url, form, AUTH_TOKEN)

    for _ in range(3):
        handle.observe("twilio", body=urlencode(form), url=url, signature=signature)

    assert len(callback_rows(store)) == 1


def test_a_resplit_of_a_recorded_callback_is_a_replay(
    handle: resetctl.Handle, twilio: FakeTwilio, store: Store
) -> None:
    """A body re-split under a recorded callback's signature is the same signed content:
    it is stored nothing more."""
    _, sid, url = sent_sms(handle, twilio)
    genuine = callback_form(sid, "sent")
    signature = reference_signature(url, genuine, AUTH_TOKEN)

    with serving(twilio_callbacks(handle)) as base:
        first = post(base, url, genuine)
        again = post(base, url, resplit(genuine), headers={"X-Twilio-Signature": signature})

    assert [first.status_code, again.status_code] == [204, 204]
    assert [(raw, status) for raw, status, _ in callback_rows(store)] == [("sent", "accepted")]


# -- raw statuses as evidence ---------------------------------------------------------


def test_a_resplit_body_carrying_the_number_is_stored_as_unknown_of_its_length(
    handle: resetctl.Handle, twilio: FakeTwilio, store: Store, db: str, tmp_path: Path
) -> None:
    """A validly signed body whose MessageStatus holds the phone number stores
    unknown:<length>; the number is in no observation, no `inspect --json`, no
    `export-timings` line and no `replay` output, and replay reads it as unknown."""
    notice_id, sid, url = sent_sms(handle, twilio)
    genuine = callback_form(sid, "sent")
    split = resplit(genuine)
    assert PHONE in split["MessageStatus"]
    signature = reference_signature(url, genuine, AUTH_TOKEN)
    assert reference_signature(url, split, AUTH_TOKEN) == signature  # the same signed bytes
    evidence = f"unknown:{len(split['MessageStatus'])}"

    with serving(twilio_callbacks(handle)) as base:
        answer = post(base, url, split, headers={"X-Twilio-Signature": signature})
        assert answer.status_code == 204
        assert [(raw, status) for raw, status, _ in callback_rows(store)] == [(evidence, "unknown")]
        shown = cli("inspect", notice_id, "--json", db=db)
        assert shown.returncode == 0, shown.stderr
        (attempt,) = json.loads(shown.stdout)["attempts"]
        assert attempt["last_observation"]["raw_status"] == evidence
        assert attempt["last_observation"]["status"] == "unknown"
        assert_no_number(shown.stdout)
        # Twilio's genuine receipt ends the notice, so export-timings writes it.
        assert post(base, url, callback_form(sid, "delivered")).status_code == 204

    assert_no_number(repr(observation_rows(store)))
    shown = cli("inspect", notice_id, "--json", db=db)
    assert json.loads(shown.stdout)["phase"] == "accepted"
    assert_no_number(shown.stdout)
    exported = cli("export-timings", db=db)
    assert exported.returncode == 0, exported.stderr
    assert evidence in exported.stdout
    assert_no_number(exported.stdout)

    unknown: Counter[tuple[str, str, str]] = Counter()
    (trace,) = read_traces(exported.stdout.splitlines(), unknown)
    seen = [status for _, _, status in trace.observations["sms"].changes]
    assert seen[1:] == [Status.UNKNOWN, Status.DELIVERED]
    assert unknown == Counter({("twilio", "sms", evidence): 1})
    traces = tmp_path / "traces.jsonl"
    traces.write_text(exported.stdout, encoding="utf-8")
    replayed = cli("replay", str(traces))
    assert replayed.returncode == 0, replayed.stderr
    assert evidence in replayed.stderr
    assert_no_number(replayed.stdout + replayed.stderr)


def test_a_message_sid_that_is_not_a_sid_is_refused_without_quoting_it(
    handle: resetctl.Handle, store: Store
) -> None:
    """A signed body whose MessageSid holds the number is malformed: nothing is stored and
    the error does not quote it (a sid is stored on the attempt and named in errors)."""
    form = {"MessageSid": PHONE, "MessageStatus": "delivered", "AccountSid": ACCOUNT_SID}
    url = f"{PUBLIC_URL}&attempt=ntc_x%3Asms%3A1"
    signature = reference_signature(url, form, AUTH_TOKEN)

    with pytest.raises(MalformedCallback) as refused:
        handle.observe("twilio", body=urlencode(form), url=url, signature=signature)

    assert "MessageSid" in str(refused.value)
    assert_no_number(f"{refused.value} {refused.value.problems}")
    assert observation_rows(store) == []


def test_a_twilio_status_read_of_an_undocumented_status_stores_unknown(
    store: Store, settings: Settings, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """A poll whose reply carries a status Twilio does not document stores
    unknown:<length>, normalized unknown, and the notice keeps waiting."""
    (result,) = enqueue(store, settings, [reset_request()], clock())
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        run_sweep(store, settings, clock, transports)
        (sid,) = twilio.messages
        twilio.set_status(sid, PHONE)
        clock.advance(15)  # the first SMS poll
        database_follows(store, clock)
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)

    # The fake's spec check saw the off-spec reply it was told to give.
    assert twilio.violations
    assert all("200 reply" in violation for violation in twilio.violations)
    twilio.violations.clear()
    assert poll_rows(store) == [(PHONE_EVIDENCE, "unknown")]
    assert_no_number(repr(observation_rows(store)))
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "primary_pending"


def test_a_twilio_lookup_of_an_undocumented_status_gives_unknown(
    twilio: FakeTwilio, clock: FakeClock
) -> None:
    """A message a lookup finds under a status Twilio does not document comes back as
    unknown:<length>, normalized unknown."""
    message = sms_message()
    assert message.sms is not None
    sid = twilio.add_message(message.recipient, message.sms.body, created=clock())
    twilio.set_status(sid, PHONE)
    transport = TwilioTransport(
        ACCOUNT_SID, AUTH_TOKEN, sender=SENDER, base_url=twilio.base_url, clock=clock
    )
    try:
        found = look_up(transport, message, "ntc_contract:sms:1", clock())
    finally:
        transport.close()
    # The fake's spec check saw the off-spec list reply it was told to give.
    assert twilio.violations
    twilio.violations.clear()

    assert found == ProviderStatus(sid, PHONE_EVIDENCE, Status.UNKNOWN)


@pytest.fixture
def postmark(clock: FakeClock) -> Iterator[FakePostmark]:
    server = FakePostmark(clock)
    yield server
    server.close()
    assert server.problems == []


def _postmark_transport(server: FakePostmark) -> PostmarkTransport:
    return PostmarkTransport(
        token=POSTMARK_TOKEN,
        sender=POSTMARK_SENDER,
        base_url=server.base_url,
        connect_timeout=1.0,
        read_timeout=1.0,
    )


def test_postmark_replies_keep_only_documented_words(
    postmark: FakePostmark, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """Postmark's status read and lookup store an undocumented Status as
    unknown:<length>; a documented word in another case is stored in Postmark's spelling."""
    transport = _postmark_transport(postmark)
    try:
        read = transport.submit(email_message(), "ntc_1:email:1").message_id
        postmark.statuses[read] = PHONE
        assert transport.status(read) == ProviderStatus(read, PHONE_EVIDENCE, Status.UNKNOWN)
        postmark.add_event(read, "delivered")
        assert transport.status(read) == ProviderStatus(read, "Delivered", Status.DELIVERED)

        found = transport.submit(email_message(), "ntc_2:email:1").message_id
        postmark.statuses[found] = PHONE
        answer = postmark.handle_get

        def failing_details(handler: ProviderHandler) -> None:
            if handler.path.endswith("/details"):
                handler.reply(500, "Internal Server Error")
            else:
                answer(handler)

        # The details read fails, so the search's own Status is what the lookup gives.
        monkeypatch.setattr(postmark, "handle_get", failing_details)
        looked_up = look_up(transport, email_message(), "ntc_2:email:1", clock())
    finally:
        transport.close()

    assert looked_up == ProviderStatus(found, PHONE_EVIDENCE, Status.UNKNOWN)


def test_an_outbox_status_outside_its_words_is_stored_as_unknown(
    store: Store, clock: FakeClock
) -> None:
    """A status scripted into the outbox outside its words (the store takes any string)
    is read back, in the sweep's batch read, as unknown:<length>."""
    settings = make_settings(outbox={"email_status": "pending"})
    (result,) = enqueue(store, settings, [reset_request()], clock())
    run_sweep(store, settings, clock)
    (message,) = store.outbox_messages(result.notice_id)
    assert store.outbox_set_status(message["message_id"], PHONE, clock())
    clock.advance(15)  # the first email poll
    database_follows(store, clock)
    run_sweep(store, settings, clock)

    assert poll_rows(store) == [(PHONE_EVIDENCE, "unknown")]


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_vocabulary_keeps_its_documented_words_verbatim(name: str) -> None:
    """Every documented word of a built-in transport is its own evidence; anything else
    is unknown:<length>, normalized unknown, however the transport's mapping reads it."""
    found = transport_plugin(name)
    assert found is not None
    vocabulary = found.vocabulary
    for raw in vocabulary.known:
        assert vocabulary.reading(raw) == (raw, vocabulary.normalize(raw))
    assert vocabulary.reading(PHONE) == (PHONE_EVIDENCE, Status.UNKNOWN)
    assert vocabulary.reading("") == ("unknown:0", Status.UNKNOWN)
    assert vocabulary.reading(PHONE_EVIDENCE) == (
        f"unknown:{len(PHONE_EVIDENCE)}",
        Status.UNKNOWN,
    )
