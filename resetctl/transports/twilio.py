"""Twilio SMS: create a Message resource, read its status, find it again, verify status
callbacks.

Twilio's create call has no idempotency key, so a submission that may have reached
Twilio (any 5xx, a time-out or a dropped connection once the request was written, a
2xx without a readable sid) is ambiguous and never resent blindly: ``lookup`` lists
the messages to the number and matches the body, which carries the reset link (as sent,
or after the prefix a trial account puts before it).
Only what provably created nothing is transient: a refused connection, a DNS or TLS
failure before the request was written, a 429. The status callback URL carries the
attempt key, so a callback can land on an attempt whose reply was lost.

A message comes from the notice's policy's ``[policy.<name>.sms] from`` when it names
one (a number is sent as ``From``, a Messaging Service SID as ``MessagingServiceSid``),
else from ``[twilio] from`` or ``messaging_service_sid``: one or the other, never both,
so a region's number is never checked against another region's service's sender pool.

Nothing this module raises or logs holds the phone number, the SMS body or the auth
token: Twilio's own error messages often quote the To number, so only its numeric code
is passed on, and httpx's request log line for a lookup loses its query string.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import parse_qsl, quote, unquote_plus, urlencode, urlsplit, urlunsplit

import httpx

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.transports.base import (
    AmbiguousError,
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
    TransportPlugin,
    body_digest,
)
from resetctl.transports.http import (
    ProviderCalls,
    http_call_timeout,
    int_field,
    json_client,
    json_object,
    redact_queries,
    retry_after,
)
from resetctl.transports.options import MAX_LOOKUP_SETTLE as MAX_LOOKUP_SETTLE
from resetctl.transports.options import (
    http_url,
    https_or_loopback_url,
    lookup_settle,
    optional_str,
    timeout_seconds,
)

LOGGER = logging.getLogger("resetctl.transports.twilio")
#: Its calls' failures, as this module raises and logs them.
_CALLS = ProviderCalls("twilio", LOGGER)

API_VERSION = "2010-04-01"
DEFAULT_BASE_URL = "https://api.twilio.com"

#: Twilio's documented ValidityPeriod range in seconds (its default is the maximum, 10 h).
VALIDITY_PERIOD_MIN = 1
VALIDITY_PERIOD_MAX = 36_000

#: Default seconds between the two not-found lookups that let an attempt be resent.
DEFAULT_LOOKUP_SETTLE = 30.0
#: Messages one lookup reads (one page of the list, newest first).
LOOKUP_PAGE_SIZE = 50
#: How far a message's date_created (Twilio's clock) may sit before ``since`` (ours).
CLOCK_SKEW = 60.0
#: The status-callback query parameter that names the attempt.
CALLBACK_ATTEMPT_PARAM = "attempt"
#: What Twilio puts before the body of every message a trial account sends.
TRIAL_PREFIX = "Sent from your Twilio trial account - "

_STATUS_MAP: Mapping[str, Status] = {
    # Still inside Twilio: not yet handed to a carrier.
    "accepted": Status.PENDING,
    "scheduled": Status.PENDING,
    "queued": Status.PENDING,
    "sending": Status.PENDING,
    # The carrier took it; a delivery receipt may never come.
    "sent": Status.ACCEPTED,
    "delivered": Status.DELIVERED,
    "read": Status.DELIVERED,
    "failed": Status.FAILED,
    "undelivered": Status.FAILED,
    "canceled": Status.FAILED,
}

#: Every Message status Twilio documents. The inbound ones (receiving, received) and
#: partially_delivered (multi-part channels) say nothing about a reset SMS: unknown.
TWILIO_STATUSES: frozenset[str] = frozenset(_STATUS_MAP) | {
    "receiving",
    "received",
    "partially_delivered",
}

#: Short descriptions of the refusals a reset SMS meets, in our words: Twilio's own
#: message may quote the recipient's number, so it is never passed on.
ERROR_DESCRIPTIONS: Mapping[int, str] = {
    20003: "authentication failed (check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN)",
    20404: "no such resource",
    21211: "invalid To number",
    21408: "sending to the recipient's region is not enabled",
    21602: "message body is required",
    21603: "a From number or messaging service is required",
    21606: "From is not a message-capable number of this account",
    21610: "the recipient has unsubscribed from this sender",
    21612: "the recipient cannot be reached from this sender",
    21614: "To is not a mobile number",
    21617: "the body exceeds 1600 characters",
    90007: "ValidityPeriod out of range",
}

_ACCOUNT_SID = re.compile(r"AC[0-9a-fA-F]{32}")
_SERVICE_SID = re.compile(r"MG[0-9a-fA-F]{32}")

#: The Messages list path: a lookup's query string holds the recipient's number.
_LIST_PATH = re.compile(r"/2010-04-01/Accounts/[^/]+/Messages\.json")


redact_queries(lambda path: _LIST_PATH.fullmatch(path) is not None)  # its query holds the number


def normalize(raw: str) -> Status:
    """Twilio's raw Message status as the machine's vocabulary; unknown words are unknown."""
    return _STATUS_MAP.get(raw, Status.UNKNOWN)


#: Twilio's statuses and their mapping; what is recorded of a status is its evidence.
VOCABULARY = StatusVocabulary("twilio", TWILIO_STATUSES, normalize)

#: A Message sid as Twilio's spec gives it (SMS, or MMS and other channels).
_MESSAGE_SID = re.compile(r"(SM|MM)[0-9a-fA-F]{32}")
#: The dedupe identity of a status callback: this prefix and a keyed digest of what the
#: signature covers.
CALLBACK_IDENTITY_PREFIX = "twilio:sig:"


class TwilioRefused(PermanentError):
    """Twilio refused the request for good; ``code`` is its numeric error code, if any."""

    def __init__(self, http_status: int, code: int | None) -> None:
        self.http_status = http_status
        self.code = code
        if code is None:
            detail = f"HTTP {http_status}"
        else:
            what = ERROR_DESCRIPTIONS.get(code, f"see https://www.twilio.com/docs/errors/{code}")
            detail = f"HTTP {http_status}, error {code}: {what}"
        super().__init__(f"twilio refused the request ({detail})")


class TwilioTransport:
    """Twilio's Programmable Messaging API over one pooled HTTPS client."""

    name = "twilio"
    #: Twilio dedupes nothing: a second create is a second SMS.
    recovers_by_key = False
    #: the longest one call can take (set from the time-outs)
    call_timeout: float
    #: seconds between the two not-found lookups that let an attempt be resent
    lookup_settle: float

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        *,
        sender: str | None = None,
        messaging_service_sid: str | None = None,
        status_callback: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        lookup_settle: float = DEFAULT_LOOKUP_SETTLE,
        clock: Callable[[], float],
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if (sender is None) == (messaging_service_sid is None):
            raise ConfigError("twilio.from: set exactly one of from or messaging_service_sid")
        self._sender = sender
        self._service = messaging_service_sid
        self._status_callback = status_callback
        self._clock = clock
        self._base_url = base_url.rstrip("/")
        self.lookup_settle = lookup_settle
        self.call_timeout = http_call_timeout(self._base_url, connect_timeout, read_timeout)
        self._account_path = f"/{API_VERSION}/Accounts/{quote(account_sid, safe='')}"
        self._client = json_client(
            self._base_url,
            auth=httpx.BasicAuth(account_sid, auth_token),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        # The client holds the auth token; show only where requests go.
        return f"TwilioTransport(base_url={self._base_url!r})"

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Create the Message; it is sent only while the link still has a second to live."""
        if message.sms is None:
            raise PermanentError(f"twilio: {message.channel} message has no rendered SMS")
        remaining = message.expires_at - self._clock()
        if remaining < VALIDITY_PERIOD_MIN:
            # A dead link is not sent, and Twilio would refuse a ValidityPeriod below 1 s.
            raise PermanentError("twilio: the reset link expires in under a second; not sent")
        # Whole seconds, rounded down, so Twilio drops the SMS from its queue no later than
        # the link dies rather than delivering a dead link.
        validity = min(VALIDITY_PERIOD_MAX, math.floor(remaining))
        form = {"To": message.recipient, "Body": message.sms.body, "ValidityPeriod": str(validity)}
        sender, service = self._sender_of(message)
        if sender is not None:
            form["From"] = sender
        if service is not None:
            form["MessagingServiceSid"] = service
        if self._status_callback is not None:
            form["StatusCallback"] = callback_url_for_attempt(self._status_callback, attempt_key)
        response = _CALLS.create(
            lambda: self._client.post(f"{self._account_path}/Messages.json", data=form),
            unreachable="could not reach Twilio",
        )
        sid, raw = _resource(response, creating=True)
        LOGGER.debug("twilio submit %s: %s %s (validity %ss)", attempt_key, sid, raw, validity)
        return ProviderStatus(sid, raw, normalize(raw))

    def status(self, message_id: str) -> ProviderStatus:
        """Fetch the Message and normalize its status; a failed read is safe to repeat."""
        path = f"{self._account_path}/Messages/{quote(message_id, safe='')}.json"
        response = _CALLS.read(lambda: self._client.get(path), what="status read failed")
        sid, raw = _resource(response, creating=False)
        LOGGER.debug("twilio status %s: %s", sid, raw)
        return ProviderStatus(message_id, raw, normalize(raw))

    def _sender_of(self, message: Message) -> tuple[str | None, str | None]:
        """(From, MessagingServiceSid) of a create: the policy's sender when it names
        one, in whichever of the two it is, else this transport's own."""
        chosen = message.sender.sms_from
        if chosen is None:
            return self._sender, self._service
        return (None, chosen) if _SERVICE_SID.fullmatch(chosen) else (chosen, None)

    def fingerprint(self, message: Message) -> Mapping[str, str]:
        """The sender this create names and a digest of the exact body it sends."""
        body = "" if message.sms is None else message.sms.body
        sender, service = self._sender_of(message)
        return {
            "from": sender or "",
            "service": service or "",
            "body_sha256": body_digest(body),
            "body_length": str(len(body)),
        }

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        """The Message a doubtful submission created, or None when Twilio has none.

        Twilio keeps no attempt key, so this lists the messages to the number (from the
        number the create named, if it named one) and matches the body by the digest
        recorded when it was sent: the whole body, or its end (a trial account stores
        TRIAL_PREFIX before it), which carries the reset link no other message holds;
        created no earlier than ``since`` (epoch seconds) less CLOCK_SKEW. Raises
        TransientError when the read fails, or when one page of the list cannot prove
        the message absent.
        """
        digest, length = sent.get("body_sha256", ""), sent.get("body_length", "")
        if not digest or not length.isdigit() or int(length) == 0:
            raise TransientError("twilio: no record of the body sent; cannot look it up")
        # No DateSent>= filter, though the list offers one: Twilio sets date_sent only when
        # the message leaves its queue, so a message still queued (exactly what a lost
        # reply leaves behind) has none and such a filter would hide it. date_created is
        # set at creation; it is compared here instead.
        query = {"To": recipient, "PageSize": str(LOOKUP_PAGE_SIZE)}
        if sent.get("from"):
            query["From"] = sent["from"]
        response = _CALLS.read(
            lambda: self._client.get(f"{self._account_path}/Messages.json", params=query),
            what="lookup failed",
        )
        listed = _listed_messages(response)
        earliest = since - CLOCK_SKEW
        oldest: float | None = None
        for item in listed.messages:
            created = _created_at(item.get("date_created"))
            if created is not None:
                oldest = created if oldest is None else min(oldest, created)
            if not _is_our_body(item.get("body"), digest, int(length)) or (
                created is not None and created < earliest
            ):
                continue
            sid, raw = item.get("sid"), item.get("status")
            if isinstance(sid, str) and sid and isinstance(raw, str) and raw:
                LOGGER.debug("twilio lookup %s: found %s %s", attempt_key, sid, raw)
                return ProviderStatus(sid, raw, normalize(raw))
        if listed.more and (oldest is None or oldest >= earliest):
            # A full page, all of it since the submission: ours may be on the next one.
            raise TransientError("twilio: lookup found more messages than one page holds")
        LOGGER.debug("twilio lookup %s: not found in %d", attempt_key, len(listed.messages))
        return None

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()


def _error_code(response: httpx.Response) -> int | None:
    """Twilio's numeric error code in a reply, if it carries one (never its message)."""
    return int_field(json_object(response), "code")


def _code_suffix(response: httpx.Response) -> str:
    code = _error_code(response)
    return "" if code is None else f", error {code}"


def _resource(response: httpx.Response, *, creating: bool) -> tuple[str, str]:
    """The (sid, status as evidence) of a Message reply, or the error its HTTP status
    means."""
    status = response.status_code
    if status >= 500 and creating:
        # Twilio, or a gateway in front of it, may have created the message before the
        # failure (a 504 after the create is how a second SMS used to go out).
        raise AmbiguousError(
            f"twilio: HTTP {status}{_code_suffix(response)} to a create; it may exist"
        )
    if status == 429:
        # Refused unread: nothing was created, and the lane backs off as asked.
        raise ThrottledError(
            f"twilio: HTTP 429{_code_suffix(response)}; slowing down",
            retry_after(response.headers, time.time()),
        )
    if status >= 500:
        # A failed read changes nothing.
        raise TransientError(f"twilio: HTTP {status}{_code_suffix(response)}; try again later")
    if not 200 <= status < 300:
        raise TwilioRefused(status, _error_code(response))
    try:
        body: Any = response.json()
        sid, raw = body["sid"], body["status"]
    except (ValueError, KeyError, TypeError):
        sid = raw = None
    if not isinstance(sid, str) or not sid or not isinstance(raw, str) or not raw:
        # A 2xx to a create means Twilio has the message even if we cannot read its id.
        error = AmbiguousError if creating else TransientError
        raise error(f"twilio: HTTP {status} reply without a message sid and status")
    return sid, VOCABULARY.evidence(raw)


@dataclass(frozen=True, slots=True)
class _Listed:
    """One page of a Messages list."""

    #: the page's messages, newest first, each status as evidence
    messages: list[dict[str, Any]]
    #: Twilio has a next page
    more: bool


def _listed_messages(response: httpx.Response) -> _Listed:
    """A list reply's page, or TransientError: a failed lookup proves nothing either way."""
    status = response.status_code
    if status == 429:
        raise ThrottledError(
            f"twilio: lookup got HTTP 429{_code_suffix(response)}",
            retry_after(response.headers, time.time()),
        )
    if not 200 <= status < 300:
        raise TransientError(f"twilio: lookup got HTTP {status}{_code_suffix(response)}")
    try:
        body: Any = response.json()
        messages = body["messages"]
        more = body.get("next_page_uri") is not None
    except (ValueError, KeyError, TypeError, AttributeError):
        messages, more = None, False
    if not isinstance(messages, list):
        raise TransientError(f"twilio: lookup got HTTP {status} without a message list")
    return _Listed([_with_evidence(m) for m in messages if isinstance(m, dict)], more)


def _with_evidence(listed: dict[str, Any]) -> dict[str, Any]:
    """A listed message with its status as evidence (an empty or missing one kept)."""
    raw = listed.get("status")
    if not isinstance(raw, str) or not raw:
        return listed
    evidence = VOCABULARY.evidence(raw)
    return listed if evidence == raw else {**listed, "status": evidence}


def _is_our_body(listed: object, digest: str, length: int) -> bool:
    """True when a listed body is ours: the same as what was sent (by its digest), or
    ending with it after a prefix (TRIAL_PREFIX).

    Ours holds the reset link, which no other message does, so a body that ends with all
    of ours is ours, whatever Twilio put before it.
    """
    if not isinstance(listed, str) or len(listed) < length:
        return False
    return body_digest(listed[len(listed) - length :]) == digest


def _created_at(value: object) -> float | None:
    """Epoch seconds of an RFC 2822 date_created; None when it is missing or unreadable.

    An unreadable date does not rule a message out: one with our exact body is ours, and
    reporting it missing would send the person a second SMS.
    """
    if not isinstance(value, str):
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (ValueError, TypeError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # "-0000": UTC, with no claim about local time
    return moment.timestamp()


def callback_url_for_attempt(url: str, attempt_key: str) -> str:
    """``url`` with ``attempt=<attempt_key>`` added to its query; its other parameters are
    kept as written, and an ``attempt`` already there is replaced."""
    parts = urlsplit(url)
    kept = [
        pair
        for pair in parts.query.split("&")
        if pair and unquote_plus(pair.partition("=")[0]) != CALLBACK_ATTEMPT_PARAM
    ]
    kept.append(urlencode({CALLBACK_ATTEMPT_PARAM: attempt_key}))
    return urlunsplit(parts._replace(query="&".join(kept)))


def attempt_from_callback_url(url: str) -> str | None:
    """The attempt key a status callback's URL carries, or None when it carries none (or
    more than one)."""
    values = [
        value
        for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True)
        if name == CALLBACK_ATTEMPT_PARAM
    ]
    return values[0] if len(values) == 1 and values[0] else None


def signed_payload(url: str, params: Mapping[str, str]) -> str:
    """What X-Twilio-Signature covers: the full URL, then each POST param's name and
    value, sorted by name, with nothing between them."""
    return url + "".join(f"{key}{params[key]}" for key in sorted(params))


def compute_signature(url: str, params: Mapping[str, str], auth_token: str) -> str:
    """Twilio's X-Twilio-Signature for a request: base64 HMAC-SHA1 of URL + sorted params."""
    payload = signed_payload(url, params)
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def callback_identity(url: str, params: Mapping[str, str], auth_token: str) -> str:
    """The dedupe identity of a verified status callback: ``twilio:sig:`` and the hex
    HMAC-SHA256, under the auth token, of exactly what its signature covers.

    Only signed content may decide what is a replay: I-Twilio-Idempotency-Token is not
    signed, so anyone who saw a callback could replay it under fresh tokens. Every body
    a given signature verifies has this identity, a re-split one included (the same
    bytes read as other parameters), so one signed callback yields one observation
    however it is replayed. The digest is keyed because the payload holds the phone
    number and the rest of it is in the database or guessable; the token is kept
    outside the database, like the hash key. (After the token is rotated, a retry
    Twilio signs with the new one is stored once more; one signed with the old one no
    longer verifies.)
    """
    payload = signed_payload(url, params).encode()
    digest = hmac.new(auth_token.encode(), payload, hashlib.sha256).hexdigest()
    return f"{CALLBACK_IDENTITY_PREFIX}{digest}"


def verify_signature(url: str, params: Mapping[str, str], signature: str, auth_token: str) -> bool:
    """True when ``signature`` (X-Twilio-Signature) signs the full URL and the POST params.

    ``url`` must be exactly the URL Twilio requested, query string included.
    """
    if not signature or not auth_token:
        return False
    expected = compute_signature(url, params, auth_token)
    # Constant time, so the comparison does not leak how much of a forgery was right.
    return hmac.compare_digest(expected.encode(), signature.encode())


def callback_status(params: Mapping[str, str]) -> tuple[str, str]:
    """(MessageSid, MessageStatus) from a status-callback form body; the status is as
    posted (record it as ``VOCABULARY.evidence``).

    A MessageSid that is not a Message sid is a ValueError that does not quote it: a
    re-split signed body can carry the phone number there, and the sid is stored on the
    attempt and named in errors.
    """
    found = []
    for field in ("MessageSid", "MessageStatus"):
        value = params.get(field)
        if not value:
            raise ValueError(f"twilio status callback: {field} is missing")
        found.append(value)
    if not _MESSAGE_SID.fullmatch(found[0]):
        raise ValueError("twilio status callback: MessageSid is not a Twilio Message sid")
    return found[0], found[1]


#: The header Twilio signs its callbacks in.
SIGNATURE_HEADER = "x-twilio-signature"
FORM = "application/x-www-form-urlencoded"


class TwilioCallbacks:
    """Twilio's status callbacks: a form body signed with the auth token over the full
    URL (query string included) and the sorted POST parameters."""

    media_types = frozenset({FORM})
    signature_header = SIGNATURE_HEADER

    def __init__(self, auth_token: str | None, public_url: str | None, where: str) -> None:
        self._token = auth_token
        self._where = where
        self.public_url = public_url

    def __repr__(self) -> str:
        return f"TwilioCallbacks(public_url={self.public_url!r})"

    def check(self) -> None:
        """ConfigError when TWILIO_AUTH_TOKEN is not set."""
        if not self._token:
            raise ConfigError(f"{self._where}: TWILIO_AUTH_TOKEN is not set")

    def read(self, request: CallbackRequest, now: float) -> list[CallbackReport]:
        """The status report a verified callback carries (one per request)."""
        del now  # Twilio's signature has no timestamp: a replay is told by its identity
        self.check()
        assert self._token is not None
        try:
            body = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCallback(["body: not UTF-8 form data; nothing recorded"]) from None
        params = dict(parse_qsl(body.strip(), keep_blank_values=True))
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not verify_signature(request.url, params, signature, self._token):
            raise SignatureMismatch(
                ["signature: does not match the body and URL; nothing recorded"]
            )
        try:
            message_id, raw = callback_status(params)
        except ValueError as exc:
            raise MalformedCallback([f"body: {exc}"]) from None
        evidence, status = VOCABULARY.reading(raw)
        return [
            CallbackReport(
                message_id,
                attempt_from_callback_url(request.url),
                evidence,
                status,
                callback_identity(request.url, params, self._token),
            )
        ]


def _callbacks(context: TransportContext) -> TwilioCallbacks:
    """The reader of an instance's status callbacks; its public URL is status_callback."""
    url = _callback_url(context)
    return TwilioCallbacks(context.secret("TWILIO_AUTH_TOKEN"), url, context.table)


def _callback_url(context: TransportContext) -> str | None:
    """``status_callback`` when set; https, since Twilio would post each message's status,
    and the number, to it (http only for a loopback host)."""
    callback = optional_str(context, "status_callback")
    if callback is not None:
        https_or_loopback_url(context, "status_callback", callback)
    return callback


def _create(context: TransportContext) -> Transport:
    context.reject_unknown(
        {
            "base_url",
            "from",
            "messaging_service_sid",
            "status_callback",
            "connect_timeout",
            "read_timeout",
            "lookup_settle",
        }
    )
    base_url = context.option("base_url", DEFAULT_BASE_URL, str)
    http_url(context, "base_url", base_url)
    sender = optional_str(context, "from")
    service = optional_str(context, "messaging_service_sid")
    if (sender is None) == (service is None):
        raise ConfigError(f"{context.table}.from: set exactly one of from or messaging_service_sid")
    if service is not None and not _SERVICE_SID.fullmatch(service):
        raise ConfigError(f"{context.table}.messaging_service_sid: expected MG and 32 hex digits")
    callback = _callback_url(context)
    connect_timeout = timeout_seconds(context, "connect_timeout", 5.0)
    read_timeout = timeout_seconds(context, "read_timeout", 10.0)
    settle = lookup_settle(context, DEFAULT_LOOKUP_SETTLE)
    # Secrets last: a sweep with missing credentials fails here, before it claims anything.
    account_sid = context.require_secret("TWILIO_ACCOUNT_SID")
    auth_token = context.require_secret("TWILIO_AUTH_TOKEN")
    if not _ACCOUNT_SID.fullmatch(account_sid):
        raise ConfigError(f"{context.table}: TWILIO_ACCOUNT_SID is not AC and 32 hex digits")
    return TwilioTransport(
        account_sid,
        auth_token,
        sender=sender,
        messaging_service_sid=service,
        status_callback=callback,
        base_url=base_url,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        lookup_settle=settle,
        clock=context.clock,
    )


PLUGIN = TransportPlugin(
    name="twilio",
    channels=frozenset({"sms"}),
    create=_create,
    vocabulary=VOCABULARY,
    callbacks=_callbacks,
)
