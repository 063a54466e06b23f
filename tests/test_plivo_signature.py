"""Plivo's status callbacks: X-Plivo-Signature-V3, checked against an oracle written from
Plivo's description of it (providers_plivo.reference_signature, never the code under
test), and the reader that turns a verified callback into one report.

No published V3 test vector exists; the oracle is also pinned below by a signed string
spelled out by hand. A forged, altered or V2-only request is refused, a replay (or a
retry under a fresh nonce) has one dedupe identity, a re-split body verifies but carries
no phone number into what is stored, and a malformed one is refused without quoting it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from conftest import T0, FakeClock
from contract import SECRET_PHONE, assert_no_secrets, sms_message
from hypothesis import assume, given
from hypothesis import strategies as st
from providers_plivo import (
    AUTH_TOKEN,
    CALLBACK_URL,
    SENDER,
    FakePlivo,
    plivo_context,
    reference_signature,
)

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.transports.base import CallbackReader, CallbackRequest
from resetctl.transports.plivo import (
    PLUGIN,
    PlivoCallbacks,
    PlivoTransport,
    compute_signature,
    signed_base,
    verify_signature,
)

URL = "https://hooks.example.com/plivo/status?attempt=n1%3Asms%3A1&tenant=acme"
UUID = "5b40a428-bfc7-4daf-9d06-726c558bf3b8"
NONCE = "05429567804466091622"
#: A status callback's fields in the order Plivo posts them (not sorted).
FIELDS = [
    ("To", SECRET_PHONE.lstrip("+")),
    ("From", SENDER.lstrip("+")),
    ("Status", "delivered"),
    ("MessageUUID", UUID),
    ("ParentMessageUUID", UUID),
    ("ErrorCode", ""),
    ("Units", "1"),
    ("Type", "sms"),
]
SIGNATURE = reference_signature(URL, FIELDS, NONCE, AUTH_TOKEN)


def _request(
    fields: list[tuple[str, str]] = FIELDS,
    *,
    url: str = URL,
    signature: str | None = None,
    nonce: str = NONCE,
    body: bytes | None = None,
) -> CallbackRequest:
    signed = reference_signature(url, fields, nonce, AUTH_TOKEN) if signature is None else signature
    headers = {"x-plivo-signature-v3": signed, "x-plivo-signature-v3-nonce": nonce}
    return CallbackRequest(url, headers, urlencode(fields).encode() if body is None else body)


def _reader(**table: str) -> CallbackReader:
    assert PLUGIN.callbacks is not None
    context = plivo_context({"from": SENDER, **table}, None, FakeClock())
    return PLUGIN.callbacks(context)


@pytest.fixture
def reader() -> CallbackReader:
    return _reader(status_callback=CALLBACK_URL)


def test_the_oracle_signs_what_is_spelled_out_here() -> None:
    """The signed string is the URL's base, the sorted decoded query, a dot, the sorted
    name+value pairs, then a dot and the nonce: checked against a literal."""
    fields = [("b", "2"), ("a", "1 x"), ("B", "3")]
    url = "https://h.example:8443/cb?z=9&attempt=k%3A1"
    literal = "https://h.example:8443/cb?attempt=k:1&z=9.B3a1 xb2"
    assert signed_base(url, fields) == literal
    mac = hmac.new(b"tok", f"{literal}.{NONCE}".encode(), hashlib.sha256).digest()
    assert reference_signature(url, fields, NONCE, "tok") == base64.b64encode(mac).decode()
    assert compute_signature(url, fields, NONCE, "tok") == base64.b64encode(mac).decode()


@pytest.mark.parametrize(
    ("url", "fields", "literal"),
    [
        ("https://h.example/cb", [("a", "1")], "https://h.example/cb?a1"),
        ("https://h.example/cb?q=1", [], "https://h.example/cb?q=1"),
        ("https://h.example/cb", [], "https://h.example/cb"),
        (
            "https://h.example/cb?q=2&q=1",
            [("a", "2"), ("a", "1")],
            "https://h.example/cb?q=1&q=2.a1a2",
        ),
    ],
    ids=["body-only", "query-only", "neither", "repeated-values-sorted"],
)
def test_the_signed_string_has_plivos_separators(
    url: str, fields: list[tuple[str, str]], literal: str
) -> None:
    """``?`` when a query or body follows, ``.`` only between a query and a body."""
    assert signed_base(url, fields) == literal


STATUSES = [
    ("queued", Status.PENDING),
    ("sent", Status.ACCEPTED),
    ("delivered", Status.DELIVERED),
    ("undelivered", Status.FAILED),
    ("rejected", Status.FAILED),
    ("received", Status.UNKNOWN),
]


@pytest.fixture
def fake(clock: FakeClock) -> Iterator[FakePlivo]:
    server = FakePlivo(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.mark.parametrize(("raw", "expected"), STATUSES)
def test_a_callback_plivo_signs_reports_the_message_attempt_and_status(
    fake: FakePlivo, clock: FakeClock, reader: CallbackReader, raw: str, expected: Status
) -> None:
    """A callback the fake Plivo posts for a sent message names it, its attempt and state."""
    table = {"from": SENDER, "base_url": fake.base_url, "status_callback": CALLBACK_URL}
    transport = PLUGIN.create(plivo_context(table, None, clock))
    try:
        sent = transport.submit(sms_message(), "ntc_1:sms:1")
    finally:
        transport.close()
    (report,) = reader.read(fake.callback(sent.message_id, raw), T0)
    assert (report.message_id, report.attempt_key) == (sent.message_id, "ntc_1:sms:1")
    assert (report.raw_status, report.status) == (raw, expected)
    assert report.dedupe.startswith("plivo:sig:")
    assert_no_secrets(f"{report!r} {reader!r}", AUTH_TOKEN)


def test_the_reader_names_its_public_url_and_media_type(reader: CallbackReader) -> None:
    """The reader serves the status_callback URL and takes form posts only."""
    assert isinstance(reader, PlivoCallbacks)
    assert reader.public_url == CALLBACK_URL
    assert reader.media_types == frozenset({"application/x-www-form-urlencoded"})
    assert _reader().public_url is None


def test_a_reader_needs_the_auth_token() -> None:
    """No PLIVO_AUTH_TOKEN fails the reader's check and every read, naming it and no
    value."""
    assert PLUGIN.callbacks is not None
    context = plivo_context({"from": SENDER}, None, FakeClock(), PLIVO_AUTH_TOKEN="")
    keyless = PLUGIN.callbacks(context)
    with pytest.raises(ConfigError, match="PLIVO_AUTH_TOKEN"):
        keyless.check()
    with pytest.raises(ConfigError, match="PLIVO_AUTH_TOKEN"):
        keyless.read(_request(), T0)


def test_fields_in_plivos_order_verify(reader: CallbackReader) -> None:
    """Plivo's unsorted field order verifies: the code sorts the fields by name."""
    assert [name for name, _ in FIELDS] != sorted(name for name, _ in FIELDS)
    assert verify_signature(URL, FIELDS, NONCE, SIGNATURE, AUTH_TOKEN)
    (report,) = reader.read(_request(), T0)
    assert (report.message_id, report.attempt_key, report.raw_status) == (
        UUID,
        "n1:sms:1",
        "delivered",
    )


def _altered(name: str, value: str) -> list[tuple[str, str]]:
    return [(n, value if n == name else v) for n, v in FIELDS]


@pytest.mark.parametrize(
    "request_",
    [
        _request(signature=SIGNATURE[:-2] + "A="),
        _request(signature=""),
        _request(_altered("Status", "failed"), signature=SIGNATURE),
        _request([*FIELDS, ("Extra", "1")], signature=SIGNATURE),
        _request(url=URL.replace("tenant=acme", "tenant=evil"), signature=SIGNATURE),
        _request(url=URL.replace("n1%3A", "n2%3A"), signature=SIGNATURE),
        _request(url=URL.replace("https", "http"), signature=SIGNATURE),
        _request(nonce="05429567804466091623", signature=SIGNATURE),
        _request(signature=reference_signature(URL, FIELDS, NONCE, "another-token")),
        _request(signature=SIGNATURE + "é"),
        _request(nonce=""),
    ],
    ids=[
        "forged",
        "empty",
        "param-changed",
        "param-added",
        "query-changed",
        "attempt-changed",
        "scheme-changed",
        "nonce-changed",
        "wrong-token",
        "non-ascii",
        "no-nonce",
    ],
)
def test_forged_or_altered_callbacks_are_refused(
    reader: CallbackReader, request_: CallbackRequest
) -> None:
    """Any change to the URL, a field, the nonce, the token or the signature is refused,
    and the refusal quotes nothing of the request."""
    with pytest.raises(SignatureMismatch) as raised:
        reader.read(request_, T0)
    assert_no_secrets(str(raised.value), AUTH_TOKEN, UUID, SIGNATURE, NONCE)


def test_a_v2_signature_alone_is_refused(reader: CallbackReader) -> None:
    """X-Plivo-Signature-V2 signs no body, so a request that carries only it is refused."""
    signed = f"{URL.partition('?')[0]}{NONCE}".encode()
    v2 = base64.b64encode(hmac.new(AUTH_TOKEN.encode(), signed, hashlib.sha256).digest()).decode()
    headers = {"x-plivo-signature-v2": v2, "x-plivo-signature-v2-nonce": NONCE}
    with pytest.raises(SignatureMismatch):
        reader.read(CallbackRequest(URL, headers, urlencode(FIELDS).encode()), T0)


def test_one_good_signature_among_several_verifies(reader: CallbackReader) -> None:
    """Plivo may send several comma-separated signatures; one that matches is enough."""
    other = reference_signature(URL, FIELDS, NONCE, "the-old-token")
    (report,) = reader.read(_request(signature=f"{other}, {SIGNATURE}"), T0)
    assert report.message_id == UUID
    with pytest.raises(SignatureMismatch):
        reader.read(_request(signature=f"{other},{other}"), T0)


def test_a_replay_and_a_retry_under_a_fresh_nonce_have_one_identity(
    reader: CallbackReader,
) -> None:
    """Replaying a signed callback, or Plivo re-signing it under a new nonce, gives one
    dedupe identity; another status gives another."""
    (first,) = reader.read(_request(), T0)
    (replayed,) = reader.read(_request(), T0 + 3600)
    (retried,) = reader.read(_request(nonce="88812938123871231232"), T0 + 60)
    (other,) = reader.read(_request(_altered("Status", "sent")), T0)
    assert first.dedupe == replayed.dedupe == retried.dedupe
    assert other.dedupe != first.dedupe
    assert AUTH_TOKEN not in first.dedupe
    assert UUID not in first.dedupe


def _resplit_status() -> list[tuple[str, str]]:
    """FIELDS with To's name and value moved into Status's value: the same signed string."""
    to = dict(FIELDS)["To"]
    moved = [(n, f"deliveredTo{to}" if n == "Status" else v) for n, v in FIELDS]
    return [(n, v) for n, v in moved if n != "To"]


def test_a_re_split_body_verifies_but_stores_no_number(reader: CallbackReader) -> None:
    """A body re-split so the number sits in Status verifies under the same signature and
    identity, and is recorded as an unknown status of that length, never the number."""
    resplit = _resplit_status()
    assert signed_base(URL, resplit) == signed_base(URL, FIELDS)
    (original,) = reader.read(_request(), T0)
    (report,) = reader.read(_request(resplit, signature=SIGNATURE), T0)
    assert report.dedupe == original.dedupe
    assert (report.raw_status, report.status) == (f"unknown:{len(resplit[1][1])}", Status.UNKNOWN)
    assert_no_secrets(repr(report))


def test_a_re_split_message_uuid_is_malformed_and_unquoted(reader: CallbackReader) -> None:
    """A body re-split so MessageUUID holds more than a uuid is refused without quoting it."""
    merged = f"{UUID}ParentMessageUUID{UUID}"
    moved = [(n, merged if n == "MessageUUID" else v) for n, v in FIELDS]
    resplit = [(n, v) for n, v in moved if n != "ParentMessageUUID"]
    assert signed_base(URL, resplit) == signed_base(URL, FIELDS)
    with pytest.raises(MalformedCallback) as raised:
        reader.read(_request(resplit, signature=SIGNATURE), T0)
    assert_no_secrets(str(raised.value), UUID)


@pytest.mark.parametrize(
    "fields",
    [
        [(n, v) for n, v in FIELDS if n != "MessageUUID"],
        [(n, v) for n, v in FIELDS if n != "Status"],
        [*FIELDS, ("Status", "failed")],
        _altered("MessageUUID", SECRET_PHONE),
        _altered("Status", ""),
    ],
    ids=["no-uuid", "no-status", "status-twice", "uuid-is-a-number", "empty-status"],
)
def test_a_signed_callback_that_is_no_status_report_is_malformed(
    reader: CallbackReader, fields: list[tuple[str, str]]
) -> None:
    """A verified body without one MessageUUID (a uuid) and one Status is MalformedCallback,
    its message quoting nothing of the request."""
    with pytest.raises(MalformedCallback) as raised:
        reader.read(_request(fields), T0)
    assert_no_secrets(str(raised.value), AUTH_TOKEN)


def test_a_body_that_is_not_utf8_is_malformed(reader: CallbackReader) -> None:
    """A body that is not UTF-8 form data is refused as malformed."""
    with pytest.raises(MalformedCallback):
        reader.read(_request(body=b"Status=\xff\xfe"), T0)


@st.composite
def one_character_changed(draw: st.DrawFn) -> str:
    """The valid signature with one character replaced, deleted or inserted."""
    edit = draw(st.sampled_from(["replace", "delete", "insert"]))
    char = draw(st.characters(codec="utf-8", exclude_characters=","))
    index = draw(st.integers(0, len(SIGNATURE) - (0 if edit == "insert" else 1)))
    if edit == "insert":
        return SIGNATURE[:index] + char + SIGNATURE[index:]
    tail = SIGNATURE[index + 1 :]
    return SIGNATURE[:index] + ("" if edit == "delete" else char) + tail


@given(altered=one_character_changed())
def test_any_single_character_change_to_the_signature_is_refused(altered: str) -> None:
    """Replacing, deleting or inserting any one character makes the signature fail."""
    assume(altered.strip() != SIGNATURE)
    assert not verify_signature(URL, FIELDS, NONCE, altered, AUTH_TOKEN)


_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=16)


@given(
    fields=st.lists(st.tuples(_text.filter(bool), _text), max_size=8),
    order=st.randoms(use_true_random=False),
    url=st.sampled_from([URL, CALLBACK_URL, "https://x.example:8443/cb?b=2&a=1"]),
)
def test_any_fields_in_any_order_sign_as_plivo_documents(
    fields: list[tuple[str, str]], order: random.Random, url: str
) -> None:
    """Any fields (non-ASCII and repeated names too) in any order: code and oracle agree."""
    shuffled = list(fields)
    order.shuffle(shuffled)
    expected = reference_signature(url, fields, NONCE, AUTH_TOKEN)
    assert compute_signature(url, shuffled, NONCE, AUTH_TOKEN) == expected
    assert verify_signature(url, shuffled, NONCE, expected, AUTH_TOKEN)


def test_the_readers_repr_and_errors_hold_no_token() -> None:
    """Neither the reader's repr nor a transport's shows the auth token."""
    transport = PlivoTransport("MAODU4NZNHYJM2MTU2MZ", AUTH_TOKEN, sender=SENDER, clock=FakeClock())
    try:
        assert_no_secrets(f"{_reader()!r} {transport!r}", AUTH_TOKEN)
    finally:
        transport.close()
