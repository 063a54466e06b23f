"""Plivo SMS: send a message, read its detail record, find it again, verify status
callbacks.

Plivo's Message create has no idempotency key, so a submission that may have reached
Plivo (any 5xx, a time-out or a dropped connection once the request was written, a 2xx
without a readable message_uuid) is ambiguous and never resent blindly: ``lookup`` lists
the outbound SMS records to the number and decides from them. Only what provably created
nothing is transient: a refused connection, a DNS or TLS failure before the request was
written, a 429.

**Where lookup is weaker than Twilio's.** Plivo's message records (the list and the
fetch alike) carry no text, no callback URL and no metadata of ours: nothing that holds
the reset link or the attempt key. So a lookup cannot recognise *our* message, only
*a* message of the right shape: outbound SMS, to the number, from the sender the create
named (or through the Powerpack it named), created no earlier than ``since`` less
CLOCK_SKEW. It decides as follows, always towards not sending twice:

- none of that shape: not found (after the settle time, two such lookups let the same
  attempt key be sent again, as for Twilio);
- exactly one: found. It can be someone else's message only if the account sent another
  SMS from the same sender to the same number in the same minutes as a create whose
  reply was lost and which itself created nothing; the attempt is then taken as sent (a
  missed SMS, never a second one);
- more than one, or a page that could hide more: TransientError. A failed read proves
  nothing, so the doubt stays until the poll budget is spent, rather than guess.

The list is filtered by number, direction, type and time only, never by sender: a record
whose sender Plivo replaced (``replaced_sender``) or does not show still counts, because
leaving out a message that is ours would send a second SMS. The create never sets
``log`` to false: Plivo would then mask the destination in its records and no lookup
could find the message.

A message comes from the notice's policy's sender when it names one (a Powerpack UUID is
sent as ``powerpack_uuid``, anything else as ``src``), else from ``[plivo] from`` or
``powerpack_uuid``: one or the other, never both. ``message_expiry`` bounds Plivo's queue
by the link's life (Plivo's documented 5 to 10,799 seconds), so a link that dies in
Plivo's queue is dropped there; a link with under 5 seconds left is not sent at all.

Status callbacks are verified by X-Plivo-Signature-V3 (HMAC-SHA256 under the auth token
of the URL, its sorted query and the sorted POST parameters, and the nonce). The older
V2 header signs only the URL's path and a nonce, not the body, so it is never accepted
(Plivo's messaging pages still describe V2; its request-validation page lists the message
callback ``url`` among those signed with V3). A callback that fails is refused unrecorded,
and status reads still find the outcome.

Nothing this module raises or logs holds the phone number, the SMS body or the auth
token: Plivo's error replies are free text that may quote the number, so only the HTTP
status is passed on, and httpx's request log line for a lookup loses its query string.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl, quote, urlsplit

import httpx

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch
from resetctl.machine import Status
from resetctl.transports.base import (
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
    TransportPlugin,
    body_digest,
)
from resetctl.transports.http import (
    ProviderCalls,
    http_call_timeout,
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
from resetctl.transports.twilio import attempt_from_callback_url, callback_url_for_attempt

LOGGER = logging.getLogger("resetctl.transports.plivo")
#: Its calls' failures, as this module raises and logs them.
_CALLS = ProviderCalls("plivo", LOGGER)

DEFAULT_BASE_URL = "https://api.plivo.com"

#: Plivo's documented message_expiry range in seconds (its default is 10,800).
MESSAGE_EXPIRY_MIN = 5
MESSAGE_EXPIRY_MAX = 10_799

#: Default seconds between the two not-found lookups that let an attempt be resent.
#: Longer than Twilio's: Plivo's records are a reporting store and document no delay.
DEFAULT_LOOKUP_SETTLE = 60.0
#: Records one lookup reads: Plivo's largest page.
LOOKUP_PAGE_SIZE = 20
#: How far a record's message_time (Plivo's clock) may sit before ``since`` (ours).
CLOCK_SKEW = 60.0

#: The headers of Plivo's request signature (names in lower case, as a
#: CallbackRequest holds them).
SIGNATURE_HEADER = "x-plivo-signature-v3"
NONCE_HEADER = "x-plivo-signature-v3-nonce"
#: The dedupe identity of a status callback: this prefix and a keyed digest of what the
#: signature covers.
CALLBACK_IDENTITY_PREFIX = "plivo:sig:"
FORM = "application/x-www-form-urlencoded"
#: The keys a [plivo] table may hold (besides credentials_file).
OPTION_KEYS = (
    "base_url",
    "from",
    "powerpack_uuid",
    "status_callback",
    "connect_timeout",
    "read_timeout",
    "lookup_settle",
)

_STATUS_MAP: Mapping[str, Status] = {
    # Still in Plivo's queue: not yet handed to a carrier.
    "queued": Status.PENDING,
    # The carrier took it; a delivery receipt may never come (none in the US or Canada).
    "sent": Status.ACCEPTED,
    "delivered": Status.DELIVERED,
    "read": Status.DELIVERED,
    "failed": Status.FAILED,
    "undelivered": Status.FAILED,
    "rejected": Status.FAILED,
}

#: Every message_state Plivo documents. ``received`` is an inbound message's: it says
#: nothing about a reset SMS, so it is unknown.
PLIVO_STATUSES: frozenset[str] = frozenset(_STATUS_MAP) | {"received"}

#: What an HTTP refusal means, in our words: Plivo's own error text may quote the number.
REFUSALS: Mapping[int, str] = {
    400: "a parameter is missing or invalid",
    401: "authentication failed (check PLIVO_AUTH_ID and PLIVO_AUTH_TOKEN)",
    403: "forbidden for this account",
    404: "no such resource",
    405: "method not allowed",
}

_AUTH_ID = re.compile(r"[MS]A[A-Za-z0-9]{18}")
_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
# A Twilio Messaging Service a policy may name: no Plivo sender.
_TWILIO_SERVICE = re.compile(r"MG[0-9a-fA-F]{32}")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")

#: The Message list path: a lookup's query string holds the recipient's number.
_LIST_PATH = re.compile(r"/v1/Account/[^/]+/Message/")


redact_queries(lambda path: _LIST_PATH.fullmatch(path) is not None)  # its query holds the number


def normalize(raw: str) -> Status:
    """Plivo's raw message_state as the machine's vocabulary; unknown words are unknown."""
    return _STATUS_MAP.get(raw, Status.UNKNOWN)


#: Plivo's statuses and their mapping; what is recorded of a status is its evidence.
VOCABULARY = StatusVocabulary("plivo", PLIVO_STATUSES, normalize)


class PlivoRefused(PermanentError):
    """Plivo refused the request for good; ``http_status`` says how (Plivo's API errors
    are text, never passed on)."""

    def __init__(self, http_status: int, detail: str | None = None) -> None:
        self.http_status = http_status
        what = detail or REFUSALS.get(http_status, "refused")
        super().__init__(f"plivo refused the request (HTTP {http_status}: {what})")


class PlivoTransport:
    """Plivo's Message API over one pooled HTTPS client."""

    name = "plivo"
    #: Plivo dedupes nothing: a second create is a second SMS.
    recovers_by_key = False
    #: the longest one call can take (set from the time-outs)
    call_timeout: float
    #: seconds between the two not-found lookups that let an attempt be resent
    lookup_settle: float

    def __init__(
        self,
        auth_id: str,
        auth_token: str,
        *,
        sender: str | None = None,
        powerpack_uuid: str | None = None,
        status_callback: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        lookup_settle: float = DEFAULT_LOOKUP_SETTLE,
        clock: Callable[[], float],
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if (sender is None) == (powerpack_uuid is None):
            raise ConfigError("plivo.from: set exactly one of from or powerpack_uuid")
        self._sender = sender
        self._powerpack = powerpack_uuid
        self._status_callback = status_callback
        self._clock = clock
        self._base_url = base_url.rstrip("/")
        self.lookup_settle = lookup_settle
        self.call_timeout = http_call_timeout(self._base_url, connect_timeout, read_timeout)
        self._messages_path = f"/v1/Account/{quote(auth_id, safe='')}/Message/"
        self._client = json_client(
            self._base_url,
            auth=httpx.BasicAuth(auth_id, auth_token),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        # The client holds the auth token; show only where requests go.
        return f"PlivoTransport(base_url={self._base_url!r})"

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Send the message; it is sent only while the link has MESSAGE_EXPIRY_MIN to live."""
        if message.sms is None:
            raise PermanentError(f"plivo: {message.channel} message has no rendered SMS")
        remaining = message.expires_at - self._clock()
        if remaining < MESSAGE_EXPIRY_MIN:
            # Plivo would refuse a shorter expiry, and a link this close to dying is dead.
            raise PermanentError("plivo: the reset link expires in under 5 seconds; not sent")
        sender, powerpack = self._sender_of(message)
        if sender is not None and _TWILIO_SERVICE.fullmatch(sender):
            raise PermanentError("plivo: the policy names a Twilio messaging service as sender")
        # Whole seconds, rounded down, so Plivo drops the SMS from its queue no later than
        # the link dies rather than handing a dead link to the carrier.
        expiry = min(MESSAGE_EXPIRY_MAX, math.floor(remaining))
        body: dict[str, Any] = {
            "dst": message.recipient,
            "text": message.sms.body,
            "type": "sms",
            "message_expiry": expiry,
        }
        if sender is not None:
            body["src"] = sender
        if powerpack is not None:
            body["powerpack_uuid"] = powerpack
        if self._status_callback is not None:
            body["url"] = callback_url_for_attempt(self._status_callback, attempt_key)
            body["method"] = "POST"
        response = _CALLS.create(
            lambda: self._client.post(self._messages_path, json=body),
            unreachable="could not reach Plivo",
        )
        uuid = _created_uuid(response)
        LOGGER.debug("plivo submit %s: %s queued (expiry %ss)", attempt_key, uuid, expiry)
        # Plivo's documented state of every accepted message ("message(s) queued").
        return ProviderStatus(uuid, "queued", normalize("queued"))

    def status(self, message_id: str) -> ProviderStatus:
        """Fetch the message's record and normalize its state; a failed read is safe to
        repeat."""
        path = f"{self._messages_path}{quote(message_id, safe='')}/"
        response = _CALLS.read(lambda: self._client.get(path), what="status read failed")
        record = _record(response)
        raw = record.get("message_state")
        if not isinstance(raw, str) or not raw:
            raise TransientError(f"plivo: HTTP {response.status_code} reply without a state")
        reply = VOCABULARY.reply(message_id, raw)
        LOGGER.debug(
            "plivo status %s: %s%s",
            message_id,
            reply.raw_status,
            _code_note(record.get("error_code")),
        )
        return reply

    def _sender_of(self, message: Message) -> tuple[str | None, str | None]:
        """(src, powerpack_uuid) of a create: the policy's sender when it names one, in
        whichever of the two it is, else this transport's own."""
        chosen = message.sender.sms_from
        if chosen is None:
            return self._sender, self._powerpack
        return (None, chosen) if _UUID.fullmatch(chosen) else (chosen, None)

    def fingerprint(self, message: Message) -> Mapping[str, str]:
        """The sender this create names and a digest of the exact body it sends (kept as
        the record of what was sent; Plivo's records have no text to match it with)."""
        body = "" if message.sms is None else message.sms.body
        sender, powerpack = self._sender_of(message)
        return {
            "from": sender or "",
            "service": powerpack or "",
            "body_sha256": body_digest(body),
            "body_length": str(len(body)),
        }

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        """The message a doubtful submission created, or None when Plivo has none.

        Lists the outbound SMS records to the number since ``since`` less CLOCK_SKEW and
        keeps those from the sender (or Powerpack) the create named: none is a not-found,
        one is the message, more (or a full page) a TransientError, as the module says.
        """
        sender, powerpack = sent.get("from") or None, sent.get("service") or None
        if (sender is None) == (powerpack is None):
            raise TransientError("plivo: no record of the sender; cannot look it up")
        earliest = since - CLOCK_SKEW
        query = {
            "message_direction": "outbound",
            "message_type": "sms",
            "to_number": recipient,
            "message_time__gte": _plivo_time(earliest),
            "limit": str(LOOKUP_PAGE_SIZE),
            "offset": "0",
        }
        response = _CALLS.read(
            lambda: self._client.get(self._messages_path, params=query),
            what="lookup failed",
        )
        listed = _listed_records(response)
        found = [
            record
            for record in listed.records
            if _could_be_ours(record, recipient, sender, powerpack, earliest)
        ]
        if listed.more:
            raise TransientError("plivo: lookup found more records than one page holds")
        if len(found) > 1:
            # No record holds the text or the attempt key: which one is ours is a guess.
            raise TransientError(f"plivo: lookup found {len(found)} messages that could be ours")
        if not found:
            LOGGER.debug("plivo lookup %s: not found in %d", attempt_key, len(listed.records))
            return None
        uuid, raw = found[0].get("message_uuid"), found[0].get("message_state")
        if not isinstance(uuid, str) or not _UUID.fullmatch(uuid) or not isinstance(raw, str):
            raise TransientError("plivo: lookup found a record without a message_uuid and state")
        reply = VOCABULARY.reply(uuid, raw)
        LOGGER.debug("plivo lookup %s: found %s %s", attempt_key, uuid, reply.raw_status)
        return reply

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()


def _refusal(response: httpx.Response, *, creating: bool, what: str) -> None:
    """The error a non-2xx reply means, raised; nothing for a 2xx."""
    status = response.status_code
    if status >= 500 and creating:
        # Plivo, or a gateway in front of it, may have queued the message before failing.
        raise AmbiguousError(f"plivo: HTTP {status} to a create; it may exist")
    if status == 429:
        # Refused unread: nothing was created, and the lane backs off as asked.
        raise ThrottledError(
            f"plivo: {what} got HTTP 429; slowing down", retry_after(response.headers, time.time())
        )
    if status >= 500:
        raise TransientError(f"plivo: {what} got HTTP {status}; try again later")
    if not 200 <= status < 300:
        raise PlivoRefused(status)


def _created_uuid(response: httpx.Response) -> str:
    """The message_uuid of a create's reply, or the error its HTTP status means."""
    _refusal(response, creating=True, what="create")
    body = json_object(response)
    uuids = None if body is None else body.get("message_uuid")
    if isinstance(uuids, list) and len(uuids) == 1 and _UUID.fullmatch(str(uuids[0])):
        return str(uuids[0])
    invalid = None if body is None else body.get("invalid_number")
    if not uuids and isinstance(invalid, list) and invalid:
        # Plivo names the destination it would not queue, and queued nothing.
        raise PlivoRefused(response.status_code, "invalid destination number")
    # A 2xx to a create means Plivo has the message even if we cannot read its id.
    raise AmbiguousError(f"plivo: HTTP {response.status_code} reply without one message_uuid")


def _record(response: httpx.Response) -> dict[str, Any]:
    """A fetched message record, or the error its reply means (reads are never ambiguous)."""
    _refusal(response, creating=False, what="status read")
    body = json_object(response)
    if body is None:
        raise TransientError(f"plivo: HTTP {response.status_code} reply without a record")
    return body


def _code_note(code: object) -> str:
    """`` (error 30)`` for a numeric Plivo error code, else nothing (never its text)."""
    if isinstance(code, int) and not isinstance(code, bool):
        code = str(code)
    if isinstance(code, str) and code.isdigit() and code.strip("0"):
        return f" (error {code})"
    return ""


@dataclass(frozen=True, slots=True)
class _Listed:
    """One page of a Message list."""

    #: the page's records, newest first
    records: list[dict[str, Any]]
    #: Plivo has a next page
    more: bool


def _listed_records(response: httpx.Response) -> _Listed:
    """A list reply's page, or TransientError: a failed lookup proves nothing either way."""
    status = response.status_code
    if status == 429:
        raise ThrottledError(
            "plivo: lookup got HTTP 429", retry_after(response.headers, time.time())
        )
    if not 200 <= status < 300:
        # Even a refusal (a 401, a 400) proves nothing about the message.
        raise TransientError(f"plivo: lookup got HTTP {status}")
    body = json_object(response)
    records = None if body is None else body.get("objects")
    meta = None if body is None else body.get("meta")
    if not isinstance(records, list) or not isinstance(meta, dict):
        raise TransientError(f"plivo: lookup got HTTP {response.status_code} without a list")
    total = meta.get("total_count")
    more = meta.get("next") is not None or (
        isinstance(total, int) and not isinstance(total, bool) and total > len(records)
    )
    return _Listed([r for r in records if isinstance(r, dict)], more)


def _sanitized(value: object) -> str | None:
    """A number or sender id as Plivo stores it (its letters and digits), or None."""
    return _NOT_ALNUM.sub("", value).upper() if isinstance(value, str) else None


def _could_be_ours(
    record: Mapping[str, Any],
    recipient: str,
    sender: str | None,
    powerpack: str | None,
    earliest: float,
) -> bool:
    """True unless the record shows it is not the message a create for ``recipient``
    from ``sender`` (or ``powerpack``) made at or after ``earliest``.

    What a record does not show (a missing field, an unreadable time) rules nothing out:
    leaving out our own message would send the person a second SMS.
    """
    if record.get("message_direction", "outbound") != "outbound":
        return False
    if record.get("message_type", "sms") != "sms":
        return False
    to = _sanitized(record.get("to_number"))
    if to is not None and to != _sanitized(recipient):
        return False
    created = _record_time(record.get("message_time"))
    if created is not None and created < earliest:
        return False
    if powerpack is not None:
        listed = record.get("powerpack_id")
        return not isinstance(listed, str) or listed.lower() == powerpack.lower()
    replaced = record.get("replaced_sender")
    if isinstance(replaced, str) and replaced:
        return True  # Plivo sent it from another sender than the one asked for
    shown = _sanitized(record.get("from_number"))
    return shown is None or shown == _sanitized(sender)


def _plivo_time(epoch: float) -> str:
    """``epoch`` as Plivo's list filters take a time: UTC, ``YYYY-MM-DD HH:MM:SS``
    (rounded down, so the filter never starts after the moment)."""
    return datetime.fromtimestamp(math.floor(epoch), UTC).strftime("%Y-%m-%d %H:%M:%S")


def _record_time(value: object) -> float | None:
    """Epoch seconds of a record's message_time (``2026-01-01 12:00:00.123+05:30``; UTC
    when it names no offset), or None when it is missing or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _grouped(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, value in pairs:
        grouped.setdefault(name, []).append(value)
    return grouped


def signed_base(url: str, params: Sequence[tuple[str, str]]) -> str:
    """What X-Plivo-Signature-V3 covers of a POST, before its nonce: the scheme, host and
    path; ``?`` and the query's ``name=value`` pairs (decoded) sorted and joined by
    ``&``; a ``.`` between query and body when there are both; then each POST param's
    name and value, sorted by name (repeated values sorted), with nothing between them.
    """
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}{parts.path}"
    query_map = parse_qs(parts.query, keep_blank_values=True)
    query = "&".join(
        f"{name}={value}" for name in sorted(query_map) for value in sorted(query_map[name])
    )
    body = _grouped(params)
    if query or body:
        base += "?" + query
    if query and body:
        base += "."
    return base + "".join(f"{name}{value}" for name in sorted(body) for value in sorted(body[name]))


def compute_signature(
    url: str, params: Sequence[tuple[str, str]], nonce: str, auth_token: str
) -> str:
    """Plivo's X-Plivo-Signature-V3 for a POST: base64 HMAC-SHA256, under the auth
    token, of :func:`signed_base`, a ``.`` and the nonce."""
    payload = f"{signed_base(url, params)}.{nonce}".encode()
    return base64.b64encode(
        hmac.new(auth_token.encode(), payload, hashlib.sha256).digest()
    ).decode()


def verify_signature(
    url: str, params: Sequence[tuple[str, str]], nonce: str, signature: str, auth_token: str
) -> bool:
    """True when ``signature`` (X-Plivo-Signature-V3, one or several comma-separated, as
    Plivo sends while a token is rotated) signs the URL, the POST params and ``nonce``.

    ``url`` must be exactly the URL Plivo requested, query string included.
    """
    if not signature or not nonce or not auth_token:
        return False
    expected = compute_signature(url, params, nonce, auth_token).encode()
    matched = False
    for offered in signature.split(","):
        # Constant time, and every candidate compared, so timing leaks nothing.
        matched |= hmac.compare_digest(expected, offered.strip().encode())
    return matched


def callback_identity(url: str, params: Sequence[tuple[str, str]], auth_token: str) -> str:
    """The dedupe identity of a verified status callback: ``plivo:sig:`` and the hex
    HMAC-SHA256, under the auth token, of :func:`signed_base` (the nonce left out).

    Only signed content decides what is a replay. Every body a signature verifies has
    this identity, a re-split one included (the same characters read as other
    parameters), and so does a retry Plivo signs under a fresh nonce: one report is one
    observation however it is replayed. V3 signs no timestamp, so there is no staleness
    to refuse; a replay is harmless because it is stored once. Keyed, because the
    payload holds the phone number and the rest of it is in the database or guessable.
    """
    digest = hmac.new(auth_token.encode(), signed_base(url, params).encode(), hashlib.sha256)
    return f"{CALLBACK_IDENTITY_PREFIX}{digest.hexdigest()}"


def callback_status(params: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """(MessageUUID, Status) from a status callback's form params; the status is as
    posted (record it as ``VOCABULARY.evidence``).

    A MessageUUID that is not a UUID is a ValueError that does not quote it: a re-split
    signed body can carry the phone number there, and the id is stored on the attempt.
    """
    fields = _grouped(params)
    found = []
    for name in ("MessageUUID", "Status"):
        values = fields.get(name, [])
        if len(values) != 1 or not values[0]:
            what = "is missing" if not values or not values[0] else "is repeated"
            raise ValueError(f"plivo status callback: {name} {what}")
        found.append(values[0])
    if not _UUID.fullmatch(found[0]):
        raise ValueError("plivo status callback: MessageUUID is not a Plivo message uuid")
    return found[0], found[1]


class PlivoCallbacks:
    """Reads and verifies one Plivo instance's message status callbacks. A plain class,
    not a frozen record: the reader protocol's attributes are plain ones."""

    __slots__ = ("_auth_token", "_where", "media_types", "public_url")

    def __init__(self, public_url: str | None, auth_token: str | None, where: str) -> None:
        #: the URL Plivo posts to (``status_callback``), or None
        self.public_url = public_url
        #: Plivo posts form data (``method`` POST on every create)
        self.media_types = frozenset({FORM})
        self._auth_token = auth_token or ""
        self._where = where

    def check(self) -> None:
        """ConfigError when PLIVO_AUTH_TOKEN is not set."""
        if not self._auth_token:
            raise ConfigError(f"{self._where}: PLIVO_AUTH_TOKEN is not set")

    def __repr__(self) -> str:
        # The token stays out of it.
        return f"PlivoCallbacks(public_url={self.public_url!r})"

    def read(self, request: CallbackRequest, now: float) -> Sequence[CallbackReport]:
        """The one status report a signed callback carries."""
        del now  # V3 signs no timestamp: replays are caught by the dedupe identity
        self.check()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        nonce = request.headers.get(NONCE_HEADER, "")
        if not signature or not nonce:
            raise SignatureMismatch(["signature: no X-Plivo-Signature-V3; nothing recorded"])
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCallback(["body: not UTF-8 form data; nothing recorded"]) from None
        params = parse_qsl(text, keep_blank_values=True)
        if not verify_signature(request.url, params, nonce, signature, self._auth_token):
            raise SignatureMismatch(
                ["signature: does not match the body and URL; nothing recorded"]
            )
        try:
            message_id, raw = callback_status(params)
        except ValueError as exc:
            raise MalformedCallback([f"body: {exc}"]) from None
        evidence, status = VOCABULARY.reading(raw)
        codes = [value for name, value in params if name == "ErrorCode"]
        note = _code_note(codes[0]) if len(codes) == 1 else ""
        LOGGER.debug("plivo callback %s: %s%s", message_id, evidence, note)
        identity = callback_identity(request.url, params, self._auth_token)
        attempt = attempt_from_callback_url(request.url)
        return (CallbackReport(message_id, attempt, evidence, status, identity),)


@dataclass(frozen=True, slots=True)
class _Options:
    """A [plivo] table, checked."""

    base_url: str
    sender: str | None
    powerpack: str | None
    status_callback: str | None
    connect_timeout: float
    read_timeout: float
    lookup_settle: float


def _options(context: TransportContext) -> _Options:
    context.reject_unknown(set(OPTION_KEYS))
    base_url = context.option("base_url", DEFAULT_BASE_URL, str)
    http_url(context, "base_url", base_url)
    sender = optional_str(context, "from")
    powerpack = optional_str(context, "powerpack_uuid")
    if (sender is None) == (powerpack is None):
        raise ConfigError(f"{context.table}.from: set exactly one of from or powerpack_uuid")
    if powerpack is not None and not _UUID.fullmatch(powerpack):
        raise ConfigError(f"{context.table}.powerpack_uuid: expected a UUID")
    callback = optional_str(context, "status_callback")
    if callback is not None:
        # Plivo would post each message's status, and the number, to it.
        https_or_loopback_url(context, "status_callback", callback)
    settle = lookup_settle(context, DEFAULT_LOOKUP_SETTLE)
    return _Options(
        base_url,
        sender,
        powerpack,
        callback,
        timeout_seconds(context, "connect_timeout", 5.0),
        timeout_seconds(context, "read_timeout", 10.0),
        settle,
    )


def _create(context: TransportContext) -> Transport:
    options = _options(context)
    # Secrets last: a sweep with missing credentials fails here, before it claims anything.
    auth_id = context.require_secret("PLIVO_AUTH_ID")
    auth_token = context.require_secret("PLIVO_AUTH_TOKEN")
    if not _AUTH_ID.fullmatch(auth_id):
        raise ConfigError(f"{context.table}: PLIVO_AUTH_ID is not MA or SA and 18 characters")
    return PlivoTransport(
        auth_id,
        auth_token,
        sender=options.sender,
        powerpack_uuid=options.powerpack,
        status_callback=options.status_callback,
        base_url=options.base_url,
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
        lookup_settle=options.lookup_settle,
        clock=context.clock,
    )


def _callbacks(context: TransportContext) -> CallbackReader:
    options = _options(context)
    token = context.secret("PLIVO_AUTH_TOKEN")
    return PlivoCallbacks(options.status_callback, token, context.table)


PLUGIN = TransportPlugin(
    name="plivo",
    channels=frozenset({"sms"}),
    create=_create,
    vocabulary=VOCABULARY,
    callbacks=_callbacks,
)
