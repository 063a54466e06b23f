"""The sweep's provider calls, one at a time, in whichever thread runs them: render the
message, submit it, read a status (or many), look a doubtful submission up.

Nothing here touches the database or the machine: a call returns what happened and
when, and the sweep folds that into its notice and writes it. Nothing here lets a
secret out either. A third-party (plugin) transport's error keeps its kind and its
class, never its text: a plugin's message may quote what it was given in any encoding
(percent- or plus-encoded, upper-cased, a number re-punctuated, base64 …), and no list
of encodings is ever complete. A built-in transport's messages are written never to
quote a secret; ``redact`` still withholds one that quotes the notice's contact data in
any form it can read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, unquote_plus

from resetctl.config import Settings
from resetctl.lanes import Lane
from resetctl.machine import NoticeState
from resetctl.policy import Policy
from resetctl.render import (
    RenderModel,
    SmsTooLong,
    TemplateError,
    configured_root,
    minutes_until_expiry,
    render_email,
    render_sms,
)
from resetctl.store import Contact
from resetctl.transports.base import (
    AmbiguousError,
    BatchStatusTransport,
    LookupTransport,
    Message,
    PermanentError,
    ProviderStatus,
    ThrottledError,
    TransientError,
    Transport,
    TransportError,
    call_timeout,
    supports_lookup,
)

#: What a message that quoted contact data is replaced by, whole.
WITHHELD = "<redacted: the message quoted contact data>"
#: The modules of the built-in transports: their error messages are resetctl's own.
_BUILT_IN_PREFIX = "resetctl.transports."
_BY_KIND: Mapping[object, type[TransportError]] = {
    "transient": TransientError,
    "ambiguous": AmbiguousError,
    "permanent": PermanentError,
}
# A run of digits as a number is written: digits with spaces, dots, dashes, slashes or
# parentheses between them (a plus or %20 reads as a space once decoded).
_DIGIT_RUN = re.compile(r"\d[\d\s().\-/]*\d")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, slots=True)
class Rendered:
    """What one submission will send, or why it cannot."""

    #: the message, when it rendered
    message: Message | None
    #: SMS segments (an SMS that rendered, or one too long to send)
    segments: int | None
    #: the template locale directory rendered
    locale: str | None
    #: why nothing can be sent ("permanent: …"), or None
    error: str | None


def render(
    settings: Settings,
    policy: Policy,
    state: NoticeState,
    locale: str | None,
    contact: Contact | None,
    channel: str,
    now: float,
) -> Rendered:
    """The message a submission on ``channel`` sends at ``now``, from the sender of the
    notice's stored policy (resolved with its version at enqueue, so a later change of
    config never changes who a notice in flight comes from)."""
    recipient = recipient_of(contact, channel)
    if contact is None or recipient is None:
        return Rendered(None, None, None, "permanent: no contact data for this channel")
    model = RenderModel(
        reset_url=contact.reset_url,
        minutes_until_expiry=minutes_until_expiry(state.expires_at, now),
        support_label=settings.support_label,
        display_name=contact.display_name,
        locale=locale,
    )
    version = policy.template_version
    root = configured_root(settings.templates_dir)
    try:
        if channel == "email":
            email = render_email(model, version, root)
            message = Message(
                channel,
                state.notice_id,
                recipient,
                state.expires_at,
                email=email,
                sender=policy.sender,
            )
            return Rendered(message, None, email.locale, None)
        sms = render_sms(model, version, policy.sms_max_segments, root)
    except SmsTooLong as exc:
        return Rendered(None, exc.segments, None, f"permanent: {exc}")
    except TemplateError as exc:
        return Rendered(None, None, None, f"permanent: {exc}")
    message = Message(
        channel, state.notice_id, recipient, state.expires_at, sms=sms, sender=policy.sender
    )
    return Rendered(message, sms.segments, sms.locale, None)


@dataclass(frozen=True, slots=True)
class CallResult:
    """How one provider call ended, and when."""

    #: when the call returned (the sweep's clock)
    ended_at: float
    #: the provider's answer: the message taken, its status, or what a lookup found
    #: (None from a lookup: no such message)
    reply: ProviderStatus | None = None
    #: a batch read's answers by message id
    statuses: Mapping[str, ProviderStatus] | None = None
    #: what the call raised instead (a TransportError, or a transport's own bug)
    error: Exception | None = None
    #: when the call started (the same clock; None when no call was made): its span's
    #: provider-call duration
    started_at: float | None = None


Clock = Callable[[], float]


def submit(transport: Transport, message: Message, attempt_key: str, clock: Clock) -> CallResult:
    """Hand ``message`` to the provider under its stable attempt key."""
    started = clock()
    try:
        reply = transport.submit(message, attempt_key)
    except Exception as exc:
        return CallResult(clock(), error=kept_error(transport, exc), started_at=started)
    return CallResult(clock(), reply=reply, started_at=started)


def read_status(transport: Transport, message_id: str, clock: Clock) -> CallResult:
    """Read one message's status."""
    started = clock()
    try:
        reply = transport.status(message_id)
    except Exception as exc:
        return CallResult(clock(), error=kept_error(transport, exc), started_at=started)
    return CallResult(clock(), reply=reply, started_at=started)


def read_statuses(transport: Transport, message_ids: Sequence[str], clock: Clock) -> CallResult:
    """Read many messages' statuses in one call (a transport that reads in batches)."""
    reader: BatchStatusTransport = transport  # type: ignore[assignment]
    started = clock()
    try:
        found = reader.statuses(message_ids)
    except Exception as exc:
        return CallResult(clock(), error=kept_error(transport, exc), started_at=started)
    return CallResult(clock(), statuses=found, started_at=started)


def look_up(
    transport: Transport,
    recipient: str,
    attempt_key: str,
    since: float,
    sent: Mapping[str, str],
    clock: Clock,
) -> CallResult:
    """Ask the provider for the message a doubtful submission may have created, matched
    by what was recorded as sent."""
    looker: LookupTransport = transport  # type: ignore[assignment]
    started = clock()
    try:
        found = looker.lookup(recipient, attempt_key, since, sent)
    except Exception as exc:
        return CallResult(clock(), error=kept_error(transport, exc), started_at=started)
    return CallResult(clock(), reply=found, started_at=started)


def lookup_settle(transport: Transport) -> float | None:
    """The transport's settle time, when it can look up what it sent."""
    return float(transport.lookup_settle) if supports_lookup(transport) else None  # type: ignore[attr-defined]


def fingerprint(transport: Transport, message: Message | None) -> str | None:
    """What a lookup needs to recognise ``message`` later, as JSON (None when the
    transport cannot look up, or nothing was rendered)."""
    if message is None or not supports_lookup(transport):
        return None
    looker: LookupTransport = transport  # type: ignore[assignment]
    return json.dumps(dict(looker.fingerprint(message)), sort_keys=True)


def runs_in_place(transport: Transport) -> bool:
    """True for a transport whose calls wait on nothing (the embedded outbox: a local
    write): the sweep makes them on its own thread, with no pool hand-off."""
    return call_timeout(transport) == 0


def built_in(transport: Transport) -> bool:
    """True for a transport that ships with resetctl (its messages are resetctl's own)."""
    return type(transport).__module__.startswith(_BUILT_IN_PREFIX)


def kept_error(transport: Transport, exc: Exception) -> Exception:
    """What a failed call carries on: a built-in transport's error as raised; a plugin's
    TransportError as a new one of the same kind whose message names only the class.

    A plugin's kind outside the three becomes ambiguous (it may have sent), and a
    throttle keeps a ``retry_after`` that is a finite number of seconds. Any other
    exception is only ever shown by its class name.
    """
    if built_in(transport) or not isinstance(exc, TransportError):
        return exc
    # Class names, not the transport's own `name`: a plugin may call itself anything.
    detail = (
        f"{_class_name(transport)} raised {_class_name(exc)} (a plugin transport's message"
        " is not kept)"
    )
    if isinstance(exc, ThrottledError):
        return ThrottledError(detail, _seconds(exc.retry_after))
    kind = exc.kind if isinstance(exc.kind, str) else None
    return _BY_KIND.get(kind, AmbiguousError)(detail)


def _class_name(value: object) -> str:
    return _NOT_NAME.sub("", type(value).__name__)[:60] or "?"


def _seconds(value: object) -> float | None:
    """A plugin's ``retry_after`` if it is a finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def redact(text: str, contact: Contact | None) -> str:
    """``text``, or WITHHELD when it quotes the notice's reset URL, address, phone number
    or display name in any form read here: any case, percent-encoded (once or twice, in
    either case of hex) or plus-encoded, the phone's digits with any separators."""
    if contact is None or not text:
        return text
    return WITHHELD if _quotes(text, contact) else text


def _quotes(text: str, contact: Contact) -> bool:
    views = {text, unquote(text), unquote_plus(text)}
    views |= {unquote(v) for v in views} | {unquote_plus(v) for v in views}
    folded = [view.casefold() for view in views]
    secrets: list[str] = []
    for secret in (contact.reset_url, contact.email, contact.display_name):
        if secret:
            secrets.append(secret)
    if contact.reset_url:
        # The link without its scheme, or only its path and query (the token).
        secrets.append(contact.reset_url.partition("://")[2])
        secrets.append(contact.reset_url.partition("://")[2].partition("/")[2])
    if contact.email:
        secrets.append(contact.email.rpartition("@")[0])
    wanted = {s.casefold() for s in secrets if len(s) >= 4}
    if any(secret in view for secret in wanted for view in folded):
        return True
    if not contact.phone:
        return False
    digits = re.sub(r"\D", "", contact.phone)
    # The number with or without its country code (one to three digits).
    numbers = {digits[cut:] for cut in range(4) if len(digits) - cut >= 7}
    runs = {re.sub(r"\D", "", run) for view in views for run in _DIGIT_RUN.findall(view)}
    return any(number in run for number in numbers for run in runs)


def recipient_of(contact: Contact | None, channel: str) -> str | None:
    """The address or number a channel sends to."""
    if contact is None:
        return None
    return contact.email if channel == "email" else contact.phone


def admitted(
    lane: Lane[Any],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    call: Callable[[], CallResult],
) -> CallResult:
    """``call``, made once ``lane``'s rate limit admits it (in the calling thread: the
    limit then counts when the provider is called, not when the call was scheduled)."""
    lane.admit(clock, sleep)
    return call()
