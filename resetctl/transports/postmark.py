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

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from resetctl.errors import ConfigError
from resetctl.transports.base import (
    AmbiguousError,
    CallbackReader,
    Message,
    PermanentError,
    ProviderStatus,
    ThrottledError,
    TransientError,
    Transport,
    TransportContext,
    TransportError,
    TransportPlugin,
    mailbox,
)
from resetctl.transports.http import (
    NOT_SENT,
    bounded_waits,
    http_call_timeout,
    int_field,
    json_client,
    json_object,
    redact_queries,
    retry_after,
)
from resetctl.transports.options import MAX_LOOKUP_SETTLE as MAX_LOOKUP_SETTLE
from resetctl.transports.options import http_url, lookup_settle
from resetctl.transports.postmark_words import BOUNCE_TYPE_CODES as BOUNCE_TYPE_CODES
from resetctl.transports.postmark_words import POSTMARK_STATUSES as POSTMARK_STATUSES
from resetctl.transports.postmark_words import VOCABULARY, normalize
from resetctl.transports.postmark_words import documented_spelling as documented_spelling

DEFAULT_BASE_URL = "https://api.postmarkapp.com"
CREDENTIAL_VARIABLE = "POSTMARK_SERVER_TOKEN"

#: Default seconds between the two not-found lookups that let an attempt be resent.
DEFAULT_LOOKUP_SETTLE = 30.0
#: Messages one lookup reads; the attempt_key filter leaves one, or none.
LOOKUP_COUNT = 50
#: The id of every Postmark server's default broadcast stream. A reset notice is
#: transactional: it goes on a transactional stream ("outbound", the default, or one of
#: the operator's), never where Postmark adds List-Unsubscribe and bulk handling.
BROADCAST_STREAM = "broadcast"
#: The outbound message search: its query string holds the recipient's address.
_SEARCH_PATH = "/messages/outbound"


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
# Besides the shared ones, a request httpx would not write (a bad scheme, a header it
# refuses) never left either.
_NOT_SENT: tuple[type[httpx.HTTPError], ...] = (
    *NOT_SENT,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)


redact_queries(lambda path: path == _SEARCH_PATH)  # its query holds the address


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


def _error_code(body: Mapping[str, Any] | None) -> int | None:
    """Postmark's ErrorCode in a reply, if it carries one (never its Message)."""
    return int_field(body, "ErrorCode")


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
        self._client = json_client(
            base_url.rstrip("/"),
            auth=None,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            headers={"X-Postmark-Server-Token": token},
        )
        #: each request's waits, unless a lookup's details read is given less
        self._timeout = self._client.timeout

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
        body = json_object(response)
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
        body = json_object(response)
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
        body = json_object(response)
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


def _callbacks(context: TransportContext) -> CallbackReader:
    """The reader of an instance's Bounce, Delivery and SpamComplaint webhooks."""
    from resetctl.transports.postmark_webhooks import webhooks

    return webhooks(context, _OPTIONS)


def _positive_seconds(context: TransportContext, key: str, default: float) -> float:
    value = float(context.option(key, default, (int, float)))
    if not value > 0:
        raise ConfigError(f"{context.table}.{key}: expected a positive number of seconds")
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
    http_url(context, "base_url", base_url)
    if "from" not in context.options:
        raise ConfigError(f"{context.table}.from: required (a confirmed Postmark sender signature)")
    sender = context.option("from", None, str)
    message_stream = context.option("message_stream", "outbound", str)
    for key, value in (("from", sender), ("message_stream", message_stream)):
        if not value.strip():
            raise ConfigError(f"{context.table}.{key}: must not be empty")
    if message_stream.strip().lower() == BROADCAST_STREAM:
        raise ConfigError(
            f"{context.table}.message_stream: {BROADCAST_STREAM!r} is Postmark's broadcast"
            " stream (bulk mail, with unsubscribe headers); a reset notice is transactional:"
            ' use "outbound" or a transactional stream of your own'
        )
    connect_timeout = _positive_seconds(context, "connect_timeout", 5.0)
    read_timeout = _positive_seconds(context, "read_timeout", 10.0)
    settle = lookup_settle(context, DEFAULT_LOOKUP_SETTLE)
    token = context.require_secret(CREDENTIAL_VARIABLE)
    # A header value must be printable ASCII; say so here rather than on every send.
    if not (token.isascii() and token.isprintable()) or token != token.strip():
        raise ConfigError(f"{context.table}: {CREDENTIAL_VARIABLE} is not a valid API token")
    return PostmarkTransport(
        token=token,
        sender=sender,
        base_url=base_url,
        message_stream=message_stream,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        lookup_settle=settle,
    )


PLUGIN = TransportPlugin(
    name="postmark",
    channels=frozenset({"email"}),
    create=_create,
    vocabulary=VOCABULARY,
    callbacks=_callbacks,
)
