"""The embedded default transport: messages are stored in the database.

It behaves like a provider that dedupes by attempt key, with statuses an operator (or a
demo) scripts with ``resetctl outbox set-status``. Its raw statuses are the normalized
vocabulary itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports.base import (
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    Transport,
    TransportContext,
    TransportPlugin,
)

OUTBOX_STATUSES = tuple(s.value for s in Status)


def normalize(raw: str) -> Status:
    """Outbox raw statuses are the normalized words; anything else is unknown."""
    return Status(raw) if raw in OUTBOX_STATUSES else Status.UNKNOWN


class OutboxTransport:
    """A local mail catcher and SMS sink in the notices database."""

    name = "outbox"
    recovers_by_key = True
    #: no network call: the outbox writes to the notices database
    call_timeout = 0.0
    #: a local insert: no network wait a lease must cover
    call_timeout = 0.0

    def __init__(self, store: Store, initial_status: str, clock: Callable[[], float]) -> None:
        self._store = store
        self._initial_status = initial_status
        self._clock = clock

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Store the rendered message once per attempt key."""
        content: dict[str, Any]
        if message.email is not None:
            content = {
                "to": message.recipient,
                "subject": message.email.subject,
                "text": message.email.text,
                "html": message.email.html,
            }
        elif message.sms is not None:
            content = {
                "to": message.recipient,
                "body": message.sms.body,
                "encoding": str(message.sms.encoding),
                "segments": message.sms.segments,
            }
        else:
            raise PermanentError(f"{message.channel} message has no rendered content")
        message_id, raw = self._store.outbox_submit(
            attempt_key,
            message.notice_id,
            message.channel,
            content,
            self._initial_status,
            self._clock(),
        )
        return ProviderStatus(message_id, raw, normalize(raw))

    def close(self) -> None:
        """Nothing to release: the store belongs to the caller."""

    def status(self, message_id: str) -> ProviderStatus:
        """The message's current scripted status."""
        raw = self._store.outbox_status(message_id)
        if raw is None:
            raise PermanentError("outbox has no such message")
        return ProviderStatus(message_id, raw, normalize(raw))


def _create(context: TransportContext) -> Transport:
    # [outbox] email_status / sms_status (validated with the rest of the config) set the
    # status a new message starts with.
    context.reject_unknown({"email_status", "sms_status", "keep_content"})
    context.store.keep_outbox_content = context.option("keep_content", False, bool)
    default = "accepted" if context.channel == "email" else "delivered"
    initial = context.option(f"{context.channel}_status", default, str)
    return OutboxTransport(context.store, initial, context.clock)


PLUGIN = TransportPlugin(
    name="outbox",
    channels=frozenset({"email", "sms"}),
    create=_create,
    vocabulary=StatusVocabulary("outbox", frozenset(OUTBOX_STATUSES), normalize),
)
