"""The sweep's provider calls, one at a time, in whichever thread runs them: render the
message, submit it, read a status (or many), look a doubtful submission up.

Nothing here touches the database or the machine: a call returns what happened and
when, and the sweep folds that into its notice and writes it. Nothing here lets a
secret out either: a plugin's error text is redacted before anyone logs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from resetctl.config import Policy, Settings
from resetctl.machine import NoticeState
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
    BatchStatusTransport,
    LookupTransport,
    Message,
    ProviderStatus,
    Transport,
    call_timeout,
    supports_lookup,
)


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
    """The message a submission on ``channel`` sends at ``now``."""
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
            message = Message(channel, state.notice_id, recipient, state.expires_at, email=email)
            return Rendered(message, None, email.locale, None)
        sms = render_sms(model, version, policy.sms_max_segments, root)
    except SmsTooLong as exc:
        return Rendered(None, exc.segments, None, f"permanent: {exc}")
    except TemplateError as exc:
        return Rendered(None, None, None, f"permanent: {exc}")
    message = Message(channel, state.notice_id, recipient, state.expires_at, sms=sms)
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


Clock = Callable[[], float]


def submit(transport: Transport, message: Message, attempt_key: str, clock: Clock) -> CallResult:
    """Hand ``message`` to the provider under its stable attempt key."""
    try:
        reply = transport.submit(message, attempt_key)
    except Exception as exc:
        return CallResult(clock(), error=exc)
    return CallResult(clock(), reply=reply)


def read_status(transport: Transport, message_id: str, clock: Clock) -> CallResult:
    """Read one message's status."""
    try:
        reply = transport.status(message_id)
    except Exception as exc:
        return CallResult(clock(), error=exc)
    return CallResult(clock(), reply=reply)


def read_statuses(transport: Transport, message_ids: Sequence[str], clock: Clock) -> CallResult:
    """Read many messages' statuses in one call (a transport that reads in batches)."""
    reader: BatchStatusTransport = transport  # type: ignore[assignment]
    try:
        found = reader.statuses(message_ids)
    except Exception as exc:
        return CallResult(clock(), error=exc)
    return CallResult(clock(), statuses=found)


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
    try:
        found = looker.lookup(recipient, attempt_key, since, sent)
    except Exception as exc:
        return CallResult(clock(), error=exc)
    return CallResult(clock(), reply=found)


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


def redact(text: str, contact: Contact | None) -> str:
    """``text`` with the notice's contact data and URL taken out."""
    if contact is None:
        return text
    for secret in (contact.reset_url, contact.email, contact.phone, contact.display_name):
        if secret:
            text = text.replace(secret, "<redacted>")
    if contact.phone:
        text = text.replace(contact.phone.lstrip("+"), "<redacted>")
    return text


def recipient_of(contact: Contact | None, channel: str) -> str | None:
    """The address or number a channel sends to."""
    if contact is None:
        return None
    return contact.email if channel == "email" else contact.phone
