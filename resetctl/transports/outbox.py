"""The embedded default transport: messages are stored in the database.

It behaves like a provider that dedupes by attempt key, with statuses an operator (or a
demo) scripts with ``resetctl outbox set-status``. Its raw statuses are the normalized
vocabulary itself. A stored message names the sender its policy gave it (``from``,
``reply_to``), as a mail catcher shows the headers; with none, it names none (the outbox
has no sender of its own).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from resetctl.durations import parse_duration
from resetctl.machine import Status
from resetctl.store import Store, open_store
from resetctl.transports.base import (
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    Transport,
    TransportContext,
    TransportPlugin,
    mailbox,
)

OUTBOX_STATUSES = tuple(s.value for s in Status)
_BY_WORD = {s.value: s for s in Status}


def normalize(raw: str) -> Status:
    """Outbox raw statuses are the normalized words; anything else is unknown."""
    return _BY_WORD.get(raw, Status.UNKNOWN)


#: The outbox's words; a status scripted outside them is recorded as ``unknown:<length>``.
VOCABULARY = StatusVocabulary("outbox", frozenset(OUTBOX_STATUSES), normalize)


class OutboxTransport:
    """A local mail catcher and SMS sink in the notices database."""

    name = "outbox"
    recovers_by_key = True
    #: a round's status reads are one query (``statuses``)
    reads_in_batches = True
    #: a local insert: no network wait a lease must cover (unless a latency is simulated)
    call_timeout = 0.0

    def __init__(
        self,
        store: Store,
        initial_status: str,
        clock: Callable[[], float],
        latency: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._initial_status = initial_status
        self._clock = clock
        #: ``[outbox] latency``: a simulated provider's time per call (benchmarks, demos)
        self._latency = latency
        self._sleep = sleep
        self.call_timeout = latency
        #: the thread that owns the store's connection; the sweep's calling threads (a
        #: simulated latency puts the outbox in its pool) read through their own
        self._owner = threading.get_ident()

    def _wait(self) -> None:
        if self._latency > 0:
            self._sleep(self._latency)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Store the rendered message once per attempt key."""
        self._wait()
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
        content.update(sender_fields(message))
        message_id, raw = self._store.outbox_submit(
            attempt_key,
            message.notice_id,
            message.channel,
            content,
            self._initial_status,
            self._clock(),
        )
        return VOCABULARY.reply(message_id, raw)

    def close(self) -> None:
        """Nothing to release: the store belongs to the caller."""

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Store]:
        """The store to read through: its own connection on the owning thread, else a
        connection of this call's own (one connection is never shared by threads)."""
        if threading.get_ident() == self._owner:
            yield self._store
            return
        with open_store(self._store.path, must_exist=True) as reader:
            yield reader

    def status(self, message_id: str) -> ProviderStatus:
        """The message's current scripted status."""
        self._wait()
        with self._reader() as store:
            raw = store.outbox_status(message_id)
        if raw is None:
            raise PermanentError("outbox has no such message")
        return VOCABULARY.reply(message_id, raw)

    def statuses(self, message_ids: Sequence[str]) -> Mapping[str, ProviderStatus]:
        """Several messages' current statuses in one read (one call's latency)."""
        self._wait()
        with self._reader() as store:
            found = store.outbox_statuses(message_ids)
        return {mid: VOCABULARY.reply(mid, raw) for mid, raw in found.items()}


def sender_fields(message: Message) -> dict[str, str]:
    """The sender a stored message records: its policy's, for its channel (none set:
    nothing recorded)."""
    sender = message.sender
    if message.channel != "email":
        return {} if sender.sms_from is None else {"from": sender.sms_from}
    fields = {}
    if sender.email_from is not None:
        fields["from"] = mailbox(sender.email_from, sender.email_from_name)
    if sender.email_reply_to is not None:
        fields["reply_to"] = sender.email_reply_to
    return fields


def _create(context: TransportContext) -> Transport:
    # [outbox] email_status / sms_status (validated with the rest of the config) set the
    # status a new message starts with.
    context.reject_unknown({"email_status", "sms_status", "keep_content", "latency"})
    context.store.keep_outbox_content(context.option("keep_content", False, bool))
    default = "accepted" if context.channel == "email" else "delivered"
    initial = context.option(f"{context.channel}_status", default, str)
    given = context.option("latency", None, (str, int, float, type(None)))
    latency = 0.0 if given is None else parse_duration(given, "outbox.latency")
    return OutboxTransport(context.store, initial, context.clock, latency)


PLUGIN = TransportPlugin(
    name="outbox",
    channels=frozenset({"email", "sms"}),
    create=_create,
    vocabulary=VOCABULARY,
)
