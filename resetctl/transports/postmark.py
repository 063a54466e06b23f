"""Email through Postmark's HTTP API, with delivery read back from its Messages API.

``submit`` is ``POST /email``; ``status`` is ``GET /messages/outbound/{id}/details``,
whose ``MessageEvents`` (Delivered, Transient, Bounced, …) say more than the message's
own ``Status``. Postmark has no idempotency key, so a submission that may have reached
it (any 5xx, a time-out or a dropped connection once the request was written, a 200
without a MessageID) is ambiguous and never resent blindly: ``lookup`` searches the
outbound messages for the ``attempt_key`` metadata every send carries, then reads the
found message's details as ``status`` does (the search lists only its ``Status``, which
stays "Sent" through a bounce). Only what provably created nothing is transient: a
refused connection, a DNS or TLS failure before the request was written, a 429 (or
ErrorCode 429).

A send comes from the notice's policy's sender when it names one (``From`` with its
display name, ``ReplyTo``), else from ``[postmark] from`` (and the sender signature's
own Reply-To); either must be a confirmed Postmark sender signature or domain.

A reset notice is transactional: it goes on a transactional message stream
(``message_stream``, default "outbound", every server's own), never the broadcast one,
and the send sets no ``Headers``, so it carries no List-Unsubscribe or Precedence.

Postmark's Bounce, Delivery and SpamComplaint webhooks are read by
:class:`PostmarkWebhooks` (the plugin's ``callbacks``). Postmark signs nothing: it
authenticates a webhook with the HTTP basic credentials written into the webhook URL,
checked here in constant time against POSTMARK_WEBHOOK_USERNAME and
POSTMARK_WEBHOOK_PASSWORD. A bounce names its message and, in its Metadata, the attempt
key every send carries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from resetctl.config import loopback_host
from resetctl.durations import parse_duration
from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.transports.base import (
    UNKNOWN_EVIDENCE,
    AmbiguousError,
    CallbackReader,
    CallbackReport,
    CallbackRequest,
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    ThrottledError,
    TransientError,
    Transport,
    TransportContext,
    TransportError,
    TransportPlugin,
    mailbox,
)
from resetctl.transports.http import (
    bounded_waits,
    http_call_timeout,
    redact_queries,
    retry_after,
)

DEFAULT_BASE_URL = "https://api.postmarkapp.com"
CREDENTIAL_VARIABLE = "POSTMARK_SERVER_TOKEN"

#: Default seconds between the two not-found lookups that let an attempt be resent.
DEFAULT_LOOKUP_SETTLE = 30.0
#: The longest lookup_settle accepted: a longer one outlives any reset link.
MAX_LOOKUP_SETTLE = 3600.0
#: Messages one lookup reads; the attempt_key filter leaves one, or none.
LOOKUP_COUNT = 50
#: The id of every Postmark server's default broadcast stream. A reset notice is
#: transactional: it goes on a transactional stream ("outbound", the default, or one of
#: the operator's), never where Postmark adds List-Unsubscribe and bulk handling.
BROADCAST_STREAM = "broadcast"
#: The outbound message search: its query string holds the recipient's address.
_SEARCH_PATH = "/messages/outbound"

# Postmark's word -> normalized status. Keys are Postmark's spelling; lookups ignore case.
#   Queued         pending    Postmark holds it and has not sent it yet
#   Sent           accepted   Postmark passed it on; no word from the recipient's server yet
#   Processed      accepted   as Sent
#   Transient      pending    the recipient's server deferred it; Postmark keeps retrying
#   Delivered      delivered  the recipient's server took it
#   Opened         delivered  an open implies delivery (tracking is off, so rarely seen)
#   LinkClicked    delivered  as Opened
#   Bounced        failed     a bounce event: it will not arrive
#   SpamComplaint  failed     the recipient refused it
# A Bounce webhook's Type, from Postmark's bounce type list (Transient and SpamComplaint
# are also event types above, with the same meaning):
#   failed: Postmark says this message will not reach the person's mailbox
#     HardBounce, BadEmailAddress  the address does not exist or is not valid
#     SoftBounce     Postmark has ceased attempting this message ("a temporary problem"
#                    is the address's, not a retry: its support article on soft bounces)
#     Blocked, DMARCPolicy  the receiving ISP refused it (content, blocklist, DMARC)
#     SpamNotification  "blocked by the user, or classified as spam": not where they read
#     VirusNotification  quarantined as infected
#     ChallengeVerification  held until the sender answers a challenge; nobody will
#     ManuallyDeactivated, Unconfirmed  Postmark will not deliver to the address
#     SMTPApiError, TemplateRenderingFailed  Postmark never sent it
#   pending: delivery is delayed and may still happen (the poll budget decides)
#     Transient ("message delayed"), DnsError ("a temporary DNS error")
#   unknown: a documented word that says nothing about whether this message arrives
#     AutoResponder (Postmark files nondescript NDRs there too), Unsubscribe,
#     Subscribe, AddressChange (replies), OpenRelayTest, InboundError (inbound only),
#     Unknown ("unable to classify the NDR")
#   anything else  unknown
_NORMALIZED = {
    "Queued": Status.PENDING,
    "Sent": Status.ACCEPTED,
    "Processed": Status.ACCEPTED,
    "Transient": Status.PENDING,
    "Delivered": Status.DELIVERED,
    "Opened": Status.DELIVERED,
    "LinkClicked": Status.DELIVERED,
    "Bounced": Status.FAILED,
    "SpamComplaint": Status.FAILED,
    "HardBounce": Status.FAILED,
    "BadEmailAddress": Status.FAILED,
    "SoftBounce": Status.FAILED,
    "Blocked": Status.FAILED,
    "DMARCPolicy": Status.FAILED,
    "SpamNotification": Status.FAILED,
    "VirusNotification": Status.FAILED,
    "ChallengeVerification": Status.FAILED,
    "ManuallyDeactivated": Status.FAILED,
    "Unconfirmed": Status.FAILED,
    "SMTPApiError": Status.FAILED,
    "TemplateRenderingFailed": Status.FAILED,
    "DnsError": Status.PENDING,
    "AutoResponder": Status.UNKNOWN,
    "Unsubscribe": Status.UNKNOWN,
    "Subscribe": Status.UNKNOWN,
    "AddressChange": Status.UNKNOWN,
    "OpenRelayTest": Status.UNKNOWN,
    "InboundError": Status.UNKNOWN,
    "Unknown": Status.UNKNOWN,
}
_FOLDED = {raw.casefold(): status for raw, status in _NORMALIZED.items()}
POSTMARK_STATUSES = frozenset(_NORMALIZED)
#: Postmark's bounce types and their TypeCodes, as its Bounce API documents them: the
#: words a Bounce webhook's Type may hold (a Type outside them is unknown evidence).
BOUNCE_TYPE_CODES: Mapping[str, int] = {
    "HardBounce": 1,
    "Transient": 2,
    "Unsubscribe": 16,
    "Subscribe": 32,
    "AutoResponder": 64,
    "AddressChange": 128,
    "DnsError": 256,
    "SpamNotification": 512,
    "OpenRelayTest": 1024,
    "Unknown": 2048,
    "SoftBounce": 4096,
    "VirusNotification": 8192,
    "ChallengeVerification": 16384,
    "BadEmailAddress": 100000,
    "SpamComplaint": 100001,
    "ManuallyDeactivated": 100002,
    "Unconfirmed": 100003,
    "Blocked": 100006,
    "SMTPApiError": 100007,
    "InboundError": 100008,
    "DMARCPolicy": 100009,
    "TemplateRenderingFailed": 100010,
}
_BOUNCE_TYPE_OF_CODE = {code: name for name, code in BOUNCE_TYPE_CODES.items()}

# MessageEvents that say how delivery went. Others (SubscriptionChanged) are about the
# address, not this message, and leave the message's Status in charge.
_DECISIVE_EVENTS = frozenset(
    raw.casefold()
    for raw in ("Transient", "Delivered", "Opened", "LinkClicked", "Bounced", "SpamComplaint")
)

# The send response carries no status. Postmark's own model calls a message it has taken
# but not yet sent "Queued"; recording that keeps the notice open until a status read can
# see a bounce, which a terminal "accepted" here would hide.
_SUBMITTED = "Queued"

# Postmark's documented API error codes, described generically: the response's Message
# often quotes the recipient's address, so it is never passed on.
_ERROR_CODES = {
    10: "bad or missing server token",
    100: "Postmark maintenance",
    300: "invalid email request",
    400: "sender signature not found",
    401: "sender signature not confirmed",
    402: "invalid JSON",
    403: "incompatible JSON",
    405: "not allowed to send",
    406: "inactive recipient",
    409: "JSON required",
    411: "forbidden attachment type",
    412: "account is pending",
    413: "account may not send",
    429: "rate limit exceeded",
}
# Error codes that pass with time. A 5xx to a send is ambiguous whatever its code, even
# maintenance (100): we recover by lookup, so reading it conservatively costs a lookup.
_TRANSIENT_CODES = frozenset({100, 429})

# Failures raised before the request left this host: nothing can have been accepted.
_NOT_SENT: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)


redact_queries(lambda path: path == _SEARCH_PATH)  # its query holds the address


def normalize(raw: str) -> Status:
    """Map a Postmark message status or event type to the normalized vocabulary."""
    return _FOLDED.get(raw.strip().casefold(), Status.UNKNOWN)


_SPELLED = {raw.casefold(): raw for raw in _NORMALIZED}


def documented_spelling(raw: str) -> str | None:
    """Postmark's own spelling of a status or event type ``normalize`` reads written
    another way (case, surrounding space); None for any other word."""
    return _SPELLED.get(raw.strip().casefold())


#: Postmark's words and their mapping; what is recorded of a status is its evidence.
VOCABULARY = StatusVocabulary("postmark", POSTMARK_STATUSES, normalize, documented_spelling)


class PostmarkRefused(PermanentError):
    """Postmark refused the request for good; carries its HTTP status and ErrorCode."""

    def __init__(self, http_status: int, error_code: int | None) -> None:
        self.http_status = http_status
        self.error_code = error_code
        super().__init__(f"postmark refused it ({_describe(http_status, error_code)})")


def _describe(http_status: int, error_code: int | None) -> str:
    if error_code is None:
        return f"HTTP {http_status}"
    meaning = _ERROR_CODES.get(error_code, "see Postmark's API error codes")
    return f"HTTP {http_status}, ErrorCode {error_code}: {meaning}"


def _error_for(
    http_status: int,
    body: Mapping[str, Any] | None,
    *,
    sending: bool,
    headers: Mapping[str, str] | None = None,
) -> TransportError:
    """The error an answer other than success stands for (to a send, or to a read)."""
    code = _error_code(body)
    if http_status == 429 or code == 429:
        # The rate limiter turned the request away unread: the lane backs off as asked.
        wait = None if headers is None else retry_after(headers, time.time())
        return ThrottledError(f"postmark is busy ({_describe(http_status, code)})", wait)
    if sending and http_status >= 500:
        # Postmark, or a gateway in front of it, may have taken the message before the
        # failure: a lookup settles it, where a resend could mail the person twice.
        return AmbiguousError(
            f"postmark failed after reading the send ({_describe(http_status, code)})"
        )
    if http_status >= 500 or code in _TRANSIENT_CODES:
        return TransientError(f"postmark is busy or down ({_describe(http_status, code)})")
    if 400 <= http_status < 500 or http_status == 200:
        return PostmarkRefused(http_status, code)
    # A redirect or an informational status: the request was read, its fate unknown.
    return AmbiguousError(f"unexpected answer from postmark (HTTP {http_status})")


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _error_code(body: Mapping[str, Any] | None) -> int | None:
    code = None if body is None else body.get("ErrorCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _event_time(event: Mapping[str, Any]) -> datetime:
    """When Postmark received the event; unreadable times sort first."""
    value = event.get("ReceivedAt")
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        return datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _raw_status_of(details: Mapping[str, Any]) -> str | None:
    """The raw status a details body implies, as evidence: its latest decisive event,
    else its Status."""
    events = details.get("MessageEvents")
    decisive = [
        (_event_time(event), index, event["Type"])
        for index, event in enumerate(events if isinstance(events, list) else [])
        if isinstance(event, dict)
        and isinstance(event.get("Type"), str)
        and event["Type"].casefold() in _DECISIVE_EVENTS
    ]
    if decisive:
        # Postmark does not promise chronological order (its own example lists a
        # Delivered before the Transient that preceded it), so order by ReceivedAt.
        return VOCABULARY.evidence(str(max(decisive)[2]))
    status = details.get("Status")
    return VOCABULARY.evidence(status) if isinstance(status, str) and status else None


class PostmarkTransport:
    """Postmark's Email API for submissions, its Messages API for status reads."""

    name = "postmark"
    #: POST /email takes no idempotency key: a second submit sends a second email
    recovers_by_key = False
    #: the longest one call can take (set from the time-outs)
    call_timeout: float
    #: seconds between the two not-found lookups that let an attempt be resent
    lookup_settle: float

    def __init__(
        self,
        *,
        token: str,
        sender: str,
        base_url: str = DEFAULT_BASE_URL,
        message_stream: str = "outbound",
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        lookup_settle: float = DEFAULT_LOOKUP_SETTLE,
    ) -> None:
        self._sender = sender
        self._message_stream = message_stream
        self.lookup_settle = lookup_settle
        self.call_timeout = http_call_timeout(base_url, connect_timeout, read_timeout)
        #: the bounded waits of one request (handshakes, write, read)
        self._waits = bounded_waits(base_url)
        # A sweep works inside a cron minute: every wait is bounded.
        self._timeout = httpx.Timeout(read_timeout, connect=connect_timeout, pool=connect_timeout)
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={
                "X-Postmark-Server-Token": token,
                "Accept": "application/json",
                "User-Agent": "resetctl",
            },
            timeout=self._timeout,
        )

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Send the email once; raises TransientError, AmbiguousError or PermanentError."""
        if message.email is None:
            raise PermanentError(f"{message.channel} message has no rendered email")
        payload: dict[str, Any] = {
            "From": self._from(message),
            "To": message.recipient,
            "Subject": message.email.subject,
            "TextBody": message.email.text,
            "HtmlBody": message.email.html,
            "MessageStream": self._message_stream,
            # Lets an operator find the message by attempt in Postmark's activity UI.
            "Metadata": {"attempt_key": attempt_key},
            # An open pixel says nothing we act on, and click tracking would rewrite the
            # reset link through Postmark's redirector.
            "TrackOpens": False,
            "TrackLinks": "None",
        }
        if message.sender.email_reply_to is not None:
            payload["ReplyTo"] = message.sender.email_reply_to
        try:
            response = self._client.post("/email", json=payload)
        except _NOT_SENT as exc:
            raise TransientError(f"postmark unreachable ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            # The request may have been read and acted on before the failure.
            raise AmbiguousError(
                f"no answer from postmark after sending ({type(exc).__name__})"
            ) from None
        body = _json_object(response)
        if response.status_code == 200:
            message_id = None if body is None else body.get("MessageID")
            code = _error_code(body)
            if code == 0 and isinstance(message_id, str) and message_id:
                return ProviderStatus(message_id, _SUBMITTED, normalize(_SUBMITTED))
            if code is None or code == 0:
                raise AmbiguousError("postmark answered 200 without a usable MessageID")
        raise _error_for(response.status_code, body, sending=True, headers=response.headers)

    def status(self, message_id: str) -> ProviderStatus:
        """Read the message's details; raises TransientError or PermanentError."""
        return self._details(message_id, self._timeout)

    def _details(self, message_id: str, timeout: httpx.Timeout) -> ProviderStatus:
        path = f"/messages/outbound/{quote(message_id, safe='')}/details"
        try:
            response = self._client.get(path, timeout=timeout)
        except httpx.HTTPError as exc:
            # A read changes nothing at Postmark, so any failure is safe to repeat.
            raise TransientError(f"postmark status read failed ({type(exc).__name__})") from None
        body = _json_object(response)
        if response.status_code != 200:
            error = _error_for(response.status_code, body, sending=False, headers=response.headers)
            # A read changes nothing, so what would leave a send ambiguous is only a failed
            # read here.
            raise TransientError(str(error)) if isinstance(error, AmbiguousError) else error
        raw = None if body is None else _raw_status_of(body)
        if raw is None:
            raise TransientError("postmark's message details carry no status")
        return ProviderStatus(message_id, raw, normalize(raw))

    def _from(self, message: Message) -> str:
        """The From of a send: the policy's mailbox when it names one, else ours."""
        sender = message.sender
        if sender.email_from is None:
            return self._sender
        return mailbox(sender.email_from, sender.email_from_name)

    def fingerprint(self, message: Message) -> Mapping[str, str]:
        """The stream and sender this send names (the attempt key is its metadata)."""
        sent = {"stream": self._message_stream, "from": self._from(message)}
        if message.sender.email_reply_to is not None:
            sent["reply_to"] = message.sender.email_reply_to
        return sent

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        """The message sent under ``attempt_key``, or None when Postmark has none.

        Searches the outbound messages to the recipient on the stream the send named
        (recorded in ``sent``, whatever the stream is configured as today) by the
        ``attempt_key`` metadata every send carries, and checks the metadata of what it
        finds rather than trusting the filter. The key names one attempt, so neither
        ``since`` nor the sender is a search term (a sender configured since, or a From
        Postmark lists in another spelling, can never hide it). A found message's status
        comes from its details, read in what the search left of ``call_timeout``; when
        that read fails, the search's own Status stands (a found message is still
        found). Raises TransientError when the search fails or cannot prove the message
        absent.
        """
        started = time.monotonic()
        params = {
            "recipient": recipient,
            "count": str(LOOKUP_COUNT),
            "offset": "0",
            # Without it Postmark searches only the default transactional stream.
            "messagestream": sent.get("stream") or self._message_stream,
            "metadata_attempt_key": attempt_key,
        }
        try:
            response = self._client.get(_SEARCH_PATH, params=params)
        except httpx.HTTPError as exc:
            # A search changes nothing: whatever failed, trying again is safe.
            raise TransientError(f"postmark lookup failed ({type(exc).__name__})") from None
        body = _json_object(response)
        if response.status_code != 200:
            code = _error_code(body)
            raise TransientError(
                f"postmark lookup failed ({_describe(response.status_code, code)})"
            )
        messages = None if body is None else body.get("Messages")
        total = None if body is None else body.get("TotalCount")
        if not isinstance(messages, list):
            raise TransientError("postmark's search reply carries no message list")
        for item in messages:
            metadata = item.get("Metadata") if isinstance(item, dict) else None
            if not isinstance(metadata, dict) or metadata.get("attempt_key") != attempt_key:
                continue
            message_id, raw = item.get("MessageID"), item.get("Status")
            if isinstance(message_id, str) and message_id and isinstance(raw, str) and raw:
                found = ProviderStatus(message_id, raw, normalize(raw))
                return self._with_details(found, self.call_timeout - (time.monotonic() - started))
        if isinstance(total, int) and total > len(messages):
            # The search matched more than this page holds, and ours was not on it.
            raise TransientError("postmark's search matched more messages than one page holds")
        return None

    def _with_details(self, found: ProviderStatus, left: float) -> ProviderStatus:
        """``found`` as its details tell it (a bounce shows only among the events), read
        within ``left`` seconds so the lookup stays within call_timeout; ``found`` itself
        (its status as evidence) when no time is left or the read fails."""
        listed = VOCABULARY.reply(found.message_id, found.raw_status)
        if left <= 0:
            return listed
        # Each wait of the request gets an equal share, as call_timeout adds them up.
        share = left / self._waits
        try:
            return self._details(found.message_id, httpx.Timeout(share))
        except TransportError:
            return listed

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()


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

    def __init__(self, public_url: str | None, username: str, password: str) -> None:
        #: where Postmark posts (its path is where serve mounts it)
        self.public_url = public_url
        self._credentials = f"{username}:{password}".encode("ascii")
        self._identity_key = password.encode("ascii")

    def __repr__(self) -> str:
        # The credentials stay out of it; the URL holds none (the config refuses that).
        return f"PostmarkWebhooks(public_url={self.public_url!r})"

    def read(self, request: CallbackRequest, now: float) -> Sequence[CallbackReport]:
        """The report a verified Bounce, Delivery or SpamComplaint webhook carries; none
        for other record types. SignatureMismatch when the credentials do not match,
        MalformedCallback when the body is not a Postmark record."""
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
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{where}: expected an absolute https:// URL")
    if url.scheme != "https" and not loopback_host(url.host):
        # Postmark would post each bounce, the address and the credentials in clear.
        raise ConfigError(f"{where}: must be https://; http:// only for a loopback host")
    if url.userinfo:
        raise ConfigError(
            f"{where}: must not hold credentials; give Postmark the URL with"
            f" user:password@ in it and set {' and '.join(WEBHOOK_CREDENTIAL_VARIABLES)}"
        )
    return value


def _callbacks(context: TransportContext) -> CallbackReader:
    """The reader of an instance's webhooks; ConfigError for a bad ``webhook_url`` or
    missing or weak credentials (never naming their values)."""
    context.reject_unknown(_OPTIONS)
    public_url = _webhook_url(context)
    username, password = (context.require_secret(name) for name in WEBHOOK_CREDENTIAL_VARIABLES)
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


def _positive_seconds(context: TransportContext, key: str, default: float) -> float:
    value = float(context.option(key, default, (int, float)))
    if not value > 0:
        raise ConfigError(f"{context.name}.{key}: expected a positive number of seconds")
    return value


def _lookup_settle(context: TransportContext) -> float:
    where = f"{context.name}.lookup_settle"
    value = parse_duration(context.options.get("lookup_settle", DEFAULT_LOOKUP_SETTLE), where)
    if value > MAX_LOOKUP_SETTLE:
        raise ConfigError(f"{where}: expected at most {MAX_LOOKUP_SETTLE:g} seconds")
    return value


_OPTIONS = {
    "base_url",
    "from",
    "message_stream",
    "connect_timeout",
    "read_timeout",
    "lookup_settle",
    "webhook_url",
}


def _create(context: TransportContext) -> Transport:
    context.reject_unknown(_OPTIONS)
    base_url = context.option("base_url", DEFAULT_BASE_URL, str)
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{context.name}.base_url: expected an http(s) URL")
    if "from" not in context.options:
        raise ConfigError(f"{context.name}.from: required (a confirmed Postmark sender signature)")
    sender = context.option("from", None, str)
    message_stream = context.option("message_stream", "outbound", str)
    for key, value in (("from", sender), ("message_stream", message_stream)):
        if not value.strip():
            raise ConfigError(f"{context.name}.{key}: must not be empty")
    if message_stream.strip().lower() == BROADCAST_STREAM:
        raise ConfigError(
            f"{context.name}.message_stream: {BROADCAST_STREAM!r} is Postmark's broadcast"
            " stream (bulk mail, with unsubscribe headers); a reset notice is transactional:"
            ' use "outbound" or a transactional stream of your own'
        )
    connect_timeout = _positive_seconds(context, "connect_timeout", 5.0)
    read_timeout = _positive_seconds(context, "read_timeout", 10.0)
    lookup_settle = _lookup_settle(context)
    token = context.require_secret(CREDENTIAL_VARIABLE)
    # A header value must be printable ASCII; say so here rather than on every send.
    if not (token.isascii() and token.isprintable()) or token != token.strip():
        raise ConfigError(f"{context.name}: {CREDENTIAL_VARIABLE} is not a valid API token")
    return PostmarkTransport(
        token=token,
        sender=sender,
        base_url=base_url,
        message_stream=message_stream,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        lookup_settle=lookup_settle,
    )


PLUGIN = TransportPlugin(
    name="postmark",
    channels=frozenset({"email"}),
    create=_create,
    vocabulary=VOCABULARY,
    callbacks=_callbacks,
)
