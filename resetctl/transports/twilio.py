"""Twilio SMS: create a Message resource, read its status, verify status callbacks.

Twilio's create call has no idempotency key, so a submission that may have reached
Twilio is reported as ambiguous and never resent. Nothing this module raises or logs
holds the phone number, the SMS body or the auth token: Twilio's own error messages
often quote the To number, so only its numeric code is passed on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import httpx

from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.transports.base import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    TransientError,
    Transport,
    TransportContext,
    TransportPlugin,
)

LOGGER = logging.getLogger("resetctl.transports.twilio")

API_VERSION = "2010-04-01"
DEFAULT_BASE_URL = "https://api.twilio.com"

#: Twilio's documented ValidityPeriod range in seconds (its default is the maximum, 10 h).
VALIDITY_PERIOD_MIN = 1
VALIDITY_PERIOD_MAX = 36_000

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

#: Failures before the request could leave this host: nothing reached Twilio.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)


def normalize(raw: str) -> Status:
    """Twilio's raw Message status as the machine's vocabulary; unknown words are unknown."""
    return _STATUS_MAP.get(raw, Status.UNKNOWN)


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
        self._account_path = f"/{API_VERSION}/Accounts/{quote(account_sid, safe='')}"
        self._client = httpx.Client(
            base_url=self._base_url,
            auth=httpx.BasicAuth(account_sid, auth_token),
            timeout=httpx.Timeout(
                connect=connect_timeout,
                read=read_timeout,
                write=read_timeout,
                pool=connect_timeout,
            ),
            headers={"Accept": "application/json", "User-Agent": "resetctl"},
            follow_redirects=False,
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
        if self._sender is not None:
            form["From"] = self._sender
        if self._service is not None:
            form["MessagingServiceSid"] = self._service
        if self._status_callback is not None:
            form["StatusCallback"] = self._status_callback
        try:
            response = self._client.post(f"{self._account_path}/Messages.json", data=form)
        except _NOT_SENT as exc:
            _raise_transport(exc, "could not reach Twilio", ambiguous=False)
        except httpx.HTTPError as exc:
            # The request may have been read and acted on before the reply was lost.
            _raise_transport(exc, "no reply after sending", ambiguous=True)
        sid, raw = _resource(response, ambiguous=True)
        LOGGER.debug("twilio submit %s: %s %s (validity %ss)", attempt_key, sid, raw, validity)
        return ProviderStatus(sid, raw, normalize(raw))

    def status(self, message_id: str) -> ProviderStatus:
        """Fetch the Message and normalize its status; a failed read is safe to repeat."""
        path = f"{self._account_path}/Messages/{quote(message_id, safe='')}.json"
        try:
            response = self._client.get(path)
        except httpx.HTTPError as exc:
            _raise_transport(exc, "status read failed", ambiguous=False)
        sid, raw = _resource(response, ambiguous=False)
        LOGGER.debug("twilio status %s: %s", sid, raw)
        return ProviderStatus(message_id, raw, normalize(raw))

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()


def _raise_transport(exc: httpx.HTTPError, what: str, *, ambiguous: bool) -> NoReturn:
    # Only the exception's class: its text and request are not needed to act on it.
    error = AmbiguousError if ambiguous else TransientError
    LOGGER.debug("twilio: %s (%s)", what, type(exc).__name__)
    raise error(f"twilio: {what} ({type(exc).__name__})") from None


def _error_code(response: httpx.Response) -> int | None:
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _resource(response: httpx.Response, *, ambiguous: bool) -> tuple[str, str]:
    """The (sid, status) of a Message reply, or the error its HTTP status means."""
    status = response.status_code
    if status == 429 or status >= 500:
        code = _error_code(response)
        suffix = "" if code is None else f", error {code}"
        raise TransientError(f"twilio: HTTP {status}{suffix}; try again later")
    if not 200 <= status < 300:
        raise TwilioRefused(status, _error_code(response))
    try:
        body: Any = response.json()
        sid, raw = body["sid"], body["status"]
    except (ValueError, KeyError, TypeError):
        sid = raw = None
    if not isinstance(sid, str) or not sid or not isinstance(raw, str) or not raw:
        # A 2xx to a create means Twilio has the message even if we cannot read its id.
        error = AmbiguousError if ambiguous else TransientError
        raise error(f"twilio: HTTP {status} reply without a message sid and status")
    return sid, raw


def compute_signature(url: str, params: Mapping[str, str], auth_token: str) -> str:
    """Twilio's X-Twilio-Signature for a request: base64 HMAC-SHA1 of URL + sorted params."""
    payload = url + "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


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
    """(MessageSid, MessageStatus) from a status-callback form body."""
    found = []
    for field in ("MessageSid", "MessageStatus"):
        value = params.get(field)
        if not value:
            raise ValueError(f"twilio status callback: {field} is missing")
        found.append(value)
    return found[0], found[1]


def _optional_str(context: TransportContext, key: str) -> str | None:
    if key not in context.options:
        return None
    value: str = context.option(key, "", str)
    if not value.strip():
        raise ConfigError(f"{context.name}.{key}: must not be empty")
    return value


def _timeout(context: TransportContext, key: str, default: float) -> float:
    value = float(context.option(key, default, (int, float)))
    if not 0 < value <= 300:
        raise ConfigError(f"{context.name}.{key}: expected seconds in (0, 300]")
    return value


def _http_url(context: TransportContext, key: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{context.name}.{key}: expected an http(s) URL")
    return value


def _create(context: TransportContext) -> Transport:
    context.reject_unknown(
        {
            "base_url",
            "from",
            "messaging_service_sid",
            "status_callback",
            "connect_timeout",
            "read_timeout",
        }
    )
    base_url = _http_url(context, "base_url", context.option("base_url", DEFAULT_BASE_URL, str))
    sender = _optional_str(context, "from")
    service = _optional_str(context, "messaging_service_sid")
    if (sender is None) == (service is None):
        raise ConfigError(f"{context.name}.from: set exactly one of from or messaging_service_sid")
    if service is not None and not _SERVICE_SID.fullmatch(service):
        raise ConfigError(f"{context.name}.messaging_service_sid: expected MG and 32 hex digits")
    callback = _optional_str(context, "status_callback")
    if callback is not None:
        _http_url(context, "status_callback", callback)
    connect_timeout = _timeout(context, "connect_timeout", 5.0)
    read_timeout = _timeout(context, "read_timeout", 10.0)
    # Secrets last: a sweep with missing credentials fails here, before it claims anything.
    account_sid = context.require_secret("TWILIO_ACCOUNT_SID")
    auth_token = context.require_secret("TWILIO_AUTH_TOKEN")
    if not _ACCOUNT_SID.fullmatch(account_sid):
        raise ConfigError(f"{context.name}: TWILIO_ACCOUNT_SID is not AC and 32 hex digits")
    return TwilioTransport(
        account_sid,
        auth_token,
        sender=sender,
        messaging_service_sid=service,
        status_callback=callback,
        base_url=base_url,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        clock=context.clock,
    )


PLUGIN = TransportPlugin(
    name="twilio",
    channels=frozenset({"sms"}),
    create=_create,
    vocabulary=StatusVocabulary("twilio", TWILIO_STATUSES, normalize),
)
