"""Email through Mailgun's Messages API, delivery read back from its Events API, and its
webhooks verified with the webhook signing key.

``submit`` is ``POST /v3/{domain}/messages`` (multipart form, basic auth ``api`` and the
API key); ``status`` lists the message's events (``GET /v3/{domain}/events`` filtered by
``message-id``) and reads the latest delivery event. Mailgun has no idempotency key, so a
send that may have reached it (any 5xx, a time-out or a dropped connection once the
request was written, a 2xx without a readable id) is ambiguous and never resent blindly:
every send carries the attempt key as the user variable ``v:attempt_key``, which Mailgun
hands back in each event and webhook, and ``lookup`` lists the recipient's events since
the send and finds the one that names it. Only what provably created nothing is
transient: a refused connection, a DNS or TLS failure before the request was written, a
429.

Mailgun's events are eventually consistent: its event-polling guide says a page is only
to be trusted once its events are older than a threshold ("e.g. half an hour"), as events
reach its storage by different routes. ``lookup_settle`` defaults to that half hour, so a
lookup that finds nothing is believed only after it (a found message is believed at once).

A send comes from the notice's policy's sender when it names one (``from`` with its
display name, ``h:Reply-To``), else from ``[mailgun] from``; either must be allowed to
send on the configured domain. Tracking is off for every send (``o:tracking``,
``o:tracking-clicks`` and ``o:tracking-opens`` all ``no``): click tracking would rewrite
the reset link through Mailgun's redirector, and an open says nothing the machine reads.
The user variable is visible in the delivered message's X-Mailgun-Variables header; it
names the attempt (an opaque notice id), never the person.

Nothing this module raises or logs holds the address, the body, the link or a key:
Mailgun's error messages often quote the address, so only the HTTP status is passed on,
and httpx's request line for an events read loses its query string.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

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
    mailbox,
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
    https_or_loopback_url,
    lookup_settle,
    required_str,
    timeout_seconds,
)

LOGGER = logging.getLogger("resetctl.transports.mailgun")
#: Its calls' failures, as this module raises and logs them.
_CALLS = ProviderCalls("mailgun", LOGGER)

DEFAULT_BASE_URL = "https://api.mailgun.net"
#: The base URL of a domain in Mailgun's EU region.
EU_BASE_URL = "https://api.eu.mailgun.net"
API_KEY_VARIABLE = "MAILGUN_API_KEY"
SIGNING_KEY_VARIABLE = "MAILGUN_WEBHOOK_SIGNING_KEY"
#: The user variable every send carries: the attempt key, handed back in events and webhooks.
ATTEMPT_VARIABLE = "attempt_key"

#: Mailgun's own threshold for trusting an events page ("e.g. half an hour").
DEFAULT_LOOKUP_SETTLE = 1800.0
#: Events one read asks for: the Events API's documented maximum.
EVENTS_LIMIT = 300
#: How far an event's timestamp (Mailgun's clock) may sit before ``since`` (ours).
CLOCK_SKEW = 60.0
#: How old a webhook's signed timestamp may be. Mailgun warns its webhooks can be
#: delayed, but its signature covers only the timestamp and token, not the event, so
#: this window is how long a captured signature could be replayed under another body;
#: the token's keyed identity makes it count once. A report arriving later is not lost:
#: status reads see the same event.
WEBHOOK_MAX_AGE = 900.0
#: How far a webhook's timestamp may run ahead of our clock (clock skew, no more).
WEBHOOK_MAX_AHEAD = 60.0
#: The dedupe identity of a webhook: this prefix and a keyed digest of its signed part.
CALLBACK_IDENTITY_PREFIX = "mailgun:sig:"
#: A message id or attempt key longer than this is not one (the event data is unsigned).
_MAX_ID = 255

# Mailgun's delivery events (a failure by its severity) -> normalized status.
#   accepted          pending    Mailgun queued it; not yet handed to the recipient's server
#   delivered         delivered  the recipient's server took it
#   failed/temporary  pending    the recipient's server deferred it; Mailgun keeps retrying
#   failed/permanent  failed     a bounce, a suppressed address or retries spent: dropped
#   failed            unknown    a failure without a severity to read
#   rejected          failed     Mailgun refused to send it
# Opened, clicked, unsubscribed, complained and stored are not delivery statuses:
# status reads skip them and their webhooks are no report. Anything else is unknown.
_NORMALIZED: Mapping[str, Status] = {
    "accepted": Status.PENDING,
    "delivered": Status.DELIVERED,
    "failed/temporary": Status.PENDING,
    "failed/permanent": Status.FAILED,
    "failed": Status.UNKNOWN,
    "rejected": Status.FAILED,
}
MAILGUN_STATUSES = frozenset(_NORMALIZED)
#: The event types that say how delivery went; ``failed`` is read with its severity.
_DELIVERY_EVENTS = frozenset({"accepted", "delivered", "failed", "rejected"})
#: Documented event types that say nothing about delivery: no report.
_OTHER_EVENTS = frozenset(
    {
        "opened",
        "clicked",
        "unsubscribed",
        "complained",
        "stored",
        "email_validation",
        "list_member_uploaded",
        "list_member_upload_error",
        "list_uploaded",
    }
)
# Between two events at the same instant, the one that ends delivery wins.
_RANK = {"accepted": 0, "failed/temporary": 1, "failed": 1, "delivered": 2}
# What the send reply stands for: Mailgun "accepted the request ... placed in queue".
_SUBMITTED = "accepted"

#: The Events API path: a lookup's query string holds the recipient's address.
_EVENTS_PATH = re.compile(r"/v3/[^/]+/events")
_DOMAIN = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)+")
_HEX_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")
_MESSAGE_ID = re.compile(r"[!-;=?-~]+@[A-Za-z0-9.-]+")

redact_queries(lambda path: _EVENTS_PATH.fullmatch(path) is not None)  # its query holds the address


def normalize(raw: str) -> Status:
    """Mailgun's delivery event (a failure as ``failed/<severity>``) as the machine's
    vocabulary; any other word is unknown."""
    return _NORMALIZED.get(raw, Status.UNKNOWN)


#: Mailgun's delivery events and their mapping; what is recorded of one is its evidence.
VOCABULARY = StatusVocabulary("mailgun", MAILGUN_STATUSES, normalize)


class MailgunRefused(PermanentError):
    """Mailgun refused the request for good; carries its HTTP status (its message, which
    may quote the address, is never kept)."""

    def __init__(self, http_status: int) -> None:
        self.http_status = http_status
        meaning = {
            400: "the request is invalid (an address, a missing field)",
            401: "authentication failed (check MAILGUN_API_KEY)",
            403: "the domain may not send (disabled, unverified or not allowed)",
            404: "no such domain in this region (check domain and base_url)",
            413: "the message is too large",
        }.get(http_status, "refused")
        super().__init__(f"mailgun refused it (HTTP {http_status}: {meaning})")


def event_word(event: Mapping[str, Any]) -> str | None:
    """The raw status an event stands for, as Mailgun spelt it (``failed/permanent`` for
    a failure with its severity); None when it has no event type."""
    kind = event.get("event")
    if not isinstance(kind, str) or not kind:
        return None
    severity = event.get("severity")
    if kind == "failed" and severity in ("permanent", "temporary"):
        return f"failed/{severity}"
    return kind


def _timestamp(event: Mapping[str, Any]) -> float:
    value = event.get("timestamp")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return -math.inf  # unreadable times sort first
    return float(value)


def latest_delivery(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The raw status of the latest delivery event among ``events``, as evidence; None
    when there is none. Mailgun does not promise its events in order, so by timestamp."""
    decisive = [
        (_timestamp(event), _RANK.get(word, 3), index, word)
        for index, event in enumerate(events)
        if event.get("event") in _DELIVERY_EVENTS and (word := event_word(event)) is not None
    ]
    return VOCABULARY.evidence(max(decisive)[3]) if decisive else None


def bare_message_id(value: object) -> str | None:
    """A Mailgun message id without its angle brackets (as events and webhooks carry
    it), or None when ``value`` is not one."""
    if not isinstance(value, str):
        return None
    bare = value.strip()
    if bare.startswith("<") and bare.endswith(">"):
        bare = bare[1:-1]
    return bare if len(bare) <= _MAX_ID and _MESSAGE_ID.fullmatch(bare) else None


def _message_id_of(event: Mapping[str, Any]) -> str | None:
    message = event.get("message")
    headers = message.get("headers") if isinstance(message, dict) else None
    return bare_message_id(headers.get("message-id")) if isinstance(headers, dict) else None


def _attempt_of(event: Mapping[str, Any]) -> str | None:
    variables = event.get("user-variables")
    key = variables.get(ATTEMPT_VARIABLE) if isinstance(variables, dict) else None
    return key if isinstance(key, str) and key and len(key) <= _MAX_ID else None


def _address(mailbox_text: object) -> str:
    """The address of a From value, case-folded ("" when unreadable)."""
    if not isinstance(mailbox_text, str):
        return ""
    return email.utils.parseaddr(mailbox_text)[1].casefold()


class MailgunTransport:
    """Mailgun's Messages API for sends, its Events API for status reads and lookups."""

    name = "mailgun"
    #: POST /messages takes no idempotency key: a second submit sends a second email
    recovers_by_key = False
    #: the longest one call can take (set from the time-outs)
    call_timeout: float
    #: seconds before a not-found lookup is believed, and between two of them
    lookup_settle: float

    def __init__(
        self,
        *,
        api_key: str,
        domain: str,
        sender: str,
        clock: Callable[[], float],
        base_url: str = DEFAULT_BASE_URL,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        lookup_settle: float = DEFAULT_LOOKUP_SETTLE,
    ) -> None:
        self._sender = sender
        self._clock = clock
        self._base_url = base_url.rstrip("/")
        self._domain_path = f"/v3/{quote(domain, safe='')}"
        self.lookup_settle = lookup_settle
        self.call_timeout = http_call_timeout(self._base_url, connect_timeout, read_timeout)
        self._client = json_client(
            self._base_url,
            auth=httpx.BasicAuth("api", api_key),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )

    def __repr__(self) -> str:
        # The client holds the API key; show only where requests go.
        return f"MailgunTransport(base_url={self._base_url!r}, path={self._domain_path!r})"

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Send the email once; raises TransientError, AmbiguousError or PermanentError."""
        if message.email is None:
            raise PermanentError(f"mailgun: {message.channel} message has no rendered email")
        fields = [
            ("from", self._from(message)),
            ("to", message.recipient),
            ("subject", message.email.subject),
            ("text", message.email.text),
            ("html", message.email.html),
            # Click tracking would send the reset link through Mailgun's redirector; the
            # per-kind switches outrank the domain's settings, so all three are set.
            ("o:tracking", "no"),
            ("o:tracking-clicks", "no"),
            ("o:tracking-opens", "no"),
            (f"v:{ATTEMPT_VARIABLE}", attempt_key),
        ]
        if message.sender.email_reply_to is not None:
            fields.append(("h:Reply-To", message.sender.email_reply_to))
        # (None, value): a plain form field in the documented multipart/form-data body.
        parts = [(name, (None, value.encode("utf-8"))) for name, value in fields if value]
        response = _CALLS.create(
            lambda: self._client.post(f"{self._domain_path}/messages", files=parts),
            unreachable="could not reach Mailgun",
        )
        status = response.status_code
        if 200 <= status < 300:
            message_id = bare_message_id((json_object(response) or {}).get("id"))
            if message_id is None:
                # A 2xx means Mailgun has the message even if we cannot read its id.
                raise AmbiguousError(f"mailgun: HTTP {status} reply without a message id")
            LOGGER.debug("mailgun submit %s: %s", attempt_key, message_id)
            return ProviderStatus(message_id, _SUBMITTED, normalize(_SUBMITTED))
        if status == 429:
            # Refused unread: nothing was created, and the lane backs off as asked.
            raise ThrottledError(
                "mailgun: HTTP 429; slowing down", retry_after(response.headers, time.time())
            )
        if status >= 500:
            # Mailgun, or a gateway in front of it, may have queued it before failing.
            raise AmbiguousError(f"mailgun: HTTP {status} to a send; it may exist")
        if 400 <= status < 500:
            raise MailgunRefused(status)
        # A redirect or an informational status: the request was read, its fate unknown.
        raise AmbiguousError(f"mailgun: unexpected HTTP {status} to a send")

    def status(self, message_id: str) -> ProviderStatus:
        """The message's latest delivery event; a failed read (or one that lists none
        yet, as events trail sends) is a TransientError."""
        bare = bare_message_id(message_id) or message_id
        events = self._events(
            {
                "message-id": bare,
                # Newest first from a little past our now, so Mailgun's clock running
                # ahead of ours hides nothing.
                "begin": str(math.ceil(self._clock() + CLOCK_SKEW)),
                "ascending": "no",
                "limit": str(EVENTS_LIMIT),
            },
            "status read",
        )
        raw = latest_delivery(e for e in events if _message_id_of(e) == bare)
        if raw is None:
            raise TransientError("mailgun: no delivery event listed for the message yet")
        LOGGER.debug("mailgun status %s: %s", bare, raw)
        return ProviderStatus(bare, raw, normalize(raw))

    def _from(self, message: Message) -> str:
        """The From of a send: the policy's mailbox when it names one, else ours."""
        sender = message.sender
        if sender.email_from is None:
            return self._sender
        return mailbox(sender.email_from, sender.email_from_name)

    def fingerprint(self, message: Message) -> Mapping[str, str]:
        """The sender this send names, a digest of its text body, and the user variable
        that names the attempt (Mailgun's events carry no body to compare)."""
        sent = {
            "from": self._from(message),
            "body_sha256": body_digest("" if message.email is None else message.email.text),
            "marker": f"user-variables.{ATTEMPT_VARIABLE}",
        }
        if message.sender.email_reply_to is not None:
            sent["reply_to"] = message.sender.email_reply_to
        return sent

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        """The message sent under ``attempt_key``, or None when Mailgun lists none.

        Mailgun's API reference documents no filter on user variables, so this lists the
        recipient's events since ``since`` (less CLOCK_SKEW), oldest first, and keeps the
        delivery events whose ``attempt_key`` user variable is ours and whose From has the
        address the send named (recorded in ``sent``, whatever is configured today). Its
        status is the latest of those events. Raises TransientError when the read fails,
        or when a full page without ours cannot prove it absent.
        """
        events = self._events(
            {
                "recipient": recipient,
                "begin": str(math.floor(since - CLOCK_SKEW)),
                "ascending": "yes",
                "limit": str(EVENTS_LIMIT),
            },
            "lookup",
        )
        wanted = _address(sent.get("from"))
        ours: dict[str, list[Mapping[str, Any]]] = {}
        for event in events:
            message_id = _message_id_of(event)
            if (
                message_id is None
                or event.get("event") not in _DELIVERY_EVENTS
                or _attempt_of(event) != attempt_key
                or str(event.get("recipient", "")).casefold() != recipient.casefold()
            ):
                continue
            headers = event.get("message", {}).get("headers", {})
            listed = _address(headers.get("from"))
            if wanted and listed and listed != wanted:
                continue  # another sender's message under this key is not ours
            ours.setdefault(message_id, []).append(event)
        for message_id, found in ours.items():
            raw = latest_delivery(found) or _SUBMITTED
            LOGGER.debug("mailgun lookup %s: found %s %s", attempt_key, message_id, raw)
            return ProviderStatus(message_id, raw, normalize(raw))
        if len(events) >= EVENTS_LIMIT:
            # A full page, and ours was not on it: it may be on the next one.
            raise TransientError("mailgun: lookup found more events than one page holds")
        LOGGER.debug("mailgun lookup %s: not found in %d events", attempt_key, len(events))
        return None

    def _events(self, params: Mapping[str, str], what: str) -> list[Mapping[str, Any]]:
        """One page of the Events API; TransientError for any failed read."""
        response = _CALLS.read(
            lambda: self._client.get(f"{self._domain_path}/events", params=params),
            what=f"{what} failed",
        )
        status = response.status_code
        if status == 429:
            raise ThrottledError(
                f"mailgun: {what} got HTTP 429", retry_after(response.headers, time.time())
            )
        if status != 200:
            raise TransientError(f"mailgun: {what} got HTTP {status}")
        items = (json_object(response) or {}).get("items")
        if not isinstance(items, list):
            raise TransientError(f"mailgun: {what} got a reply without an event list")
        return [item for item in items if isinstance(item, dict)]

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()


def webhook_signature(timestamp: str, token: str, signing_key: str) -> str:
    """Mailgun's webhook signature: hex HMAC-SHA256 of timestamp then token, keyed with
    the webhook signing key."""
    signed = (timestamp + token).encode("utf-8")
    return hmac.new(signing_key.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def callback_identity(timestamp: str, token: str, signing_key: str) -> str:
    """The dedupe identity of a verified webhook: ``mailgun:sig:`` and a keyed digest of
    exactly what its signature covers.

    The event data is not signed, so only the token (random, fifty characters, one per
    signature) and the timestamp may decide what is a replay: every body sent under one
    signature, a reworded one included, is stored once. Keyed, and distinct from the
    signature itself, so the database holds nothing that verifies a request.
    """
    payload = b"resetctl-dedupe\x00" + (timestamp + token).encode("utf-8")
    digest = hmac.new(signing_key.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    return f"{CALLBACK_IDENTITY_PREFIX}{digest}"


def _signed_part(body: Mapping[str, Any]) -> tuple[str, str, list[str]]:
    """(timestamp, token, signatures) of a webhook's ``signature`` object, or
    SignatureMismatch: a request without one is unsigned."""
    block = body.get("signature")
    if not isinstance(block, dict):
        raise SignatureMismatch(["signature: missing; nothing recorded"])
    timestamp, token = block.get("timestamp"), block.get("token")
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        timestamp = str(timestamp)
    signatures = [
        value.lower()  # hex: the same signature in either case
        for value in (block.get("signature"), block.get("parent-signature"))
        if isinstance(value, str) and _HEX_SIGNATURE.fullmatch(value)
    ]
    if (
        not isinstance(timestamp, str)
        or not timestamp.isascii()
        or not timestamp.isdigit()
        or not isinstance(token, str)
        or not token
        or not signatures
    ):
        raise SignatureMismatch(["signature: malformed; nothing recorded"])
    return timestamp, token, signatures


class MailgunCallbacks:
    """Mailgun's webhooks for one instance: verified with its webhook signing key."""

    #: Mailgun posts its webhooks as JSON
    media_types = frozenset({"application/json"})

    def __init__(
        self, signing_key: str | None, public_url: str | None = None, where: str = "mailgun"
    ) -> None:
        self._key = signing_key or ""
        self._where = where
        #: the URL configured as the domain's webhook (``webhook_url``), or None
        self.public_url = public_url

    def __repr__(self) -> str:
        return f"MailgunCallbacks(public_url={self.public_url!r})"

    def check(self) -> None:
        """ConfigError when the webhook signing key is not set."""
        if not self._key:
            raise ConfigError(
                f"{self._where}: {SIGNING_KEY_VARIABLE} is not set (set the environment"
                f" variable, or name a credentials_file in [{self._where}])"
            )

    def read(self, request: CallbackRequest, now: float) -> Sequence[CallbackReport]:
        """The delivery report a verified webhook carries (none for an open or a click).

        SignatureMismatch for an unsigned or forged one, or one whose timestamp is more
        than WEBHOOK_MAX_AGE old (or WEBHOOK_MAX_AHEAD ahead); MalformedCallback for a
        body that is not a webhook. Neither message quotes the request.
        """
        self.check()
        try:
            body = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            raise MalformedCallback(["body: not a JSON object; nothing recorded"])
        timestamp, token, signatures = _signed_part(body)
        expected = webhook_signature(timestamp, token, self._key).encode("ascii")
        # Constant time, so the comparison does not leak how much of a forgery was right;
        # parent-signature is how a subaccount's webhook is signed by its primary account.
        if not any(hmac.compare_digest(expected, s.encode("ascii")) for s in signatures):
            raise SignatureMismatch(["signature: does not match; nothing recorded"])
        age = now - int(timestamp)
        if age > WEBHOOK_MAX_AGE or -age > WEBHOOK_MAX_AHEAD:
            raise SignatureMismatch(["signature: timestamp too far from now; nothing recorded"])
        event = body.get("event-data")
        word = event_word(event) if isinstance(event, dict) else None
        if not isinstance(event, dict) or word is None:
            raise MalformedCallback(["event-data: missing or without an event; nothing recorded"])
        if event.get("event") in _OTHER_EVENTS:
            return []
        message_id, attempt = _message_id_of(event), _attempt_of(event)
        if message_id is None and attempt is None:
            raise MalformedCallback(
                ["event-data: names neither a message id nor an attempt; nothing recorded"]
            )
        evidence, status = VOCABULARY.reading(word)
        identity = callback_identity(timestamp, token, self._key)
        return [CallbackReport(message_id, attempt, evidence, status, identity)]


def _webhook_url(context: TransportContext) -> str | None:
    """``webhook_url`` when set: https (http only for a loopback host), since Mailgun
    posts the address in each webhook to it."""
    if "webhook_url" not in context.options:
        return None
    url = required_str(context, "webhook_url", "a URL")
    https_or_loopback_url(context, "webhook_url", url)
    return url


_OPTIONS = {
    "base_url",
    "domain",
    "from",
    "connect_timeout",
    "read_timeout",
    "lookup_settle",
    "webhook_url",
}


def _create(context: TransportContext) -> Transport:
    context.reject_unknown(_OPTIONS)
    base_url = context.option("base_url", DEFAULT_BASE_URL, str)
    # The API key travels with every request: https, http only for a loopback host.
    https_or_loopback_url(context, "base_url", base_url)
    domain = required_str(context, "domain", "the Mailgun sending domain")
    if not _DOMAIN.fullmatch(domain):
        raise ConfigError(f"{context.table}.domain: expected a domain name (mg.example.com)")
    sender = required_str(context, "from", "a sender Mailgun may send as on the domain")
    connect_timeout = timeout_seconds(context, "connect_timeout", 5.0)
    read_timeout = timeout_seconds(context, "read_timeout", 10.0)
    settle = lookup_settle(context, DEFAULT_LOOKUP_SETTLE)
    _webhook_url(context)
    # Secrets last: a sweep with a missing key fails here, before it claims anything.
    api_key = context.require_secret(API_KEY_VARIABLE)
    # A header value must be printable ASCII; say so here rather than on every send.
    if not (api_key.isascii() and api_key.isprintable()) or api_key != api_key.strip():
        raise ConfigError(f"{context.table}: {API_KEY_VARIABLE} is not a valid API key")
    return MailgunTransport(
        api_key=api_key,
        domain=domain,
        sender=sender,
        clock=context.clock,
        base_url=base_url,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        lookup_settle=settle,
    )


def _callbacks(context: TransportContext) -> CallbackReader:
    """The reader of an instance's webhooks: needs only the webhook signing key."""
    context.reject_unknown(_OPTIONS)
    public_url = _webhook_url(context)
    return MailgunCallbacks(context.secret(SIGNING_KEY_VARIABLE), public_url, context.table)


PLUGIN = TransportPlugin(
    name="mailgun",
    channels=frozenset({"email"}),
    create=_create,
    vocabulary=VOCABULARY,
    callbacks=_callbacks,
)
