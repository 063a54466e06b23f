"""Postmark's webhooks (Bounce, Delivery, SpamComplaint) for one instance: verified by
the basic credentials Postmark puts in the webhook URL, read into reports with the same
vocabulary a status poll records (:mod:`resetctl.transports.postmark`'s)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.transports.base import (
    UNKNOWN_EVIDENCE,
    CallbackReader,
    CallbackReport,
    CallbackRequest,
    TransportContext,
)
from resetctl.transports.options import absolute_http_url, require_https_or_loopback
from resetctl.transports.postmark_words import (
    _BOUNCE_TYPE_OF_CODE,
    BOUNCE_TYPE_CODES,
    VOCABULARY,
    normalize,
)

#: The secrets a webhook's basic credentials are checked against (user name, password).
WEBHOOK_CREDENTIAL_VARIABLES = ("POSTMARK_WEBHOOK_USERNAME", "POSTMARK_WEBHOOK_PASSWORD")
#: The shortest webhook password accepted: basic credentials are all that stands
#: between the public URL and a forged bounce that would send the fallback.
MIN_WEBHOOK_PASSWORD = 16
#: The dedupe identity of a webhook report: this prefix and a keyed digest of the
#: record's own identity.
WEBHOOK_IDENTITY_PREFIX = "postmark:hook:"
#: What the credentials may be written with: RFC 3986's unreserved characters, which a
#: URL carries as they are, so the pair Postmark sends is the pair configured.
_URL_SAFE = re.compile(r"[A-Za-z0-9._~-]+")
#: A Postmark MessageID (a UUID): anything else is not stored as a message id.
_MESSAGE_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
#: The longest attempt key a send's Metadata can carry (Postmark's value limit).
_METADATA_VALUE_LIMIT = 80
# Record types that report on a message's delivery. Open and Click (tracking is off, and
# an open is no delivery receipt we rely on) and SubscriptionChange (about the address,
# not this message) say nothing the machine reads; unknown record types neither.
_BOUNCE_RECORDS = frozenset({"Bounce", "SpamComplaint"})
_DELIVERY_RECORD = "Delivery"


class PostmarkWebhooks:
    """Postmark's Bounce, Delivery and SpamComplaint webhooks for one instance.

    Postmark authenticates a webhook only by the basic credentials in its URL, so the
    Authorization header is checked in constant time before the body is read. The
    scheme has no timestamp to refuse a stale one by: Postmark retries a webhook for
    hours, and a replay is recognised by its dedupe identity instead.
    """

    media_types = frozenset({"application/json"})

    def __init__(
        self, public_url: str | None, username: str, password: str, missing: str | None = None
    ) -> None:
        #: where Postmark posts (its path is where serve mounts it)
        self.public_url = public_url
        self._credentials = f"{username}:{password}".encode("ascii")
        self._identity_key = password.encode("ascii")
        self._missing = missing

    def check(self) -> None:
        """ConfigError when the webhook credentials are not set."""
        if self._missing is not None:
            raise ConfigError(self._missing)

    def __repr__(self) -> str:
        # The credentials stay out of it; the URL holds none (the config refuses that).
        return f"PostmarkWebhooks(public_url={self.public_url!r})"

    def read(self, request: CallbackRequest, now: float) -> Sequence[CallbackReport]:
        """The report a verified Bounce, Delivery or SpamComplaint webhook carries; none
        for other record types. SignatureMismatch when the credentials do not match,
        MalformedCallback when the body is not a Postmark record."""
        self.check()
        if not self._authorized(request.headers.get("authorization", "")):
            raise SignatureMismatch(["postmark webhook: the basic credentials do not match"])
        record = _webhook_record(request.body)
        kind = record["RecordType"]
        if kind in _BOUNCE_RECORDS:
            return [self._bounce_report(kind, record)]
        if kind == _DELIVERY_RECORD:
            return [self._delivery_report(record)]
        return []

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.strip().partition(" ")
        given = b""
        if scheme.lower() == "basic":
            try:
                given = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                given = b""
        # Constant time over the whole pair: how much of a guess was right never shows.
        return hmac.compare_digest(given, self._credentials)

    def _bounce_report(self, kind: str, record: Mapping[str, Any]) -> CallbackReport:
        message_id = _record_message_id(record)
        bounce_id = record.get("ID")
        if not isinstance(bounce_id, int) or isinstance(bounce_id, bool):
            raise MalformedCallback([f"postmark webhook: a {kind} record without a numeric ID"])
        raw, status = _bounce_reading(kind, record)
        return CallbackReport(
            message_id,
            _attempt_key(record),
            raw,
            status,
            self._identity([kind, str(bounce_id), message_id]),
        )

    def _delivery_report(self, record: Mapping[str, Any]) -> CallbackReport:
        message_id = _record_message_id(record)
        recipient = record.get("Recipient")
        # Postmark confirms delivery per message and recipient: that pair is the record.
        who = recipient if isinstance(recipient, str) else ""
        raw, status = VOCABULARY.reading("Delivered")
        identity = self._identity([_DELIVERY_RECORD, message_id, who])
        return CallbackReport(message_id, _attempt_key(record), raw, status, identity)

    def _identity(self, parts: list[str]) -> str:
        """A keyed digest of a record's identity: the parts may hold the address, and
        the key (the webhook password) is kept outside the database."""
        payload = json.dumps(parts, ensure_ascii=True, separators=(",", ":")).encode()
        digest = hmac.new(self._identity_key, payload, hashlib.sha256).hexdigest()
        return f"{WEBHOOK_IDENTITY_PREFIX}{digest}"


def _webhook_record(body: bytes) -> dict[str, Any]:
    """The JSON object a webhook posted, with a RecordType; MalformedCallback otherwise
    (never quoting the body)."""
    try:
        record = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedCallback(["postmark webhook: the body is not JSON"]) from None
    if not isinstance(record, dict):
        raise MalformedCallback(["postmark webhook: the body is not a JSON object"])
    kind = record.get("RecordType")
    if not isinstance(kind, str) or not kind:
        raise MalformedCallback(["postmark webhook: the record has no RecordType"])
    return record


def _record_message_id(record: Mapping[str, Any]) -> str:
    message_id = record.get("MessageID")
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        raise MalformedCallback(["postmark webhook: MessageID is not a Postmark message id"])
    return message_id


def _bounce_reading(kind: str, record: Mapping[str, Any]) -> tuple[str, Status]:
    """(evidence, status) of a Bounce or SpamComplaint record: its Type (or, without
    one, the name of its TypeCode) when it is one of Postmark's bounce types, else
    ``unknown:<length>``."""
    if kind == "SpamComplaint":
        return VOCABULARY.reading("SpamComplaint")
    word = record.get("Type")
    if not isinstance(word, str):
        code = record.get("TypeCode")
        word = _BOUNCE_TYPE_OF_CODE.get(code) if isinstance(code, int) else None
        if word is None:
            raise MalformedCallback(["postmark webhook: a Bounce record without a bounce Type"])
    spelled = VOCABULARY.documented(word)
    if spelled is None or spelled not in BOUNCE_TYPE_CODES:
        # A message status such as "Delivered" in a bounce's Type is no bounce type.
        return f"{UNKNOWN_EVIDENCE}{len(word)}", Status.UNKNOWN
    return spelled, normalize(spelled)


def _attempt_key(record: Mapping[str, Any]) -> str | None:
    """The attempt key the send's Metadata carried, when the record echoes it."""
    metadata = record.get("Metadata")
    key = metadata.get("attempt_key") if isinstance(metadata, dict) else None
    if isinstance(key, str) and 0 < len(key) <= _METADATA_VALUE_LIMIT and key.isprintable():
        return key
    return None


def _webhook_url(context: TransportContext) -> str | None:
    """``webhook_url`` when set: absolute, https (http only to a loopback host), and
    without credentials (those are secrets, never config)."""
    if "webhook_url" not in context.options:
        return None
    where = f"{context.table}.webhook_url"
    value: str = context.option("webhook_url", "", str)
    url = absolute_http_url(value)
    if url is None:
        raise ConfigError(f"{where}: expected an absolute https:// URL")
    # Postmark would post each bounce, the address and the credentials in clear.
    require_https_or_loopback(context, "webhook_url", url)
    if url.userinfo:
        raise ConfigError(
            f"{where}: must not hold credentials; give Postmark the URL with"
            f" user:password@ in it and set {' and '.join(WEBHOOK_CREDENTIAL_VARIABLES)}"
        )
    return value


def webhooks(context: TransportContext, options: set[str]) -> CallbackReader:
    """The reader of an instance's webhooks; ConfigError for a bad ``webhook_url`` or
    weak credentials (never naming their values). Missing ones fail its ``check`` (and
    every read), so ``observe`` of another instance never needs them."""
    context.reject_unknown(options)
    public_url = _webhook_url(context)
    found = [context.secret(name) for name in WEBHOOK_CREDENTIAL_VARIABLES]
    for name, value in zip(WEBHOOK_CREDENTIAL_VARIABLES, found, strict=True):
        if not value:
            problem = (
                f"{context.table}: {name} is not set (set the environment variable, or name"
                f" a credentials_file in [{context.table}])"
            )
            return PostmarkWebhooks(public_url, "", "", problem)
    username, password = (value or "" for value in found)
    for name, value in zip(WEBHOOK_CREDENTIAL_VARIABLES, (username, password), strict=True):
        if not _URL_SAFE.fullmatch(value):
            raise ConfigError(
                f"{context.table}: {name} must be letters, digits and . _ ~ - only (it is"
                " written into the webhook URL)"
            )
    if len(password) < MIN_WEBHOOK_PASSWORD:
        raise ConfigError(
            f"{context.table}: {WEBHOOK_CREDENTIAL_VARIABLES[1]} is shorter than"
            f" {MIN_WEBHOOK_PASSWORD} characters"
        )
    return PostmarkWebhooks(public_url, username, password)
