"""Test doubles that record calls. The outbox is a real transport; these are not."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resetctl.transports import Message, ProviderStatus, Transport, TransportError
from resetctl.transports.base import call_timeout


@dataclass
class ScriptedTransport:
    """Wraps a real transport; `submit_errors` are raised (in order) before delegating."""

    inner: Transport
    submit_errors: list[TransportError] = field(default_factory=list)
    status_errors: list[TransportError] = field(default_factory=list)
    recovers_by_key: bool = True
    submits: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    on_submit: Callable[[Message, str], None] | None = None

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def call_timeout(self) -> float:
        """The wrapped transport's (the outbox's is 0: its calls run in place)."""
        return call_timeout(self.inner)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        self.submits.append(attempt_key)
        if self.on_submit is not None:
            self.on_submit(message, attempt_key)
        if self.submit_errors:
            raise self.submit_errors.pop(0)
        return self.inner.submit(message, attempt_key)

    def status(self, message_id: str) -> ProviderStatus:
        self.reads.append(message_id)
        if self.status_errors:
            raise self.status_errors.pop(0)
        return self.inner.status(message_id)

    def close(self) -> None:
        self.inner.close()


def calls_per_key(*transports: ScriptedTransport) -> Counter[str]:
    """Submit calls per attempt key, added up over the given transports."""
    return Counter(key for transport in transports for key in transport.submits)


def look_up(transport: Any, message: Message, attempt_key: str, since: float) -> Any:
    """``transport.lookup`` for ``message`` as the sweep calls it: to its recipient,
    with the fingerprint recorded when it was sent."""
    return transport.lookup(message.recipient, attempt_key, since, transport.fingerprint(message))
