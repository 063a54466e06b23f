"""The transport protocol: submit a message under a stable key, read its status.

A transport owns its provider's status vocabulary: it maps raw statuses to the
normalized ones and nothing else does. It knows nothing about phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from resetctl.machine import Status
from resetctl.render import EmailContent, SmsContent


@dataclass(frozen=True, slots=True)
class Message:
    """One rendered message for one recipient. Its repr shows no secret."""

    #: "email" or "sms"
    channel: str
    #: the notice it belongs to (opaque id)
    notice_id: str
    #: the address or E.164 number (secret)
    recipient: str = field(repr=False)
    #: absolute link expiry, so a transport can bound the provider's retries
    expires_at: float
    #: the rendered email (email channel)
    email: EmailContent | None = field(default=None, repr=False)
    #: the rendered SMS (sms channel)
    sms: SmsContent | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    """What a provider said about a message: its id, raw status and normalized status."""

    #: the provider's message id
    message_id: str
    #: the provider's own word, stored as evidence
    raw_status: str
    #: the transport's classification of it
    status: Status


class TransportError(Exception):
    """A submission or status read failed. The message never holds a secret."""

    #: "transient", "ambiguous" or "permanent"
    kind = "transient"


class TransientError(TransportError):
    """Nothing was accepted; safe to retry under the same attempt key."""

    kind = "transient"


class AmbiguousError(TransportError):
    """The provider may have accepted it: recover by key or lookup, never resend blindly."""

    kind = "ambiguous"


class PermanentError(TransportError):
    """Refused for good (bad recipient, rejected content)."""

    kind = "permanent"


class Transport(Protocol):
    """A channel's provider."""

    #: the name configured under [transport]
    name: str
    #: True when a second submit under the same attempt key returns the first message
    recovers_by_key: bool

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Hand the message to the provider; raises a TransportError subclass."""
        ...

    def status(self, message_id: str) -> ProviderStatus:
        """Read the message's current status; raises a TransportError subclass."""
        ...
